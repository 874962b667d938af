"""A scan's messages on disk, so that a DLQ page lists any page of them without a read the
broker counts (a rescan per page would receive every message again) and without holding a
summary of every message in the server's memory.

As a console scan counts each message, :class:`MessageSpool` writes its record, arguments
withheld (:func:`redrive.web.samples.public_record`: never the arguments, the body, nor
the headers that repeat them), to an SQLite file in a folder of its own (mode 0700), a few
hundred rows per write; the scan's aggregates (groups, counts, timelines) stay in memory.
Pages read a page of rows from it. The folder is removed with the scan: when the last
reference to the spool goes (the cache replaced or forgot the scan, the request that made
it ended) or the process exits, whichever comes first. A server that was killed cannot
remove its own: each folder's name holds its server's process id, and the first spool a
server makes removes the folders of servers no longer running.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
import threading
import weakref
from collections import Counter
from collections.abc import Collection
from typing import Any

FLUSH_EVERY = 256
"""Records held in memory at most before they are written: the spool's memory, at any depth."""
CACHE_KIB = 1024
"""SQLite's page cache per spool (a page read needs a few pages, not the file)."""


PREFIX = "redrive-web-scan-"
_swept: set[str] = set()
_sweeping = threading.Lock()


def _left_by(name: str) -> int | None:
    """The process id in a spool folder's name (``PREFIX + PID + "-" + random``), or None
    for a name that is not a spool's."""
    pid, dash, _ = name[len(PREFIX) :].partition("-")
    return int(pid) if name.startswith(PREFIX) and dash and pid.isdigit() else None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: running
        return True
    return True


def sweep_dead_servers(directory: str) -> list[str]:
    """Remove the spool folders in ``directory`` whose server is no longer running (killed
    before it could remove them); the folders removed."""
    removed = []
    for entry in os.scandir(directory):
        pid = _left_by(entry.name)
        if pid is not None and pid != os.getpid() and not _running(pid):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


def _sweep_once(directory: str | None) -> None:
    where = directory or tempfile.gettempdir()
    with _sweeping:
        if where not in _swept:
            _swept.add(where)
            sweep_dead_servers(where)


def _remove(conn: sqlite3.Connection, folder: str) -> None:
    conn.close()
    shutil.rmtree(folder, ignore_errors=True)


class MessageSpool:
    """One scan's message records, in the order it counted them; thread-safe. Written by the
    scan (:meth:`add`, then :meth:`finish`), then read a page at a time (:meth:`page`)."""

    def __init__(self, directory: str | None = None) -> None:
        _sweep_once(directory)
        self.folder = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=directory)
        conn = sqlite3.connect(
            os.path.join(self.folder, "messages.sqlite3"),
            check_same_thread=False,
            isolation_level=None,
        )
        # A scratch file, removed with the scan: nothing to recover after a crash.
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        conn.execute(
            "CREATE TABLE messages (seq INTEGER PRIMARY KEY, label TEXT NOT NULL,"
            " rank INTEGER NOT NULL, message_id TEXT NOT NULL, record TEXT NOT NULL)"
        )
        self._conn = conn
        self._lock = threading.Lock()
        self._pending: list[tuple[int, str, int, str, str]] = []
        self.counts: Counter[str] = Counter()
        """Messages spooled per group label (as many labels as the scan has groups)."""
        self.total = 0
        self.most_pending = 0
        """The most records held in memory at once (the tests' measure of boundedness)."""
        self.finished = False
        self._finalizer = weakref.finalize(self, _remove, conn, self.folder)

    def add(self, message_id: str, label: str, record: dict[str, Any]) -> None:
        """One counted message's record (its arguments withheld by the caller)."""
        text = json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str)
        with self._lock:
            # seq: the message's place in the scan; rank: in its group (both from 1), so a
            # page is a range of either, never an OFFSET walked row by row.
            self.counts[label] += 1
            self.total += 1
            self._pending.append((self.total, label, self.counts[label], message_id, text))
            self.most_pending = max(self.most_pending, len(self._pending))
            if len(self._pending) >= FLUSH_EVERY:
                self._flush()

    def _flush(self) -> None:
        if self._pending:
            # One transaction a write (autocommit would make each row one).
            self._conn.execute("BEGIN")
            self._conn.executemany("INSERT INTO messages VALUES (?, ?, ?, ?, ?)", self._pending)
            self._conn.execute("COMMIT")
            self._pending.clear()

    def finish(self) -> None:
        """The scan is over: what is left written, and the indexes pages read by."""
        with self._lock:
            self._flush()
            self._conn.execute("CREATE INDEX by_label ON messages (label, rank)")
            self._conn.execute("CREATE INDEX by_id ON messages (message_id)")
            self.finished = True

    def selected(self, labels: Collection[str] | None) -> int:
        """How many messages the groups ``labels`` hold (None: every group)."""
        with self._lock:
            if labels is None:
                return self.total
            return sum(self.counts[label] for label in set(labels))

    def page(self, labels: Collection[str] | None, offset: int, size: int) -> list[dict[str, Any]]:
        """``size`` records from ``offset``: of every message in the order the scan counted
        them (``labels`` None), or of the groups ``labels``, group by group (by label)."""
        with self._lock:
            if labels is None:
                rows = self._conn.execute(
                    "SELECT record FROM messages WHERE seq > ? ORDER BY seq LIMIT ?",
                    (offset, size),
                ).fetchall()
            else:
                rows = []
                for label in sorted(set(labels)):
                    count = self.counts[label]
                    if offset >= count:
                        offset -= count  # the whole group is before the page
                        continue
                    rows += self._conn.execute(
                        "SELECT record FROM messages WHERE label = ? AND rank > ?"
                        " ORDER BY rank LIMIT ?",
                        (label, offset, size - len(rows)),
                    ).fetchall()
                    offset = 0
                    if len(rows) >= size:
                        break
        return [json.loads(text) for (text,) in rows]

    def record(self, message_id: str) -> dict[str, Any] | None:
        """One message's record, arguments withheld (None: the scan counted no such one)."""
        with self._lock:
            row = self._conn.execute(
                "SELECT record FROM messages WHERE message_id = ? ORDER BY seq LIMIT 1",
                (message_id,),
            ).fetchone()
        return json.loads(row[0]) if row is not None else None

    def close(self) -> None:
        """Remove the spool now (else when the last reference to it goes)."""
        with self._lock:
            self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive
