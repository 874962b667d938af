"""The PostgreSQL ledger's connections and the path each write takes to its server (group
commit, or one transaction per call under a lock), with psycopg's errors said as one-line
LedgerErrors, passwords masked.

What a lost connection means depends on when it was lost. Before COMMIT was sent, the
server rolls the transaction back: nothing of it happened, and the caller is told so. While
COMMIT was on its way (or its answer was), nobody can say: the transaction may be committed.
That is in doubt, never assumed either way: the caller is told so, and the run's claims
stay in the ledger as what they are (a later run or ``redrive ledger in-doubt`` finds them).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from redrive.errors import LedgerError
from redrive.ledger.base import ledger_closed
from redrive.ledger.group_commit import GroupWriter, WriteRequest
from redrive.ledger.postgres_schema import scrub

if TYPE_CHECKING:
    import psycopg

_T = TypeVar("_T")

# Two groups taking row locks in different orders can deadlock (the server ends one with
# 40P01), and a serialisation failure (40001) ends one too: both roll back whole, so the
# group runs again, up to this many times.
_RETRIES = 5
_RETRY_STATES = frozenset({"40P01", "40001"})
CONNECT_TIMEOUT_S = 10
# A host cut off from the server mid-call must find out, not wait for an answer forever:
# TCP keepalives end a silent connection after 10 + 3 x 5 s, and tcp_user_timeout one whose
# writes go unacknowledged for 30 s (libpq's parameters; the URL may set its own).
CONNECTION_DEFAULTS: dict[str, Any] = {
    "connect_timeout": CONNECT_TIMEOUT_S,
    "application_name": "redrive",
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}
# And the server must not keep the transaction of a host it lost open (holding the row
# locks of its claims, which other hosts' claims of the same keys wait for) for longer than
# this (unless it is bounded already): it ends it, uncommitted. redrive's own transactions
# never sit idle.
IDLE_IN_TRANSACTION = "60s"


class InDoubt(LedgerError):
    """The connection was lost while a COMMIT was under way: committed or not, unknown."""


class PgConnector:
    """How this ledger reaches its server: ``url`` (with its password; never printed) and
    ``location`` (masked, for every message)."""

    def __init__(self, url: str, location: str) -> None:
        self.url = url
        self.location = location

    def connect(self, *, autocommit: bool) -> psycopg.Connection[tuple[Any, ...]]:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        try:
            given = conninfo_to_dict(self.url)
            defaults = {k: v for k, v in CONNECTION_DEFAULTS.items() if k not in given}
            conn = psycopg.connect(self.url, autocommit=autocommit, **defaults)
            if not autocommit:
                # Unless the server, the role or the URL already bounds it.
                shown = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
                if shown is not None and str(shown[0]) == "0":
                    conn.execute(
                        f"SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION}'"
                    )
                conn.commit()
            return conn
        except psycopg.Error as e:
            raise LedgerError(
                f"cannot connect to ledger {self.location} ({self.said(e)}); check the "
                "URL, the server and the role's password"
            ) from None

    def said(self, e: BaseException) -> str:
        """The first line of a driver's message, without passwords."""
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return scrub(text, self.url)

    def op_error(self, what: str, e: BaseException) -> LedgerError:
        return LedgerError(
            f"ledger {self.location}: {what} failed ({self.said(e)}); nothing of it was "
            "committed; check the server, then retry"
        )

    def in_doubt(self, what: str, e: BaseException) -> InDoubt:
        return InDoubt(
            f"ledger {self.location}: the connection was lost while committing {what} "
            f"({self.said(e)}); whether it was committed is unknown, so its keys are in "
            "doubt (see `redrive ledger in-doubt`); check the server, then run again"
        )


def _sqlstate(e: BaseException) -> str | None:
    return getattr(e, "sqlstate", None)


class PgWrites:
    """Every write of one ledger object, on its one write connection (opened again after
    one that broke): group-committed by ``group``, or the plain path (``group_commit=False``),
    callers serialised by ``lock``."""

    def __init__(self, connector: PgConnector, *, group_commit: bool) -> None:
        self._connector = connector
        self.lock = threading.Lock()
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self.closed = False
        self.group: GroupWriter | None = (
            GroupWriter(self._commit_group, location=connector.location) if group_commit else None
        )

    def submit(self, what: str, apply: Callable[[Any], _T], *, flush: bool = True) -> _T:
        """Run ``apply`` (on the write connection) in a transaction, its group's or its
        own, and return its answer once committed.

        ``flush=False`` lets the server answer before the commit is on disk (and on a
        synchronous standby), as SQLite's path does, for records whose loss is harmless: a
        lost SENT reads as CLAIMED, i.e. in doubt (held, never resent); a lost DONE has
        nothing left to do. The server writes its WAL in order, so the next flushed commit
        (the next claim) makes them durable too. A group with any flushed request is
        flushed whole."""
        if self.closed:
            raise ledger_closed(self._connector.location)
        if self.group is None:
            with self.lock:
                try:
                    result: _T = self._attempts([WriteRequest(what, apply, flush=flush)])[0]
                except _OwnFailure as own:
                    raise own.error.with_traceback(None) from None
                return result
        return self.group.submit(WriteRequest(what, apply, flush=flush))

    def close(self) -> None:
        self.closed = True
        if self.group is not None:
            self.group.close()
        with self.lock:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
            self._conn = None

    def _live(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self.closed:
            raise ledger_closed(self._connector.location)
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = self._connector.connect(autocommit=False)
        return self._conn

    # ----------------------------------------------------------------- one transaction

    def _attempts(self, pending: list[WriteRequest[Any]]) -> list[Any]:
        """``pending`` in one transaction, again after a deadlock or serialisation failure
        (rolled back whole, so nothing of it happened); their answers once committed."""
        for attempt in range(_RETRIES):
            try:
                return self._transaction(pending)
            except _Retry as retry:
                if attempt == _RETRIES - 1:
                    raise self._connector.op_error(pending[0].what, retry.error) from None
        raise AssertionError("unreachable")

    def _transaction(self, pending: list[WriteRequest[Any]]) -> list[Any]:
        import psycopg

        conn = self._live()
        what = pending[0].what
        results = []
        if not any(request.flush for request in pending):
            self._unflushed(conn, what)
        for request in pending:
            try:
                results.append(request.apply(conn))
            except BaseException as e:
                self._roll_back(conn)
                if isinstance(e, psycopg.Error):
                    if _sqlstate(e) in _RETRY_STATES:
                        raise _Retry(e) from None
                    if conn.closed or conn.broken:  # the transaction's failure, not its own
                        raise self._connector.op_error(what, e) from None
                    raise _OwnFailure(request, self._connector.op_error(request.what, e)) from None
                if isinstance(e, Exception):
                    raise _OwnFailure(request, e) from None
                raise
        try:
            conn.commit()
        except BaseException as e:
            # The server may have committed before the connection (or the caller) gave up.
            if isinstance(e, psycopg.Error) and not (conn.closed or conn.broken):
                self._roll_back(conn)
                if _sqlstate(e) in _RETRY_STATES:
                    raise _Retry(e) from None
                raise self._connector.op_error(what, e) from None
            self._drop(conn)
            if isinstance(e, Exception):
                raise self._connector.in_doubt(what, e) from None
            raise
        return results

    def _unflushed(self, conn: psycopg.Connection[tuple[Any, ...]], what: str) -> None:
        """This transaction's COMMIT answers before the WAL is flushed (see submit)."""
        import psycopg

        try:
            conn.execute("SET LOCAL synchronous_commit = off")
        except psycopg.Error as e:
            self._roll_back(conn)
            raise self._connector.op_error(what, e) from None

    def _roll_back(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        try:
            conn.rollback()
        except Exception:
            self._drop(conn)

    def _drop(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        with contextlib.suppress(Exception):
            conn.close()
        if self._conn is conn:
            self._conn = None

    # ----------------------------------------------------------------- group commit

    def _commit_group(self, group: list[WriteRequest[Any]]) -> None:
        """The writer's work: ``group`` in one transaction, in arrival order. A request
        whose own statements fail (a LedgerError it raises, a constraint) is answered with
        its error and the others run again without it; a failure of the transaction
        itself (the connection, the commit) fails them all and commits none."""
        pending = list(group)
        while pending:
            try:
                results = self._attempts(pending)
            except _OwnFailure as own:
                own.request.fail(own.error)
                pending.remove(own.request)
                continue
            except BaseException as e:
                for request in pending:
                    request.fail(e)
                if not isinstance(e, Exception):
                    raise
                return
            for request, result in zip(pending, results, strict=True):
                request.finish(result)
            return


class _Retry(Exception):
    def __init__(self, error: BaseException) -> None:
        self.error = error


class _OwnFailure(Exception):
    def __init__(self, request: WriteRequest[Any], error: BaseException) -> None:
        self.request = request
        self.error = error


class PgReads:
    """Reads, on a connection of their own in autocommit (each read one statement, so one
    snapshot), serialised by a lock: a worker's reads never wait for a group's commit."""

    def __init__(self, connector: PgConnector) -> None:
        self._connector = connector
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self.closed = False

    def fetch(self, what: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        import psycopg

        with self._lock:
            if self.closed:
                raise ledger_closed(self._connector.location)
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = self._connector.connect(autocommit=True)
            try:
                return self._conn.execute(sql, params).fetchall()
            except psycopg.Error as e:
                if self._conn.broken:
                    with contextlib.suppress(Exception):
                        self._conn.close()
                    self._conn = None
                raise LedgerError(
                    f"ledger {self._connector.location}: {what} failed "
                    f"({self._connector.said(e)}); check the server, then retry"
                ) from None

    def close(self) -> None:
        with self._lock:
            self.closed = True
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
            self._conn = None
