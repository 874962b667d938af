"""``inspect`` in ``--processes``: each child scans part of the DLQ; their groups merge into
one inspect (redrive.runs.processes runs them)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from redrive.broker.base import Broker, DlqTarget
from redrive.errors import RedriveError
from redrive.inspection.groups import DEFAULT_MAX_REDRIVES
from redrive.inspection.merge import merge_inspect_results
from redrive.inspection.scan import Focus, InspectResult, inspect_counts, inspect_dlq
from redrive.runs.observer import RunObserver
from redrive.runs.processes import (
    Child,
    ChildRun,
    ChildStatus,
    Job,
    Spread,
    Wiring,
    check_picklable,
    check_processes,
    run_spread,
)
from redrive.selection import Sightings

# -- inspect -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InspectScan:
    """What one inspect scan reads: inspect_dlq's options, the same in every process
    (``now`` too, so expiry and ages agree) but ``limit``, split between them."""

    limit: int | None = None
    show_args: bool = False
    workers: int = 1
    max_redrives: int = DEFAULT_MAX_REDRIVES
    now: float = 0.0
    lease: int = 30
    focus: Focus | None = None
    group_by: str | None = None
    counts: tuple[int, int] | None = None
    """SQS's depth and in-flight count, as the parent read them (the children read none)."""


def limit_share(limit: int | None, processes: int, number: int) -> int | None:
    """Process ``number``'s part of an inspect's ``--limit``: the parts add up to it."""
    if limit is None:
        return None
    return limit // processes + (1 if number <= limit % processes else 0)


@dataclass(frozen=True, slots=True)
class InspectJob:
    target: DlqTarget
    scan: InspectScan

    def run(self, child: ChildRun) -> tuple[InspectResult, Sightings | None]:
        results = child.rebuilt(None)
        observer = child.observer
        try:
            with child.receive_log() as receive_log:
                return inspect_dlq(
                    self.target,
                    child.broker,
                    limit=self.scan.limit,
                    show_args=self.scan.show_args,
                    workers=self.scan.workers,
                    stop=child.stop,
                    on_progress=observer.on_progress,
                    max_redrives=self.scan.max_redrives,
                    now=self.scan.now,
                    lease=self.scan.lease,
                    receive_log=receive_log,
                    focus=self.scan.focus,
                    results=results,
                    group_by=self.scan.group_by,
                    scan_ended=child.shares.scan_ended,
                    counts=self.scan.counts,
                ), None
        finally:
            if results is not None:
                results.close()


def _received(n: int) -> tuple[int, ...]:
    return (n,)


def inspect_in_processes(
    target: DlqTarget,
    scan: InspectScan,
    *,
    processes: int,
    wiring: Wiring,
    broker: Broker,
    stop: threading.Event | None = None,
    on_progress: Callable[[int], None] | None = None,
    on_depth: Callable[[int], None] | None = None,
) -> InspectResult:
    """``inspect`` in ``processes`` processes: each scans part of the DLQ, holding what it
    received until every one's scan has ended; the groups merged into one inspect. A
    process that dies makes the inspect an error (what it counted is lost)."""
    check_processes(processes)
    check_picklable(scan, "these options")
    stop = stop or threading.Event()
    started = time.monotonic()
    depth, hidden = inspect_counts(broker, target.dlq.url)
    if on_depth is not None:
        on_depth(depth)

    def job(number: int, run_id: str | None, parent: str | None) -> Job:
        limit = limit_share(scan.limit, processes, number)
        share = replace(scan, limit=limit, counts=(depth, hidden))
        return InspectJob(target, share)

    merge = _inspect_merger(depth, hidden, started, stop)
    spread: Spread[InspectResult] = Spread(
        ledger=None,
        execute=False,
        command="inspect",
        info={},
        lease=scan.lease,
        limit=None,
        rate=None,
        job=job,
        progress_of=_received,
        progress=lambda snapshots, run_id: sum(s[0] for s in snapshots),
        merge=merge,
        counts=lambda result: {},
        claims=False,
    )
    return run_spread(
        spread,
        processes=processes,
        wiring=wiring,
        observer=_Received(on_progress),
        stop=stop,
        # Each process counted up to its share of the limit: the note names the one given.
        done=lambda result, statuses: replace(result, limit=scan.limit),
    )


class _Received(RunObserver[Any]):
    """Hands the children's messages received so far to ``on_progress``."""

    def __init__(self, on_progress: Callable[[int], None] | None) -> None:
        self._on_progress = on_progress

    def on_progress(self, result: Any) -> None:
        if self._on_progress is not None:
            self._on_progress(result)


def _inspect_merger(
    depth: int, hidden: int, started: float, stop: threading.Event
) -> Callable[[Sequence[Child], Sequence[ChildStatus], str | None], InspectResult]:
    """The inspect the children's groups merge into; a dead child makes it an error."""

    def merge(
        children: Sequence[Child], statuses: Sequence[ChildStatus], run_id: str | None
    ) -> InspectResult:
        dead = [s for s in statuses if s.died]
        if dead:
            raise RedriveError(
                f"{dead[0].describe()}: the inspect is incomplete (what it counted is lost); "
                "run it again"
            )
        parts = [c.result for c in children if isinstance(c.result, InspectResult)]
        merged: InspectResult = merge_inspect_results(
            parts, depth_before=depth, hidden_before=hidden, seconds=time.monotonic() - started
        )
        merged.interrupted = merged.interrupted or stop.is_set()
        return merged

    return merge
