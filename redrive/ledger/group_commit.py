"""Group commit: the write requests of a ledger object's callers that queue while its
transaction is in flight are run together, in arrival order, in the next one transaction;
one transaction at a time per object (per process), each caller answered once it commits.

Uncontended, a request waits for nothing but its own transaction (no batching window: what
queued is taken the moment the transaction before it ends). A worker thread that finds
nothing in flight and nothing queued runs its request itself, and then what queued
meanwhile, sparing the hand-over to the writer thread; the writer thread takes the rest.
The main thread always runs its own requests itself, alone, as the plain path does: Ctrl-C
lands there, and must stop no transaction carrying others' requests. Contended, N callers'
requests share one transaction, so one disk flush instead of N, and no caller waits on a
lock behind the others' flushes one by one.

The backend supplies ``commit_group``: it runs a group's requests in arrival order, then
settles each (:meth:`WriteRequest.finish` or :meth:`WriteRequest.fail`), all of them, on
every path. This module knows nothing of SQL.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from redrive.errors import LedgerError
from redrive.ledger.base import ledger_closed

_T = TypeVar("_T")

# A writer with nothing to do for this long ends; the next request starts another. A ledger
# that is dropped without close() is then not kept alive (with its connection) by its
# writer for longer than this.
IDLE_EXIT_S = 2.0
# Which process this is (a name of its own, so that a test can play a forked child).
current_pid = os.getpid

# At most this many requests per transaction, so one transaction stays short.
MAX_GROUP = 64


class WriteRequest(Generic[_T]):
    """One caller's write: ``apply`` runs its statements on the writer's connection inside
    the group's transaction and returns the caller's answer."""

    __slots__ = ("_done", "_error", "_result", "_settled", "apply", "flush", "what")

    def __init__(self, what: str, apply: Callable[[Any], _T], *, flush: bool) -> None:
        self.what = what
        self.apply = apply
        self.flush = flush
        # Made only for a request that waits for the writer (one a caller runs itself is
        # settled when it returns): a lock held until the request is settled. Cheaper than
        # an Event (a Condition, its lock and a waiter lock), made and set once per request.
        self._done: threading.Lock | None = None
        self._settled = False
        self._result: _T | None = None
        self._error: BaseException | None = None

    def will_wait(self) -> None:
        done = threading.Lock()
        done.acquire()
        self._done = done

    def finish(self, result: _T) -> None:
        self._result = result
        self._settle()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._settle()

    def _settle(self) -> None:
        if self._settled:
            return
        self._settled = True
        if self._done is not None:
            self._done.release()

    @property
    def settled(self) -> bool:
        return self._settled

    def outcome(self) -> _T:
        if (done := self._done) is not None:
            # Taken once settled, and given back: asking again does not wait.
            with done:
                pass
        if self._error is not None:
            # Raised in the caller's thread; the writer's traceback frames stay out of it.
            raise self._error.with_traceback(None)
        return self._result  # type: ignore[return-value]


class GroupWriter:
    """The queue of write requests and the thread that commits them in groups."""

    def __init__(
        self,
        commit_group: Callable[[list[WriteRequest[Any]]], None],
        *,
        location: str,
        idle_exit_s: float = IDLE_EXIT_S,
    ) -> None:
        self._commit_group = commit_group
        self._location = location
        self._idle_exit_s = idle_exit_s
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[WriteRequest[Any]] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        # A forked child inherits this object but not its writer thread (nor may it use the
        # parent's SQLite connection): it must open the ledger again, not wait forever.
        self._pid = current_pid()
        # Held by whoever runs a transaction (the writer, or a caller its own): one at a time.
        self._role = threading.Lock()
        # A worker thread holds the role and hands the queue over when done: no need to
        # wake the writer for what queues meanwhile.
        self._worker_leads = False
        # Read by the benchmark (requests per transaction); written under the role only.
        self.groups = 0
        self.requests = 0

    def submit(self, request: WriteRequest[_T]) -> _T:
        """Run ``request`` (alone or in a group) and return its answer once committed (or
        raise the error its group or its own statements met)."""
        if (pid := current_pid()) != self._pid:
            raise LedgerError(
                f"ledger {self._location} was opened by process {self._pid}, not this one "
                f"({pid}); open it again in this process"
            )
        if threading.current_thread() is threading.main_thread():
            return self._run_from_main(request)
        with self._cond:
            if self._closed:
                raise ledger_closed(self._location)
            inline = not self._queue and self._role.acquire(blocking=False)
            if inline:
                self._worker_leads = True
            else:
                request.will_wait()
                self._queue.append(request)
                if not self._worker_leads:
                    self._wake_writer()
        if inline:
            self._lead(request)
        # A worker thread's wait is never interrupted (Ctrl-C lands in the main thread, which
        # never queues): its request is always settled, by its group or by close().
        return request.outcome()

    def _lead(self, request: WriteRequest[Any]) -> None:
        """A worker thread that found nothing in flight: its own request, then (once, so that
        its return waits for one more transaction at most) what queued meanwhile, in this
        thread: no hand-over to the writer thread, whose wake-up costs more than a fast
        disk's flush. Worker threads never get Ctrl-C, so the hand-back below always runs."""
        try:
            self._execute([request])
            if (group := self._take_group()) is not None:
                self._execute(group)
        finally:
            with self._cond:
                self._worker_leads = False
                self._role.release()
                if self._queue and not self._closed:
                    self._wake_writer()

    def _run_from_main(self, request: WriteRequest[_T]) -> _T:
        """The main thread runs its own request, alone, holding the role as the plain path
        holds its lock. Ctrl-C lands in this thread: then it stops this thread's own
        transaction only (rolled back unless committed), never one carrying others'
        requests, and ``with`` gives the role back whatever it interrupts. What queues
        meanwhile was handed to the writer, which waits for the role."""
        with self._cond:
            if self._closed:
                raise ledger_closed(self._location)
        with self._role:
            if self._closed:
                raise ledger_closed(self._location)
            self._execute([request])
        return request.outcome()

    def queued(self) -> int:
        """Requests waiting for the writer (not counting the group in flight)."""
        with self._cond:
            return len(self._queue)

    def in_flight(self) -> bool:
        """Whether a transaction is being run (or its lock waited for)."""
        return self._role.locked()

    def close(self) -> None:
        """Let the transaction in flight finish, fail the requests still queued (the ledger
        is closed), and wait for the writer to end."""
        with self._cond:
            self._closed = True
            left, self._queue = self._queue, []
            thread = self._thread
            self._cond.notify_all()
        for request in left:
            request.fail(ledger_closed(self._location))
        with self._role:  # the transaction in flight ends first
            pass
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _wake_writer(self) -> None:
        """Under the lock: make sure a writer will take what is queued."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="redrive-ledger-writer", daemon=True
            )
            self._thread.start()
        else:
            self._cond.notify()  # the writer is the only one that waits on it

    def _take_group(self) -> list[WriteRequest[Any]] | None:
        """For the thread holding the role: the requests queued meanwhile, if any."""
        with self._cond:
            if not self._queue or self._closed:
                return None
            return self._pop_group()

    def _next_group(self) -> list[WriteRequest[Any]] | None:
        with self._cond:
            while not self._queue and not self._closed:
                if not self._cond.wait(self._idle_exit_s) and not self._queue:
                    break
            if not self._queue:
                self._thread = None  # under the lock: the next submit starts a new writer
                return None
            return self._pop_group()

    def _pop_group(self) -> list[WriteRequest[Any]]:
        """Under the lock: the next group off the queue's head, in arrival order."""
        group, self._queue = self._queue[:MAX_GROUP], self._queue[MAX_GROUP:]
        return group

    def _run(self) -> None:
        while (group := self._next_group()) is not None:
            with self._role:
                if self._closed:  # closed while it waited for the role: refused, as queued
                    for request in group:
                        request.fail(ledger_closed(self._location))
                    continue
                self._execute(group)

    def _execute(self, group: list[WriteRequest[Any]]) -> None:
        """Commit ``group`` and settle each of its requests, whatever happens."""
        self.groups += 1
        self.requests += len(group)
        try:
            self._commit_group(group)
        except BaseException as exc:  # never leave a caller waiting, whatever happened
            for request in group:
                if not request.settled:
                    request.fail(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            for request in group:
                if not request.settled:
                    request.fail(
                        LedgerError(f"ledger {self._location}: {request.what} got no answer")
                    )
