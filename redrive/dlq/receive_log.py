"""How many times redrive itself received each DLQ message, so that the receive counts it
shows are what the queue's consumers did, not what redrive's own reads did.

A broker has no peek: every inspect, report, archive and dry run receives each message once
more, and each receive raises its receive count (SQS's ApproximateReceiveCount, a RabbitMQ
quorum queue's delivery count). A cron ``report`` every 10 minutes adds 144 a day. redrive
remembers its own receives here and subtracts them.

One SQLite file in the state directory (``receives.sqlite3`` beside the ledger), shared by
every redrive process on the machine: per message an 8-byte digest of its MessageId, how many
times redrive received it, and when it last did. Bounded: an entry not touched for
:data:`KEEP_DAYS` days goes (SQS keeps a message 14 days at most), and the file holds at most
:data:`MAX_ENTRIES` entries (about 40 MB), the least recently touched going first.

Cheap per message: one indexed read per received batch; the increments are buffered and
written in one transaction every couple of seconds. Advisory, never a reason to fail: if the
file cannot be used, counts include redrive's own earlier receives and :attr:`problem` says
why.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from redrive.state_dir import default_state_dir, make_dirs

FILE_NAME = "receives.sqlite3"
KEEP_DAYS = 15
MAX_ENTRIES = 1_000_000
FLUSH_SECONDS = 2.0
FLUSH_ENTRIES = 5_000
_DAY = 86_400
_SCHEMA = """
CREATE TABLE IF NOT EXISTS receives (
    digest  INTEGER PRIMARY KEY,
    count   INTEGER NOT NULL,
    touched INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS queues (
    queue       TEXT PRIMARY KEY,
    deliveries  INTEGER NOT NULL,
    own         INTEGER NOT NULL,
    touched     INTEGER NOT NULL
);
"""
_UPSERT = (
    "INSERT INTO receives (digest, count, touched) VALUES (?, ?, ?) ON CONFLICT(digest) "
    "DO UPDATE SET count = count + excluded.count, touched = excluded.touched"
)


_QUEUE_UPSERT = (
    "INSERT INTO queues (queue, deliveries, own, touched) VALUES (?, ?, ?, ?) "
    "ON CONFLICT(queue) DO UPDATE SET deliveries = max(deliveries, excluded.deliveries), "
    "own = max(own, excluded.own), touched = excluded.touched"
)


def message_digest(message_id: str) -> int:
    """A MessageId's 8-byte digest (the scan's, redrive.dlq.scan.digest), unsigned."""
    return int.from_bytes(hashlib.blake2b(message_id.encode(), digest_size=8).digest(), "big")


def sqlite_integer(digest: int) -> int:
    """An 8-byte digest (unsigned) as SQLite's INTEGER PRIMARY KEY holds it (signed)."""
    return digest - (1 << 64) if digest >= 1 << 63 else digest


def default_path() -> Path:
    return default_state_dir() / FILE_NAME


class ReceiveLog:
    """redrive's receives per message. Thread-safe; several processes may share the file."""

    def __init__(
        self,
        path: Path,
        *,
        clock: Callable[[], float] = time.time,
        max_entries: int = MAX_ENTRIES,
        busy_timeout: float = 2.0,
    ) -> None:
        self.path = Path(path)
        self.problem: str | None = None
        """Why the log is not used (then counts include redrive's earlier receives)."""
        self._clock = clock
        self._max_entries = max_entries
        self._busy_timeout = busy_timeout
        self._lock = threading.Lock()
        self._pending: Counter[int] = Counter()
        self._queue_pending: dict[str, tuple[int, int]] = {}
        self._flushed_at = time.monotonic()
        self._added = 0
        self._conn: sqlite3.Connection | None = None
        try:
            self._conn = self._open()
        except (sqlite3.Error, OSError) as exc:
            self._disable(exc)

    @classmethod
    def open_default(cls) -> ReceiveLog:
        """The log in the state directory (``$REDRIVE_STATE_DIR``, else XDG's)."""
        return cls(default_path())

    def __enter__(self) -> ReceiveLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- opening -------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        make_dirs(self.path.parent)
        # Created here, not by sqlite, so the mode is 0600 from the first byte.
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        conn = sqlite3.connect(
            self.path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            # Advisory counts: a power cut may lose the last second of them, never the file.
            conn.execute("PRAGMA synchronous=NORMAL")
            # Lookups of random digests: 8 MB of page cache holds ~250,000 entries' pages.
            conn.execute("PRAGMA cache_size=-8000")
            conn.executescript(_SCHEMA)
            self._prune_daily(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _prune_daily(self, conn: sqlite3.Connection) -> None:
        today = self._today()
        row = conn.execute("SELECT value FROM meta WHERE name = 'pruned_day'").fetchone()
        if row is not None and row[0] >= today:
            return
        self._prune(conn)

    def _prune(self, conn: sqlite3.Connection) -> None:
        """Drop entries older than SQS keeps messages, then the oldest beyond the cap."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            cutoff = int(self._clock()) - KEEP_DAYS * _DAY
            conn.execute("DELETE FROM receives WHERE touched < ?", (cutoff,))
            (entries,) = conn.execute("SELECT count(*) FROM receives").fetchone()
            excess = entries - self._max_entries
            if excess > 0:
                conn.execute(
                    "DELETE FROM receives WHERE digest IN "
                    "(SELECT digest FROM receives ORDER BY touched LIMIT ?)",
                    (excess,),
                )
            conn.execute(
                "INSERT INTO meta (name, value) VALUES ('pruned_day', ?) "
                "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                (self._today(),),
            )
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        self._added = 0

    def _today(self) -> int:
        return int(self._clock() // _DAY)

    def _disable(self, exc: BaseException) -> None:
        self.problem = f"cannot use {self.path} ({exc})"
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
        self._conn = None
        self._pending.clear()
        self._queue_pending.clear()

    # -- counting ------------------------------------------------------------------------

    def record(self, message_ids: Sequence[str]) -> list[int]:
        """Count one receive by redrive of each message; return, for each, how many times
        redrive has received it so far, this receive included."""
        return self.record_digests([message_digest(m) for m in message_ids])

    def record_digests(self, unsigned: Sequence[int]) -> list[int]:
        """:meth:`record`, given the messages' digests (the scan has them already)."""
        digests = [sqlite_integer(d) for d in unsigned]
        with self._lock:
            if self._conn is None:
                return [1] * len(digests)
            known = self._known(digests)
            counts = []
            for d in digests:
                self._pending[d] += 1
                counts.append(known.get(d, 0) + self._pending[d])
            self._flush_when_due()
            return counts

    def count_digests(self, unsigned: Sequence[int]) -> None:
        """Count one receive by redrive of each message (given its digest) without reading
        the counts so far: for a run that never shows them (a move without a ``--where`` on
        ``consumer_receives``), which then spares a read of the log per batch."""
        with self._lock:
            if self._conn is None:
                return
            for d in unsigned:
                self._pending[sqlite_integer(d)] += 1
            self._flush_when_due()

    def _flush_when_due(self) -> None:
        if (
            len(self._pending) >= FLUSH_ENTRIES
            or time.monotonic() - self._flushed_at >= FLUSH_SECONDS
        ):
            self._flush()

    def _known(self, digests: Sequence[int]) -> dict[int, int]:
        assert self._conn is not None
        marks = ",".join("?" * len(digests))
        try:
            rows = self._conn.execute(
                f"SELECT digest, count FROM receives WHERE digest IN ({marks})", digests
            ).fetchall()
        except sqlite3.Error as exc:
            self._disable(exc)
            return {}
        return {int(d): int(n) for d, n in rows}

    def note_queue(self, queue: str, deliveries: int, own: int) -> None:
        """Remember, per queue, the highest delivery count its broker showed on a message
        redrive received there and the most receives redrive itself made of one message
        there: what a refusal to read a queue with a delivery limit can say without reading
        it (see redrive.dlq.delivery_limit)."""
        with self._lock:
            if self._conn is None:
                return
            was = self._queue_pending.get(queue, (0, 0))
            self._queue_pending[queue] = (max(was[0], deliveries), max(was[1], own))

    def queue_highs(self, queue: str) -> tuple[int, int] | None:
        """The highest delivery count and the most receives of redrive's own seen on one
        message of ``queue`` (:meth:`note_queue`), or None if redrive never noted it."""
        with self._lock:
            if self._conn is None:
                return None
            try:
                row = self._conn.execute(
                    "SELECT deliveries, own FROM queues WHERE queue = ?", (queue,)
                ).fetchone()
            except sqlite3.Error as exc:
                self._disable(exc)
                return None
            pending = self._queue_pending.get(queue)
            if row is None and pending is None:
                return None
            known = (int(row[0]), int(row[1])) if row is not None else (0, 0)
            extra = pending or (0, 0)
            return max(known[0], extra[0]), max(known[1], extra[1])

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        self._flushed_at = time.monotonic()
        if self._conn is None or not (self._pending or self._queue_pending):
            return
        touched = int(self._clock())
        rows = [(d, n, touched) for d, n in self._pending.items()]
        queues = [(q, d, o, touched) for q, (d, o) in self._queue_pending.items()]
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany(_UPSERT, rows)
                self._conn.executemany(_QUEUE_UPSERT, queues)
                self._conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                return  # another process is writing: these counts go with the next flush
            self._disable(exc)
            return
        except sqlite3.Error as exc:
            self._disable(exc)
            return
        self._pending.clear()
        self._queue_pending.clear()
        self._added += len(rows)
        if self._added > self._max_entries // 10:
            try:
                self._prune(self._conn)
            except sqlite3.Error as exc:
                self._disable(exc)

    def close(self) -> None:
        with self._lock:
            self._flush()
            if self._conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
                self._conn = None
