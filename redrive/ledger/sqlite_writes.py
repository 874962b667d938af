"""The SQLite ledger's writes: its one write connection, and the path each write takes to
it (group commit, or the plain path: one transaction per call under a lock)."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeGuard, TypeVar

from redrive.ledger.base import ledger_closed
from redrive.ledger.group_commit import GroupWriter, WriteRequest
from redrive.ledger.sqlite_file import LedgerFile

# Waiting for another process's write lock: SQLite's own busy handler sleeps 1, 2, 5, 10 ...
# ms between tries, so a waiter wakes up to several ms after a commit that took a fraction
# of one. The grouped path tries again itself at these short steps (seconds) instead.
_BEGIN_RETRY_STEPS = (0.0001, 0.0002, 0.0005, 0.001)

_T = TypeVar("_T")


def _is_sqlite(e: BaseException) -> TypeGuard[sqlite3.Error]:
    return isinstance(e, sqlite3.Error)


def _is_busy(e: sqlite3.OperationalError) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(e) or "busy" in str(e)


class SqliteWrites:
    """Every write of one ledger object, on its write connection ``conn`` (None once
    closed): group-committed by ``group`` (:mod:`redrive.ledger.group_commit`), or with
    ``group_commit=False`` the plain path, callers serialised by ``lock``."""

    def __init__(self, file: LedgerFile, conn: sqlite3.Connection, *, group_commit: bool) -> None:
        self._file = file
        self.lock = threading.Lock()
        self.conn: sqlite3.Connection | None = conn
        self.group: GroupWriter | None = (
            GroupWriter(self._commit_group, location=file.location) if group_commit else None
        )

    def submit(self, what: str, apply: Callable[[sqlite3.Connection], _T], *, flush: bool) -> _T:
        """Run ``apply`` in a write transaction (its group's, or one of its own on the plain
        path) and return its answer once committed. Arguments are checked before this, in
        the caller's thread; ``apply`` only runs statements."""
        if self.group is None:
            with self._write(what, flush=flush) as conn:
                return apply(conn)
        return self.group.submit(WriteRequest(what, apply, flush=flush))

    def live_conn(self) -> sqlite3.Connection:
        if self.conn is None:
            raise ledger_closed(self._file.location)
        return self.conn

    def close(self) -> None:
        if self.group is not None:
            self.group.close()  # the group in flight ends first; queued ones are refused
        with self.lock:
            if self.conn is not None:
                self.conn.close()
            self.conn = None

    # ----------------------------------------------------------------- the plain path

    @contextlib.contextmanager
    def _write(self, what: str, *, flush: bool = True) -> Iterator[sqlite3.Connection]:
        """The plain path's write: one IMMEDIATE transaction under the object's lock,
        committed on success, rolled back on error.

        ``flush=False`` commits without waiting for the disk: for records whose loss is
        harmless (a lost SENT reads as CLAIMED, i.e. in doubt: held, never resent; a lost
        DONE has nothing left to do; a heartbeat is refreshed). The next flushed commit (the
        next claim) makes them durable too, since the WAL is written in order.
        """
        with self.lock:
            conn = self.live_conn()
            try:
                with self._file.guarded(conn, what):
                    if not flush:
                        conn.execute("PRAGMA synchronous=NORMAL")
                    conn.execute("BEGIN IMMEDIATE")
                    yield conn
                    conn.execute("COMMIT")
            finally:
                if not flush:
                    conn.execute("PRAGMA synchronous=FULL")

    # ----------------------------------------------------------------- group commit

    def _commit_group(self, group: list[WriteRequest[Any]]) -> None:
        """The writer's work: ``group`` in one transaction, in arrival order; settle every
        request. A request whose own statements fail is answered with its error and the
        others run again without it (rolled back first, so nothing of it stays); a failure
        of the transaction itself (the lock, the commit, SQLite rolling back) fails them all,
        each with the error its call would have met alone, and commits none."""
        pending = list(group)
        while pending:
            conn = self.conn
            if conn is None:
                for request in pending:
                    request.fail(ledger_closed(self._file.location))
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
        return self._file.op_error(what, e) if _is_sqlite(e) else e

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
                    deadline = now + self._file.busy_timeout
                elif now >= deadline:
                    raise
            time.sleep(_BEGIN_RETRY_STEPS[min(attempt, len(_BEGIN_RETRY_STEPS) - 1)])
            attempt += 1
