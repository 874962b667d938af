"""The SQLite ledger: one file on one machine, shared safely by several processes."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard, TypeVar

from redrive.errors import LedgerError
from redrive.ledger.base import (
    KEY_PAGE,
    Claim,
    ClaimResult,
    Entry,
    KeyState,
    Ledger,
    RunInfo,
    check_key,
    check_outcome,
    check_page_size,
    ledger_closed,
    run_not_open,
)
from redrive.ledger.group_commit import GroupWriter, WriteRequest
from redrive.state_dir import make_dirs

SCHEMA_VERSION = 3

# Long enough to ride out another operator's batch and a WAL checkpoint, short enough that a
# truly stuck holder surfaces as an error instead of a silent hang.
BUSY_TIMEOUT_S = 30.0

# Waiting for another process's write lock: SQLite's own busy handler sleeps 1, 2, 5, 10 ...
# ms between tries, so a waiter wakes up to several ms after a commit that took a fraction
# of one. The grouped path tries again itself at these short steps (seconds) instead.
_BEGIN_RETRY_STEPS = (0.0001, 0.0002, 0.0005, 0.001)

_T = TypeVar("_T")

# SQLite's bound-parameter limit is 32766 in current builds but 999 in old ones.
_IN_CHUNK = 500


# --------------------------------------------------------------------------- SQLite backend

# Keys are random (hashes, task ids): in a table ordered by key each batch's rows land on
# ~10 different pages, and its SENT and DONE updates rewrite all of them. Rows ordered by
# rowid sit together in claim order, so those updates touch a page or two; only the key
# index takes random inserts (schema 1 was keyed by key: ~30 % more ledger CPU per batch).
_KEYS_TABLE = """
CREATE TABLE keys (
    id              INTEGER PRIMARY KEY,
    key             TEXT NOT NULL UNIQUE,
    state           TEXT NOT NULL CHECK (state IN ('claimed', 'sent', 'done', 'skipped')),
    run_id          TEXT NOT NULL,
    task            TEXT NOT NULL,
    message_id      TEXT NOT NULL,
    target          TEXT NOT NULL,
    sent_message_id TEXT,
    updated_at      REAL NOT NULL,
    sent_at         REAL
)"""
_SCHEMA = f"""{_KEYS_TABLE};
CREATE INDEX keys_by_run ON keys (run_id);
CREATE TABLE runs (
    run_id       TEXT PRIMARY KEY,
    command      TEXT NOT NULL,
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    lease_until  REAL NOT NULL,
    ended_at     REAL,
    outcome      TEXT,
    info         TEXT NOT NULL,
    counts       TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX runs_by_start ON runs (started_at);
CREATE TABLE meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
"""
# A ledger upgraded from schema 2 or older with keys in it: those keys have the legacy form.
_LEGACY_KEYS = "legacy_keys"

_KEY_COLUMNS = "key, state, run_id, task, message_id, target, sent_message_id, updated_at, sent_at"
_SCHEMA_2_KEY_COLUMNS = "key, state, run_id, task, message_id, target, sent_message_id, updated_at"
_RUN_COLUMNS = (
    "run_id, command, started_at, heartbeat_at, lease_until, ended_at, outcome, info, counts"
)

# A run that promised (through its lease) to be alive still may be between a claim and a
# send, so the ledger itself refuses to hand its keys to anyone else until the lease ends,
# whatever the caller concluded from a heartbeat age.
_OWNER_NOT_LEASED = """
NOT EXISTS (
    SELECT 1 FROM runs
    WHERE runs.run_id = keys.run_id AND runs.ended_at IS NULL AND runs.lease_until > :now
)
"""


def _entry(row: tuple[Any, ...]) -> Entry:
    key, state, run_id, task, message_id, target, sent_message_id, updated_at, sent_at = row
    return Entry(
        key=key,
        state=KeyState(state),
        run_id=run_id,
        task=task,
        message_id=message_id,
        target=target,
        sent_message_id=sent_message_id,
        updated_at=updated_at,
        sent_at=sent_at,
    )


def _run_info(row: tuple[Any, ...]) -> RunInfo:
    run_id, command, started_at, heartbeat_at, lease_until, ended_at, outcome, info, counts = row
    return RunInfo(
        run_id=run_id,
        command=command,
        started_at=started_at,
        heartbeat_at=heartbeat_at,
        lease_until=lease_until,
        ended_at=ended_at,
        outcome=outcome,
        info=json.loads(info),
        counts=json.loads(counts),
    )


def _select_keys(conn: sqlite3.Connection, keys: Sequence[str]) -> dict[str, Entry]:
    """Entries for those of ``keys`` present, in the order of ``keys``."""
    unique = list(dict.fromkeys(keys))
    found: dict[str, Entry] = {}
    for i in range(0, len(unique), _IN_CHUNK):
        chunk = unique[i : i + _IN_CHUNK]
        marks = ",".join("?" * len(chunk))
        for row in conn.execute(f"SELECT {_KEY_COLUMNS} FROM keys WHERE key IN ({marks})", chunk):
            entry = _entry(row)
            found[entry.key] = entry
    return {k: found[k] for k in unique if k in found}


def _is_sqlite(e: BaseException) -> TypeGuard[sqlite3.Error]:
    return isinstance(e, sqlite3.Error)


def _is_busy(e: sqlite3.OperationalError) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(e) or "busy" in str(e)


class SqliteLedger(Ledger):
    """The ledger in one SQLite file, shared safely by several processes on one machine.

    - WAL journal, so readers never block the one writer; ``busy_timeout`` of 30 s, so
      writers queue instead of failing with "database is locked".
    - Every write method is one ``BEGIN IMMEDIATE`` transaction whose statements are each
      conditional on the row's current state and owner; the write lock is taken up front, so
      a transaction never has to upgrade from reader to writer (which could fail at once
      without waiting).
    - ``synchronous=FULL``: a claim is on disk (WAL fsynced) before claim_many returns,
      because a send follows it and must never be forgotten by a power cut.

    Thread safety: an object may be shared between threads. Its writes are group-committed
    (:mod:`redrive.ledger.group_commit`): the requests of callers that arrive while a
    transaction is in flight are run, in arrival order, in the next one transaction, and
    each caller returns once that transaction is committed (flushed to disk
    with ``synchronous=FULL`` if any request of the group needs it: a claim, a release, a
    takeover, a skip, a run's start or end). The writer waits for another process's write
    lock by trying again at sub-millisecond steps, not in SQLite's busy handler (whose
    sleeps grow to tens of ms). ``group_commit=False`` gives the plain path instead: one
    transaction per call, callers serialised by a lock. Reads have a connection of their own.
    """

    def __init__(
        self,
        path: Path,
        *,
        clock: Callable[[], float] = time.time,
        busy_timeout: float = BUSY_TIMEOUT_S,
        group_commit: bool = True,
    ) -> None:
        self.path = Path(path).absolute()
        self.location = f"sqlite://{self.path}"
        self._clock = clock
        self._busy_timeout = busy_timeout
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        # Reads get a connection of their own: in WAL mode they then never wait for a write
        # (a claim's commit waits for the disk), so a worker's receiving stage can read the
        # ledger while its sending stage commits.
        self._read_lock = threading.Lock()
        self._read_conn: sqlite3.Connection | None = None
        self._writer: GroupWriter | None = None
        self._create_file()
        conn = self._connect()
        try:
            self._prepare(conn)
            self.legacy_keys = self._read_legacy_flag(conn)
            if group_commit:
                # Only the writer uses this connection from here on, always first through a
                # BEGIN IMMEDIATE that it retries itself (_begin_write), for as long: SQLite's
                # busy handler would sleep in steps of up to 100 ms instead. Once the write
                # lock is held (WAL), no statement of the transaction waits for another.
                conn.execute("PRAGMA busy_timeout = 0")
        except sqlite3.Error as e:
            conn.close()
            raise self._open_error(e) from None
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        if group_commit:
            self._writer = GroupWriter(self._commit_group, location=self.location)

    # ----------------------------------------------------------------- opening

    def _create_file(self) -> None:
        try:
            make_dirs(self.path.parent)
            # Created here, not by sqlite, so the mode is 0600 from the first byte; SQLite
            # gives its -wal and -shm files the same mode as the database file.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            os.close(fd)
        except IsADirectoryError:
            raise LedgerError(
                f"ledger path {self.path} is a directory; give a file path inside it"
            ) from None
        except OSError as e:
            reason = e.strerror or str(e)
            raise LedgerError(
                f"cannot create or open ledger {self.path} ({reason}); "
                "make it and its directory writable by you, or choose another ledger path"
            ) from None
        if not stat.S_ISREG(os.stat(self.path).st_mode):
            raise LedgerError(f"ledger path {self.path} is not a regular file; choose a file path")

    def _connect(self) -> sqlite3.Connection:
        try:
            # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so the sqlite3 module
            # never opens a deferred transaction behind our back.
            return sqlite3.connect(
                self.path,
                timeout=self._busy_timeout,
                isolation_level=None,
                check_same_thread=False,  # the lock below serialises use instead
            )
        except sqlite3.Error as e:
            raise self._open_error(e) from None

    def _open_error(self, e: sqlite3.Error) -> LedgerError:
        msg = str(e)
        if isinstance(e, sqlite3.DatabaseError) and "not a database" in msg:
            return LedgerError(
                f"{self.path} is not a SQLite database, so not a redrive ledger; "
                "move it aside or choose another ledger path"
            )
        if "readonly" in msg or "unable to open" in msg:
            return LedgerError(
                f"cannot write ledger {self.path} ({msg}); make the file and its directory "
                "writable by you, or choose another ledger path"
            )
        if "locked" in msg or "busy" in msg:
            return LedgerError(
                f"ledger {self.path} stayed locked for {self._busy_timeout:.0f} s while opening; "
                "check for a stuck redrive process, then retry"
            )
        return LedgerError(
            f"cannot open ledger {self.path} ({msg}); move it aside or choose another ledger path"
        )

    def _prepare(self, conn: sqlite3.Connection) -> None:
        try:
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if mode != "wal":
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode != "wal":
                raise LedgerError(
                    f"ledger {self.path} cannot use SQLite's WAL journal (got {mode!r}); "
                    "put it on a local filesystem"
                )
            conn.execute("PRAGMA synchronous=FULL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA_VERSION:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    self._migrate(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
        except sqlite3.Error as e:
            raise self._open_error(e) from None

    def _read_legacy_flag(self, conn: sqlite3.Connection) -> bool:
        try:
            row = conn.execute("SELECT value FROM meta WHERE name = ?", (_LEGACY_KEYS,)).fetchone()
        except sqlite3.Error as e:
            raise self._open_error(e) from None
        return row is not None

    def _migrate(self, conn: sqlite3.Connection) -> None:
        # Re-read under the write lock: another process may have created the schema meanwhile.
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise LedgerError(
                f"ledger {self.path} was written by a newer redrive (schema {version}, this "
                f"one knows {SCHEMA_VERSION}); upgrade redrive or use another ledger path"
            )
        if version == 1:
            # Schema 1 differs from 2 only in how keys are stored; copy them over, oldest first.
            conn.execute("DROP INDEX keys_by_run")
            conn.execute("ALTER TABLE keys RENAME TO keys_schema_1")
            conn.execute(_KEYS_TABLE)
            conn.execute(
                f"INSERT INTO keys ({_SCHEMA_2_KEY_COLUMNS}) SELECT {_SCHEMA_2_KEY_COLUMNS}"
                " FROM keys_schema_1 ORDER BY updated_at, key"
            )
            conn.execute("DROP TABLE keys_schema_1")
            conn.execute("CREATE INDEX keys_by_run ON keys (run_id)")
            self._to_schema_3(conn, has_sent_at=True)
            return
        if version == 2:
            self._to_schema_3(conn, has_sent_at=False)
            return
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master")]
        if tables:
            raise LedgerError(
                f"{self.path} is a SQLite database but not a redrive ledger; "
                "move it aside or choose another ledger path"
            )
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _to_schema_3(self, conn: sqlite3.Connection, *, has_sent_at: bool) -> None:
        """Schema 3 adds when each key was sent, and remembers that the keys already there
        have the legacy form (they did not name the publish), so the engine looks them up."""
        if not has_sent_at:
            conn.execute("ALTER TABLE keys ADD COLUMN sent_at REAL")
        conn.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID")
        if conn.execute("SELECT 1 FROM keys LIMIT 1").fetchone() is not None:
            conn.execute("INSERT INTO meta (name, value) VALUES (?, '1')", (_LEGACY_KEYS,))
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    # ----------------------------------------------------------------- plumbing

    def _submit(self, what: str, apply: Callable[[sqlite3.Connection], _T], *, flush: bool) -> _T:
        """Run ``apply`` in a write transaction (its group's, or one of its own on the plain
        path) and return its answer once committed. Arguments are checked before this, in
        the caller's thread; ``apply`` only runs statements."""
        if self._writer is None:
            with self._write(what, flush=flush) as conn:
                return apply(conn)
        return self._writer.submit(WriteRequest(what, apply, flush=flush))

    def _commit_group(self, group: list[WriteRequest[Any]]) -> None:
        """The writer's work: ``group`` in one transaction, in arrival order; settle every
        request. A request whose own statements fail is answered with its error and the
        others run again without it (rolled back first, so nothing of it stays); a failure
        of the transaction itself (the lock, the commit, SQLite rolling back) fails them all,
        each with the error its call would have met alone, and commits none."""
        pending = list(group)
        while pending:
            conn = self._conn
            if conn is None:
                for request in pending:
                    request.fail(ledger_closed(self.location))
                return
            outcome = self._try_group(conn, pending)
            if isinstance(outcome, WriteRequest):
                pending.remove(outcome)
                continue
            if outcome is not None:
                for request, result in zip(pending, outcome, strict=True):
                    request.finish(result)
            return

    def _try_group(
        self, conn: sqlite3.Connection, pending: list[WriteRequest[Any]]
    ) -> list[Any] | WriteRequest[Any] | None:
        """One attempt at ``pending``: their answers once committed; or the request whose
        own statements failed (answered; nothing committed, the others to run again); or
        None: the transaction failed, every request is answered with its error."""
        flush = any(r.flush for r in pending)
        try:
            if not flush:
                conn.execute("PRAGMA synchronous=NORMAL")
            try:
                self._begin_write(conn)
                outcome = self._apply_in_order(conn, pending)
                if isinstance(outcome, list):
                    conn.execute("COMMIT")
            finally:
                if not flush:
                    conn.execute("PRAGMA synchronous=FULL")
        except BaseException as e:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            for request in pending:
                request.fail(self._request_error(request.what, e))
            if not isinstance(e, Exception):
                raise
            return None
        return outcome

    def _apply_in_order(
        self, conn: sqlite3.Connection, pending: list[WriteRequest[Any]]
    ) -> list[Any] | WriteRequest[Any]:
        """Inside the group's open transaction: each request's statements in turn, and
        their answers; or the first request whose own statements failed (answered with its
        error, the transaction rolled back). Raises when SQLite rolled the whole
        transaction back itself: that is the group's failure, not one request's."""
        results: list[Any] = []
        for request in pending:
            try:
                results.append(request.apply(conn))
            except Exception as e:
                if not conn.in_transaction:
                    raise
                conn.execute("ROLLBACK")
                request.fail(self._request_error(request.what, e))
                return request
        return results

    def _request_error(self, what: str, e: BaseException) -> BaseException:
        """What a caller is answered with: SQLite's errors said as a LedgerError."""
        return self._op_error(what, e) if _is_sqlite(e) else e

    def _begin_write(self, conn: sqlite3.Connection) -> None:
        """BEGIN IMMEDIATE, trying again at short steps while another process holds the
        write lock, for up to the busy timeout (then SQLite's "database is locked")."""
        deadline: float | None = None
        attempt = 0
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as e:
                if not _is_busy(e):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._busy_timeout
                elif now >= deadline:
                    raise
            time.sleep(_BEGIN_RETRY_STEPS[min(attempt, len(_BEGIN_RETRY_STEPS) - 1)])
            attempt += 1

    @contextlib.contextmanager
    def _write(self, what: str, *, flush: bool = True) -> Iterator[sqlite3.Connection]:
        """The plain path's write: one IMMEDIATE transaction under the object's lock,
        committed on success, rolled back on error.

        ``flush=False`` commits without waiting for the disk: for records whose loss is
        harmless (a lost SENT reads as CLAIMED, i.e. in doubt: held, never resent; a lost
        DONE has nothing left to do; a heartbeat is refreshed). The next flushed commit (the
        next claim) makes them durable too, since the WAL is written in order.
        """
        with self._lock:
            conn = self._live_conn()
            try:
                with self._guarded(conn, what):
                    if not flush:
                        conn.execute("PRAGMA synchronous=NORMAL")
                    conn.execute("BEGIN IMMEDIATE")
                    yield conn
                    conn.execute("COMMIT")
            finally:
                if not flush:
                    conn.execute("PRAGMA synchronous=FULL")

    @contextlib.contextmanager
    def _read(self, what: str) -> Iterator[sqlite3.Connection]:
        """One read transaction, so multi-statement reads see a single snapshot."""
        with self._read_lock:
            self._live_conn()  # a closed ledger refuses reads too
            if self._read_conn is None:
                self._read_conn = self._connect()
            conn = self._read_conn
            with self._guarded(conn, what):
                conn.execute("BEGIN")
                yield conn
                conn.execute("COMMIT")

    @contextlib.contextmanager
    def _guarded(self, conn: sqlite3.Connection, what: str) -> Iterator[None]:
        """Roll back whatever is open on failure, and say what failed as a LedgerError."""
        try:
            yield
        except BaseException as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(e, sqlite3.Error):
                raise self._op_error(what, e) from e
            raise

    def _live_conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ledger_closed(self.location)
        return self._conn

    def _op_error(self, what: str, e: sqlite3.Error) -> LedgerError:
        msg = str(e)
        if "locked" in msg or "busy" in msg:
            return LedgerError(
                f"ledger {self.location} stayed locked by another process for "
                f"{self._busy_timeout:g} s ({what}); check for a stuck redrive, then retry"
            )
        return LedgerError(
            f"ledger {self.location}: {what} failed ({msg}); check free space and "
            "permissions of the ledger file, then retry"
        )

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()  # the group in flight ends first; queued ones are refused
        with self._lock, self._read_lock:
            for conn in (self._conn, self._read_conn):
                if conn is not None:
                    conn.close()
            self._conn = self._read_conn = None

    def __repr__(self) -> str:
        return f"SqliteLedger({self.location!r})"

    def group_stats(self) -> dict[str, int] | None:
        """Transactions and requests the writer committed (None on the plain path)."""
        if self._writer is None:
            return None
        return {"groups": self._writer.groups, "requests": self._writer.requests}

    # ----------------------------------------------------------------- runs

    def start_run(self, run_id: str, *, command: str, info: Mapping[str, Any]) -> None:
        now = self._clock()
        # default=str: info is descriptive (options, user, host); a Path or datetime in it
        # should be recorded, not crash the run.
        info_json = json.dumps(dict(info), sort_keys=True, default=str)

        def apply(conn: sqlite3.Connection) -> None:
            cur = conn.execute(
                "INSERT INTO runs (run_id, command, started_at, heartbeat_at, lease_until,"
                " info, counts) VALUES (?, ?, ?, ?, ?, ?, '{}')"
                " ON CONFLICT (run_id) DO NOTHING",
                (run_id, command, now, now, now, info_json),
            )
            if cur.rowcount != 1:
                raise LedgerError(
                    f"run {run_id} already exists in ledger {self.location}; "
                    "start the run again with a new run id"
                )

        self._submit("start run", apply, flush=True)

    def heartbeat(self, run_id: str, *, lease_until: float) -> None:
        now = self._clock()

        def apply(conn: sqlite3.Connection) -> None:
            cur = conn.execute(
                "UPDATE runs SET heartbeat_at = ?, lease_until = ?"
                " WHERE run_id = ? AND ended_at IS NULL",
                (now, lease_until, run_id),
            )
            if cur.rowcount != 1:
                raise run_not_open(run_id, self.location)

        self._submit("heartbeat", apply, flush=False)

    def end_run(
        self,
        run_id: str,
        *,
        outcome: str,
        counts: Mapping[str, int],
        info: Mapping[str, Any] | None = None,
    ) -> None:
        check_outcome(outcome)
        counts_json = json.dumps(dict(counts), sort_keys=True)
        info = dict(info) if info else None
        now = self._clock()

        def apply(conn: sqlite3.Connection) -> None:
            row = (
                conn.execute(
                    "SELECT info FROM runs WHERE run_id = ? AND ended_at IS NULL", (run_id,)
                ).fetchone()
                if info
                else None
            )
            info_json = (
                json.dumps({**json.loads(row[0]), **info}, sort_keys=True, default=str)
                if row is not None and info
                else None
            )
            cur = conn.execute(
                "UPDATE runs SET ended_at = ?, outcome = ?, counts = ?, info = coalesce(?, info)"
                " WHERE run_id = ? AND ended_at IS NULL",
                (now, outcome, counts_json, info_json, run_id),
            )
            if cur.rowcount == 0:
                exists = conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone()
                if exists is None:
                    raise LedgerError(
                        f"run {run_id} is not in ledger {self.location}; "
                        "it was never started there (check the ledger path)"
                    )

        self._submit("end run", apply, flush=True)

    def run(self, run_id: str) -> RunInfo | None:
        with self._read("read run") as conn:
            row = conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
        return None if row is None else _run_info(row)

    def runs(self, since: float | None = None) -> list[RunInfo]:
        """Runs started at or after ``since`` (all when None), oldest first."""
        with self._read("list runs") as conn:
            rows = conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE started_at >= ?"
                " ORDER BY started_at, run_id",
                (float("-inf") if since is None else since,),
            ).fetchall()
        return [_run_info(r) for r in rows]

    def live_runs(self, *, stale_after: float) -> list[RunInfo]:
        """Runs not ended that heartbeated within ``stale_after`` seconds or whose lease has
        not run out (see :meth:`RunInfo.is_live`), oldest first."""
        now = self._clock()
        with self._read("list live runs") as conn:
            rows = conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE ended_at IS NULL"
                " AND (heartbeat_at > ? OR lease_until > ?) ORDER BY started_at, run_id",
                (now - stale_after, now),
            ).fetchall()
        return [_run_info(r) for r in rows]

    def is_live(self, run_id: str, *, stale_after: float) -> bool:
        """False for a run that ended, went stale, or is unknown to this ledger."""
        info = self.run(run_id)
        return info is not None and info.is_live(now=self._clock(), stale_after=stale_after)

    # ----------------------------------------------------------------- keys

    def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        """Entries for those of ``keys`` the ledger has; absent keys are left out."""
        with self._read("read keys") as conn:
            return _select_keys(conn, keys)

    def keys_for_run(self, run_id: str) -> list[Entry]:
        """Entries whose owner is ``run_id``, in the order they were last changed."""
        with self._read("read keys of run") as conn:
            rows = conn.execute(
                f"SELECT {_KEY_COLUMNS} FROM keys WHERE run_id = ? ORDER BY updated_at, key",
                (run_id,),
            ).fetchall()
        return [_entry(r) for r in rows]

    def iter_keys(
        self, state: KeyState, *, run_id: str | None = None, page_size: int = KEY_PAGE
    ) -> Iterator[Entry]:
        """Keys in ``state`` (of ``run_id`` only, when given), in the order of their claims,
        ``page_size`` rows per read."""
        check_page_size(page_size)
        return self._key_pages(KeyState(state), run_id, page_size)

    def _key_pages(self, state: KeyState, run_id: str | None, size: int) -> Iterator[Entry]:
        # Keyset pages on the rowid (claim order; with a run, along its index), each page
        # its own read transaction: a reader slow to consume holds no snapshot open, and
        # nothing waits on it.
        where = "state = ? AND id > ?" + (" AND run_id = ?" if run_id is not None else "")
        after = 0
        while True:
            params: tuple[Any, ...] = (str(state), after) + (() if run_id is None else (run_id,))
            with self._read("list keys") as conn:
                rows = conn.execute(
                    f"SELECT id, {_KEY_COLUMNS} FROM keys WHERE {where} ORDER BY id LIMIT ?",
                    (*params, size),
                ).fetchall()
            for row in rows:
                yield _entry(row[1:])
            if len(rows) < size:
                return
            after = rows[-1][0]

    def claim_many(self, run_id: str, claims: Sequence[Claim]) -> ClaimResult:
        """Claim each absent key for ``run_id``; see :class:`ClaimResult` for the answer.

        If a key appears twice in ``claims`` (two copies of one task in a batch) the first
        claim wins and the second reports the key as already this run's.
        """
        for claim in claims:
            check_key(claim.key)
        now = self._clock()
        claims = list(claims)

        def apply(conn: sqlite3.Connection) -> ClaimResult:
            won: set[str] = set()
            for claim in claims:
                cur = conn.execute(
                    f"INSERT INTO keys ({_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, NULL, ?, NULL)"
                    " ON CONFLICT (key) DO NOTHING",
                    (
                        claim.key,
                        KeyState.CLAIMED.value,
                        run_id,
                        claim.task,
                        claim.message_id,
                        claim.target,
                        now,
                    ),
                )
                if cur.rowcount == 1:
                    won.add(claim.key)
            entries = _select_keys(conn, [c.key for c in claims])
            return ClaimResult(entries=entries, won=frozenset(won))

        return self._submit("claim keys", apply, flush=True)

    def takeover_many(self, run_id: str, keys_and_old_runs: Sequence[tuple[str, str]]) -> set[str]:
        """For an in-doubt resend: move each key still CLAIMED by its named (dead) old run to
        ``run_id``. Returns the keys taken. A key whose owner changed, moved on from CLAIMED,
        or whose owner's lease has not run out yet is not taken."""
        now = self._clock()
        pairs = list(keys_and_old_runs)

        def apply(conn: sqlite3.Connection) -> set[str]:
            taken: set[str] = set()
            for key, old_run in pairs:
                if old_run == run_id:
                    continue
                cur = conn.execute(
                    "UPDATE keys SET run_id = :run, updated_at = :now"
                    " WHERE key = :key AND state = 'claimed' AND run_id = :old"
                    f" AND {_OWNER_NOT_LEASED}",
                    {"run": run_id, "now": now, "key": key, "old": old_run},
                )
                if cur.rowcount == 1:
                    taken.add(key)
            return taken

        return self._submit("take over keys", apply, flush=True)

    def mark_sent_many(self, run_id: str, sent: Mapping[str, str]) -> None:
        """CLAIMED by ``run_id`` -> SENT, recording the MessageId SQS gave the copy."""
        now = self._clock()
        rows = [(sent_id, now, now, key, run_id) for key, sent_id in sent.items()]
        self._execute_many(
            "mark keys sent",
            "UPDATE keys SET state = 'sent', sent_message_id = ?, updated_at = ?, sent_at = ?"
            " WHERE key = ? AND state = 'claimed' AND run_id = ?",
            rows,
            flush=False,
        )

    def release_many(self, run_id: str, keys: Sequence[str]) -> None:
        """The send failed: forget keys still CLAIMED by ``run_id``, so they can be claimed
        again."""
        self._execute_many(
            "release keys",
            "DELETE FROM keys WHERE key = ? AND state = 'claimed' AND run_id = ?",
            [(key, run_id) for key in keys],
            flush=True,
        )

    def mark_done_many(self, run_id: str, keys: Sequence[str]) -> None:
        """SENT -> DONE once the DLQ copy is deleted. Any run may do it (a later run deletes
        what an earlier one sent but could not delete); the owner stays the run that sent,
        because that is who the audit must name."""
        now = self._clock()
        self._execute_many(
            "mark keys done",
            "UPDATE keys SET state = 'done', updated_at = ? WHERE key = ? AND state = 'sent'",
            [(now, key) for key in keys],
            flush=False,
        )

    def mark_skipped_many(self, run_id: str, keys: Sequence[str]) -> None:
        """In-doubt resolved as skip: CLAIMED by another run, whose lease has run out ->
        SKIPPED, owned by ``run_id`` (the run that decided)."""
        now = self._clock()
        self._execute_many(
            "mark keys skipped",
            "UPDATE keys SET state = 'skipped', run_id = :run, updated_at = :now"
            " WHERE key = :key AND state = 'claimed' AND run_id != :run"
            f" AND {_OWNER_NOT_LEASED}",
            [{"run": run_id, "now": now, "key": key} for key in keys],
            flush=True,
        )

    def _execute_many(
        self, what: str, sql: str, rows: Sequence[Sequence[Any] | Mapping[str, Any]], *, flush: bool
    ) -> None:
        def apply(conn: sqlite3.Connection) -> None:
            # No cursor may leave the writer's thread: one finalised by its garbage
            # collection in a caller's thread would touch the connection the writer uses.
            conn.executemany(sql, rows).close()

        self._submit(what, apply, flush=flush)
