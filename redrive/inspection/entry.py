"""``inspect``'s one entry for a DLQ: the scan in this process (its ``--workers`` threads)
or spread over ``--processes`` (redrive.inspection.processes)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from redrive.broker.base import Broker, DlqTarget
from redrive.celery.results import ResultLookup
from redrive.dlq.receive_log import ReceiveLog
from redrive.inspection.processes import InspectScan, inspect_in_processes
from redrive.inspection.scan import InspectResult, inspect_dlq
from redrive.runs.processes import Wiring, needs_wiring


def inspect_queue(
    target: DlqTarget,
    scan: InspectScan,
    *,
    broker_factory: Callable[[], Broker],
    receive_log: ReceiveLog | None = None,
    results: ResultLookup | None = None,
    wiring: Wiring | None = None,
    stop: threading.Event | None = None,
    on_progress: Callable[[int], None] | None = None,
    on_depth: Callable[[int], None] | None = None,
    processes: int = 1,
) -> InspectResult:
    """Scan ``target``'s DLQ as ``scan`` says and leave it as it was: with ``processes``
    above 1, in that many processes, each built from ``wiring`` (it opens ``results``
    again); else here, reading ``results`` (Celery's result backend, if any)."""
    if processes > 1:
        return inspect_in_processes(
            target,
            scan,
            processes=processes,
            wiring=needs_wiring(wiring),
            broker=broker_factory(),
            stop=stop,
            on_progress=on_progress,
            on_depth=on_depth,
        )
    # One process: the scan's own clock, as any one inspect reads it.
    return inspect_dlq(
        target,
        broker_factory,
        limit=scan.limit,
        focus=scan.focus,
        workers=scan.workers,
        stop=stop,
        on_progress=on_progress,
        on_depth=on_depth,
        lease=scan.lease,
        receive_log=receive_log,
        results=results,
        group_by=scan.group_by,
    )
