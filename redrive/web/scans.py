"""Where the console's pages read a DLQ's scan from: the :class:`ScanSource` seam.

Every scan is a read the broker counts (SQS receive counts, RabbitMQ deliveries) and hides
what it reads while it runs, so pages never scan themselves: they ask a source. The one here,
:class:`ScanPerRequest`, scans on each ask (a console for one person, and the tests); the
shared cache (one scan per DLQ per ``--refresh`` whatever the number of viewers, none of a
DLQ a live run is moving) is another implementation of the same protocol.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from redrive.broker.base import DlqTarget
from redrive.errors import NoDeadLetterQueue, QueueNotFound, RedriveError, UsageProblem
from redrive.inspection.groups import Counted
from redrive.inspection.processes import InspectScan
from redrive.inspection.scan import Focus, InspectResult
from redrive.operations.coordinator import Caller, InspectRequest, Setup, run_operation
from redrive.reporting.inspect import annotate_groups
from redrive.runs.observer import NULL_OBSERVER, Callbacks
from redrive.web.samples import SampleKeeper
from redrive.web.spool import MessageSpool
from redrive.web.workspace import Workspace
from redrive.where import compile_expression, compile_where


@dataclass(frozen=True, slots=True)
class ScanRequest:
    """One DLQ's scan as a page asks for it: the TARGET as the CLI takes it (a family, a
    queue name or URL) and inspect's ``--where`` and ``--group-by``."""

    target: str
    where: tuple[str, ...] = ()
    group_by: str = "task"

    @property
    def reads_results(self) -> bool:
        return self.group_by == "exception"


@dataclass(frozen=True, slots=True)
class ScanOutcome:
    """What a page shows of a DLQ: its scan (None when there is none to show), the
    messages kept from it in memory (the ``--where`` record of each, by message id), every
    message it counted on disk (``spool``, arguments withheld), and why there is no scan, or
    why it is not fresh, in one line."""

    request: ScanRequest
    result: InspectResult | None
    records: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    spool: MessageSpool | None = None
    problem: str | None = None
    """Why there is no scan (a delivery limit refused, the broker failed): said on the page."""
    moving: str | None = None
    """A live run moving this DLQ (its run id): no scan while it does (shared sources)."""
    scanned_at: float | None = None
    status: int = 200
    """The HTTP status the problem answers with (:func:`status_of`)."""


def status_of(exc: RedriveError) -> int:
    """A target that is no DLQ is 404; a request the CLI would refuse (a bad --where, a
    delivery limit not allowed) 400; a broker or backend that failed 502."""
    if isinstance(exc, QueueNotFound | NoDeadLetterQueue):
        return 404
    return 400 if isinstance(exc, UsageProblem) else 502


def failed(request: ScanRequest, exc: RedriveError) -> ScanOutcome:
    return ScanOutcome(request, None, problem=str(exc), status=status_of(exc))


class ScanSource(Protocol):
    """What pages read scans from. ``fresh``: an operator asked for a new scan now."""

    def scan(self, request: ScanRequest, *, fresh: bool = False) -> ScanOutcome: ...

    def close(self) -> None:
        """Stop what is scanning (the server is stopping): scans release what they hold."""
        ...


@dataclass
class ScanPerRequest:
    """A scan per ask, as ``redrive inspect`` makes one: nothing shared, nothing cached."""

    workspace: Workspace
    clock: Callable[[], float] = time.time
    stop: threading.Event = field(default_factory=threading.Event)

    def scan(self, request: ScanRequest, *, fresh: bool = False) -> ScanOutcome:
        try:
            return run_scan(self.workspace, request, now=self.clock(), stop=self.stop)
        except RedriveError as exc:
            return failed(request, exc)

    def close(self) -> None:
        self.stop.set()


def run_scan(
    workspace: Workspace, request: ScanRequest, *, now: float, stop: threading.Event
) -> ScanOutcome:
    """One inspect of the request's DLQ (the CLI's, in one worker thread), keeping the
    records of up to :data:`~redrive.web.samples.KEPT_PER_GROUP` messages per group for the
    message page. Raises what inspect raises (a delivery limit refused, a target not found)."""
    return scan_dlq(workspace, workspace.target(request.target), request, now=now, stop=stop)


def scan_dlq(
    workspace: Workspace,
    dlq: DlqTarget,
    request: ScanRequest,
    *,
    now: float,
    stop: threading.Event,
    on_progress: Callable[[int], None] | None = None,
) -> ScanOutcome:
    """:func:`run_scan` of a DLQ resolved already (a shared source resolves it first, to
    know whether a live run moves it)."""
    results = workspace.results
    if request.reads_results and results is None:
        raise UsageProblem("--group-by exception reads Celery's result backend: give one")
    # Removed with the outcome (the last reference to it), or here when the scan fails.
    spool = MessageSpool()
    keeper = SampleKeeper(now=now, sources=tuple(s.name for s in dlq.sources), spool=spool)
    scan = InspectScan(
        now=now,
        lease=workspace.lease,
        focus=focus_of(request, on_counted=keeper.offer),
        group_by="exception" if request.reads_results else None,
    )
    try:
        # Through the coordinator, as the CLI's inspect: nothing recorded, all given back.
        result = run_operation(
            InspectRequest(dlq, scan, results=results),
            setup=Setup(brokers=workspace.broker_for, receive_log=lambda: workspace.receive_log),
            ledger=None,
            caller=Caller.of("console", "web inspect"),
            observer=Callbacks(on_progress=on_progress) if on_progress else NULL_OBSERVER,
            stop=stop,
        ).unwrap()
        spool.finish()
    except BaseException:
        spool.close()
        raise
    if workspace.knowledge is not None and result.group_by is None:
        annotate_groups(result.groups, workspace.knowledge, result.sources)
    return ScanOutcome(request, result, records=keeper.records, spool=spool, scanned_at=now)


def focus_of(request: ScanRequest, *, on_counted: Counted | None = None) -> Focus:
    """The request's --where and --group-by, compiled (a bad one is a UsageProblem)."""
    expression = None if request.group_by in ("task", "exception") else request.group_by
    where = compile_where(request.where) if request.where else None
    group_by = compile_expression(expression, option="--group-by") if expression else None
    return Focus(where, group_by, on_counted=on_counted)
