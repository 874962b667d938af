"""The SQLite ledger: one file on one machine, shared safely by several processes."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

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
    claimed_entry,
    keyset_pages,
    run_not_open,
)
from redrive.ledger.group_commit import GroupWriter
from redrive.ledger.sqlite_file import BUSY_TIMEOUT_S, LedgerFile
from redrive.ledger.sqlite_schema import LEGACY_KEYS, SCHEMA_VERSION
from redrive.ledger.sqlite_writes import SqliteWrites

__all__ = ["BUSY_TIMEOUT_S", "SCHEMA_VERSION", "SqliteLedger"]

# SQLite's bound-parameter limit is 32766 in current builds but 999 in old ones.
_IN_CHUNK = 500

_KEY_COLUMNS = "key, state, run_id, task, message_id, target, sent_message_id, updated_at, sent_at"
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


def _entry(row: Sequence[Any]) -> Entry:
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
        self._file = LedgerFile(self.path, busy_timeout=busy_timeout)
        # Reads get a connection of their own: in WAL mode they then never wait for a write
        # (a claim's commit waits for the disk), so a worker's receiving stage can read the
        # ledger while its sending stage commits.
        self._read_lock = threading.Lock()
        self._read_conn: sqlite3.Connection | None = None
        conn, self.legacy_keys = self._file.open(writer_waits_itself=group_commit)
        self._writes = SqliteWrites(self._file, conn, group_commit=group_commit)

    @property
    def _conn(self) -> sqlite3.Connection | None:
        """The write connection (None once closed)."""
        return self._writes.conn

    @property
    def _writer(self) -> GroupWriter | None:
        """The group-commit writer (None on the plain path)."""
        return self._writes.group

    @contextlib.contextmanager
    def _read(self, what: str) -> Iterator[sqlite3.Connection]:
        """One read transaction, so multi-statement reads see a single snapshot."""
        with self._read_lock:
            self._writes.live_conn()  # a closed ledger refuses reads too
            if self._read_conn is None:
                self._read_conn = self._file.connect()
            conn = self._read_conn
            with self._file.guarded(conn, what):
                conn.execute("BEGIN")
                yield conn
                conn.execute("COMMIT")

    def close(self) -> None:
        self._writes.close()
        with self._read_lock:
            if self._read_conn is not None:
                self._read_conn.close()
            self._read_conn = None

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

        self._writes.submit("start run", apply, flush=True)

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

        self._writes.submit("heartbeat", apply, flush=False)

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

        self._writes.submit("end run", apply, flush=True)

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
        query = f"SELECT id, {_KEY_COLUMNS} FROM keys WHERE {where} ORDER BY id LIMIT ?"

        def page(after: int) -> list[Any]:
            params = (str(state), after, *(() if run_id is None else (run_id,)), size)
            with self._read("list keys") as conn:
                return conn.execute(query, params).fetchall()

        return keyset_pages(page, size, _entry)

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
            # Under BEGIN IMMEDIATE: no other writer between the look and the inserts, so
            # the absent keys (each one's first claim) are exactly what the inserts win.
            keys = [c.key for c in claims]
            present = _select_keys(conn, keys)
            fresh: dict[str, Claim] = {}
            for claim in claims:
                if claim.key not in present and claim.key not in fresh:
                    fresh[claim.key] = claim
            conn.executemany(
                f"INSERT INTO keys ({_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, NULL, ?, NULL)",
                [
                    (c.key, KeyState.CLAIMED.value, run_id, c.task, c.message_id, c.target, now)
                    for c in fresh.values()
                ],
            ).close()  # no cursor may leave the writer's thread (see _execute_many)
            won = {key: claimed_entry(claim, run_id, now) for key, claim in fresh.items()}
            entries = {k: present.get(k) or won[k] for k in dict.fromkeys(keys)}
            return ClaimResult(entries=entries, won=frozenset(won))

        return self._writes.submit("claim keys", apply, flush=True)

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

        return self._writes.submit("take over keys", apply, flush=True)

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

    def mark_skipped_many(self, run_id: str, keys: Sequence[str]) -> set[str]:
        """In-doubt resolved as skip: CLAIMED by another run, whose lease has run out ->
        SKIPPED, owned by ``run_id`` (the run that decided). Returns the keys marked; a key
        whose owner's lease has not run out yet (or that is not another run's claim) is left
        as it is."""
        now = self._clock()
        unique = list(dict.fromkeys(keys))

        def apply(conn: sqlite3.Connection) -> set[str]:
            marked: set[str] = set()
            for key in unique:
                cur = conn.execute(
                    "UPDATE keys SET state = 'skipped', run_id = :run, updated_at = :now"
                    " WHERE key = :key AND state = 'claimed' AND run_id != :run"
                    f" AND {_OWNER_NOT_LEASED}",
                    {"run": run_id, "now": now, "key": key},
                )
                if cur.rowcount == 1:
                    marked.add(key)
                cur.close()
            return marked

        return self._writes.submit("mark keys skipped", apply, flush=True)

    # ----------------------------------------------------------------- copies

    def load_runs(self, runs: Sequence[RunInfo]) -> int:
        """Insert each run absent here, as it stands (a copy); the number inserted."""
        rows = [
            (
                r.run_id,
                r.command,
                r.started_at,
                r.heartbeat_at,
                r.lease_until,
                r.ended_at,
                r.outcome,
                json.dumps(r.info, sort_keys=True, default=str),
                json.dumps(r.counts, sort_keys=True),
            )
            for r in runs
        ]

        def apply(conn: sqlite3.Connection) -> int:
            before = conn.total_changes
            conn.executemany(
                f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (run_id) DO NOTHING",
                rows,
            ).close()
            return conn.total_changes - before

        return self._writes.submit("copy runs", apply, flush=True)

    def load_entries(self, entries: Sequence[Entry], *, legacy_keys: bool) -> int:
        """Insert each key absent here, as it stands (a copy); the number inserted."""
        rows = [
            (
                e.key,
                str(e.state),
                e.run_id,
                e.task,
                e.message_id,
                e.target,
                e.sent_message_id,
                e.updated_at,
                e.sent_at,
            )
            for e in entries
        ]

        def apply(conn: sqlite3.Connection) -> int:
            if legacy_keys:
                conn.execute(
                    "INSERT INTO meta (name, value) VALUES (?, '1') ON CONFLICT (name) DO NOTHING",
                    (LEGACY_KEYS,),
                ).close()
            before = conn.total_changes
            conn.executemany(
                f"INSERT INTO keys ({_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (key) DO NOTHING",
                rows,
            ).close()
            return conn.total_changes - before

        inserted = self._writes.submit("copy keys", apply, flush=True)
        self.legacy_keys = self.legacy_keys or legacy_keys
        return inserted

    def _execute_many(
        self, what: str, sql: str, rows: Sequence[Sequence[Any] | Mapping[str, Any]], *, flush: bool
    ) -> None:
        def apply(conn: sqlite3.Connection) -> None:
            # No cursor may leave the writer's thread: one finalised by its garbage
            # collection in a caller's thread would touch the connection the writer uses.
            conn.executemany(sql, rows).close()

        self._writes.submit(what, apply, flush=flush)
