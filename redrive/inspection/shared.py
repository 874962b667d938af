"""Shared scans (issue 41, item 4): every viewer of a DLQ served from one scan per refresh
interval, whatever their number.

A scan is a read the broker counts (SQS receive counts, RabbitMQ deliveries) and hides what
it reads while it runs, so a console must not scan once per page view. :class:`SharedScans`
keeps, per DLQ and view (what a scan counts: a ``--where``, a ``--group-by``), the last scan's
result, and runs at most one scan of a DLQ at a time, in a thread of its own: the first
caller of an interval starts it, the others get the last result (or, when there is none
yet, wait for the scan). Automatic scans of a DLQ are at most one per interval, whatever
the number of views asked for: a view first asked for inside the interval of another is
scanned when that interval ends. An operator may ask for a fresh scan (``fresh``), still
one at a time.

A DLQ that a live run is moving (its own or a CLI's, from the ledger's run records: the
``live_runs`` callable: :class:`redrive.runs.live.LedgerRuns`) is never scanned: the
caller gets that run's progress. A DLQ with a delivery limit of its own is refused as the CLI
refuses it (:mod:`redrive.dlq.delivery_limit`), and a scan that fails says why: each is a
typed status, never an exception. A scan is :func:`~redrive.inspection.scan.inspect_dlq`,
as ``inspect`` makes it: groups and counts only, in bounded memory for any depth; its result
says what the receive log and the broker's in-flight limits left out (``receive_log_problem``,
``incomplete``, ``hidden_before``).

The clock is injected: what is due and how old a result is follow it, never the wall clock.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from redrive.broker.base import Broker, DlqTarget
from redrive.celery.results import ResultLookup
from redrive.dlq import delivery_limit
from redrive.dlq.receive_log import ReceiveLog
from redrive.errors import RedriveError
from redrive.inspection.scan import DEFAULT_LEASE, Focus, InspectResult, inspect_dlq
from redrive.runs.live import RunProgress
from redrive.where import compile_expression, compile_where

DEFAULT_REFRESH = 60.0
MAX_VIEWS = 64
"""Views remembered at most (the least recently asked for goes first)."""


LiveRuns = Callable[[DlqTarget], RunProgress | None]
"""The live run moving a DLQ, if one is (None: none)."""

V = TypeVar("V", bound=Hashable)
"""A view: what one scan of a DLQ counts (hashable: scans are kept per DLQ and view)."""
R = TypeVar("R")
"""What a scan gives (an InspectResult, or a front end's own page of it)."""


@dataclass(frozen=True, slots=True)
class ScanControl:
    """What a scan gets from the cache: the clock's time, the stop (the cache is closing),
    and where to say how many messages it received so far."""

    now: float
    stop: threading.Event
    on_progress: Callable[[int], None]


ScanFn = Callable[[DlqTarget, V, ScanControl], R]


@dataclass(frozen=True, slots=True)
class Scanned(Generic[R]):
    """A scan's result: ``at`` (the cache's clock) when it ended; ``refreshing``: a newer
    scan of the DLQ is under way."""

    result: R
    at: float
    fresh: bool = False
    """An operator asked for it."""
    refreshing: bool = False
    kind: Literal["scanned"] = "scanned"


@dataclass(frozen=True, slots=True)
class Moving(Generic[R]):
    """A live run is moving the DLQ: not scanned (a scan would hide what the run reads)."""

    run: RunProgress
    last: Scanned[R] | None = None
    kind: Literal["moving"] = "moving"


@dataclass(frozen=True, slots=True)
class Refused:
    """The DLQ counts deliveries toward a limit of its own: not read (the CLI's refusal)."""

    reason: str
    kind: Literal["refused"] = "refused"


@dataclass(frozen=True, slots=True)
class Failed(Generic[R]):
    """The scan failed (the broker, credentials, the network): why, and the last result."""

    error: str
    at: float
    last: Scanned[R] | None = None
    kind: Literal["failed"] = "failed"


@dataclass(frozen=True, slots=True)
class Scanning:
    """No result yet: the scan under way (started ``started_at``; ``received`` so far), or
    due at ``due_at`` (a view first asked for inside another view's interval)."""

    started_at: float | None
    received: int = 0
    due_at: float | None = None
    kind: Literal["scanning"] = "scanning"


ScanStatus = Scanned[R] | Moving[R] | Refused | Failed[R] | Scanning


@dataclass(eq=False)
class _Job:
    """One scan under way."""

    view: tuple[str, Hashable]
    started_at: float
    fresh: bool
    stop: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    received: int = 0
    thread: threading.Thread | None = None


@dataclass
class _Slot(Generic[R]):
    """One view of a DLQ: its last status (a result, or the failure that followed it)."""

    last: Scanned[R] | None = None
    failed: Failed[R] | None = None


class SharedScans(Generic[V, R]):
    """Scans of DLQs shared by every caller; thread-safe. ``scan``: one scan of a DLQ as a
    view counts it (:func:`inspect_view` is inspect's); ``brokers``: a broker for a region
    (the delivery-limit check asks its capabilities); ``live_runs``: which live run moves a
    DLQ; ``receive_log``: redrive's own receives (the delivery-limit refusal says them)."""

    def __init__(
        self,
        scan: ScanFn[V, R],
        brokers: Callable[[str | None], Broker],
        *,
        refresh: float = DEFAULT_REFRESH,
        clock: Callable[[], float] = time.time,
        live_runs: LiveRuns | None = None,
        receive_log: Callable[[], ReceiveLog | None] = lambda: None,
        allow_delivery_limit: bool = False,
    ) -> None:
        self.refresh = refresh
        self._scan_fn = scan
        self._brokers = brokers
        self._clock = clock
        self._live_runs = live_runs
        self._receive_log = receive_log
        self._allow_delivery_limit = allow_delivery_limit
        self._cond = threading.Condition()
        self._slots: OrderedDict[tuple[str, Hashable], _Slot[R]] = OrderedDict()
        self._jobs: dict[str, _Job] = {}
        """DLQ URL -> its scan under way (one at a time per DLQ)."""
        self._last_start: dict[str, float] = {}
        """DLQ URL -> when its last automatic scan started."""
        self._closed = False
        self.scans = 0
        """Scans started (for the bench and the tests)."""

    def status(
        self, target: DlqTarget, view: V, *, fresh: bool = False, wait: float | None = None
    ) -> ScanStatus[R]:
        """What a viewer of ``target`` (as ``view`` counts it) is shown now. ``fresh``: scan
        anew (an operator's ask). ``wait``: how long to wait for a scan under way when there
        is no result to show yet (None: until it ends)."""
        run = self._live_runs(target) if self._live_runs is not None else None
        key = (target.dlq.url, view)
        if run is not None:
            with self._cond:
                slot = self._slots.get(key)
                return Moving(run, slot.last if slot is not None else None)
        refusal = self._refusal(target)
        if refusal is not None:
            return Refused(refusal)
        deadline = None if wait is None else time.monotonic() + wait
        with self._cond:
            job, now = self._job_for(target, view, key, fresh)
            while fresh and job is not None and job.view != key:
                # Another view's scan of this DLQ: one at a time, then ours.
                if not self._cond.wait_for(job.done.is_set, timeout=_left(deadline)):
                    return Scanning(None, due_at=now)
                job, now = self._job_for(target, view, key, fresh)
            slot = self._slot(key)
            shown = slot.failed or slot.last
            if shown is not None and not fresh:
                return _refreshing(shown) if job is not None and job.view == key else shown
            if job is None or job.view != key:
                started = self._last_start.get(key[0])
                return Scanning(None, due_at=started + self.refresh if started else now)
            self._cond.wait_for(job.done.is_set, timeout=_left(deadline))
            if not job.done.is_set():
                return Scanning(job.started_at, job.received)
            return slot.failed or slot.last or Scanning(None, due_at=now)

    def _job_for(
        self, target: DlqTarget, view: V, key: tuple[str, Hashable], fresh: bool
    ) -> tuple[_Job | None, float]:
        """The DLQ's scan under way, started now when one is due (callers hold the lock)."""
        now = self._clock()
        url = target.dlq.url
        job = self._jobs.get(url)
        if job is not None or self._closed:
            return job, now
        slot = self._slot(key)
        last = self._last_start.get(url)
        since = slot.last.at if slot.last is not None else None
        if slot.failed is not None:
            since = slot.failed.at
        due = fresh or (
            (since is None or now - since >= self.refresh)
            and (last is None or now - last >= self.refresh)
        )
        if not due:
            return None, now
        job = _Job(key, now, fresh)
        self._jobs[url] = job
        self._last_start[url] = now
        self.scans += 1
        job.thread = threading.Thread(
            target=self._scan,
            args=(target, view, job),
            name=f"redrive-scan-{target.dlq.name}",
            daemon=True,
        )
        job.thread.start()
        return job, now

    def _slot(self, key: tuple[str, Hashable]) -> _Slot[R]:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot()
            while len(self._slots) > MAX_VIEWS:
                self._slots.popitem(last=False)
        else:
            self._slots.move_to_end(key)
        return slot

    def _refusal(self, target: DlqTarget) -> str | None:
        if self._allow_delivery_limit or not target.dlq.max_receive_count:
            return None
        broker = self._brokers(target.region)
        return delivery_limit.refusal(target.dlq, broker.capabilities, self._receive_log)

    def _scan(self, target: DlqTarget, view: V, job: _Job) -> None:
        """The scan, in its own thread: its result (or why it failed) for every viewer."""
        failed: Failed[R] | None = None
        result: R | None = None
        control = ScanControl(self._clock(), job.stop, lambda n: setattr(job, "received", n))
        try:
            result = self._scan_fn(target, view, control)
        except RedriveError as exc:
            failed = Failed(str(exc), self._clock())
        finally:
            with self._cond:
                slot = self._slot(job.view)
                if result is not None and not job.stop.is_set():
                    slot.last, slot.failed = Scanned(result, self._clock(), job.fresh), None
                elif failed is not None:
                    slot.failed = Failed(failed.error, failed.at, slot.last)
                self._jobs.pop(job.view[0], None)
                job.done.set()
                self._cond.notify_all()

    def close(self, timeout: float | None = None) -> None:
        """Stop every scan under way (each gives back what it holds) and start no more."""
        with self._cond:
            self._closed = True
            jobs = list(self._jobs.values())
        for job in jobs:
            job.stop.set()
        for job in jobs:
            if job.thread is not None:
                job.thread.join(timeout)


def _refreshing(shown: Scanned[R] | Failed[R]) -> Scanned[R] | Failed[R]:
    if isinstance(shown, Failed):
        return shown
    return Scanned(shown.result, shown.at, shown.fresh, refreshing=True)


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


# -- inspect's scans ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InspectView:
    """What an inspect counts: ``--where`` texts, a ``--group-by`` expression (None: by task)."""

    where: tuple[str, ...] = ()
    group_by: str | None = None

    def focus(self) -> Focus:
        """Compiled (a bad expression is a UsageProblem, said as the scan's failure)."""
        where = compile_where(self.where) if self.where else None
        group_by = compile_expression(self.group_by, option="--group-by") if self.group_by else None
        return Focus(where, group_by)


def inspect_view(
    brokers: Callable[[str | None], Broker],
    *,
    receive_log: Callable[[], ReceiveLog | None] = lambda: None,
    results: ResultLookup | None = None,
    workers: int = 1,
    lease: int = DEFAULT_LEASE,
) -> ScanFn[InspectView, InspectResult]:
    """Inspect's scan of a DLQ as a view counts it, as ``redrive inspect`` makes it."""

    def scan(target: DlqTarget, view: InspectView, control: ScanControl) -> InspectResult:
        return inspect_dlq(
            target,
            lambda: brokers(target.region),
            workers=workers,
            stop=control.stop,
            on_progress=control.on_progress,
            now=control.now,
            lease=lease,
            receive_log=receive_log(),
            focus=view.focus(),
            results=results,
        )

    return scan
