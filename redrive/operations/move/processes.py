"""``move`` (and ``apply`` of a move plan) in ``--processes``: each child's job, and how the
parent merges their moves (redrive.runs.processes runs them)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from redrive.broker.base import DlqTarget
from redrive.errors import UsageProblem
from redrive.ledger import Ledger
from redrive.operations.merge import (
    merge_move_results,
    merge_sightings,
)
from redrive.operations.move import MAX_LISTED, MoveEngine, MoveOptions, MoveResult
from redrive.operations.move.repair_step import repair_step
from redrive.operations.verdict import IN_DOUBT, UNRECORDED, UNRECORDED_ROW
from redrive.runs.lifecycle import RunRecord
from redrive.runs.observer import NULL_OBSERVER, RunObserver
from redrive.runs.processes import (
    Child,
    ChildRun,
    ChildStatus,
    Job,
    Left,
    ProcessesResult,
    Spread,
    Wiring,
    check_picklable,
    check_processes,
    left_by,
    run_spread,
)
from redrive.selection import Sightings

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class MoveJob:
    target: DlqTarget
    options: MoveOptions
    record: RunRecord

    def run(self, child: ChildRun) -> tuple[MoveResult, Sightings | None]:
        options = child.rebuilt(self.options)
        number = self.record.info.get("process")
        with (
            child.ledger() as ledger,
            child.receive_log() as receive_log,
            repair_step(
                options.repair,
                execute=options.execute,
                s3_client_factory=lambda: child.aws.client("s3"),
                part=number if isinstance(number, int) else None,
            ) as repair,
        ):
            engine = MoveEngine(
                self.target,
                ledger,
                options,
                broker_factory=child.broker,
                observer=child.observer,
                stop=child.stop,
                record=self.record,
                receive_log=receive_log,
                shares=child.shares,
                repair=repair,
            )
            return run_to_the_end(engine), engine.sightings


def run_to_the_end(engine: MoveEngine) -> MoveResult:
    """The engine's result, however its run ends: on a second Ctrl-C (the parent's
    ``abort``) the engine gives back what it holds and ends its run, and what it did so far
    is its parent's to count and record (issue 22), as one process records it."""
    try:
        return engine.run()
    except KeyboardInterrupt:
        engine.result.interrupted = True
        return engine.result


# -- move ------------------------------------------------------------------------------------


def _move_progress(result: MoveResult) -> tuple[int, ...]:
    return (result.scanned, result.matched, result.moved, result.depth_before or 0)


def move_in_processes(
    target: DlqTarget,
    ledger: Ledger | None,
    options: MoveOptions,
    *,
    processes: int,
    wiring: Wiring,
    observer: RunObserver[MoveResult] = NULL_OBSERVER,
    stop: threading.Event | None = None,
    record: RunRecord | None = None,
) -> ProcessesResult[MoveResult]:
    """``move`` (or ``apply`` of a move plan) in ``processes`` processes (see the module)."""
    check_processes(processes)
    if options.execute and ledger is None:
        raise UsageProblem("an executed move needs a ledger")
    stop = stop or threading.Event()
    record = record or RunRecord("move")
    crossing = crossing_options(options, wiring)

    def job(number: int, run_id: str | None, parent: str | None) -> Job:
        return MoveJob(target, crossing, child_record(record, number, run_id, parent))

    spread = move_spread(
        MoveRun(target, ledger, options, record, stop),
        {"target": target.label, "dlq": target.dlq.url},
        job,
        move_of=lambda result: result if isinstance(result, MoveResult) else None,
        wrap=lambda result, children: result,
        unwrap=lambda result: result,
    )
    return run_spread(
        spread,
        processes=processes,
        wiring=wiring,
        observer=observer,
        stop=stop,
        done=lambda result, statuses: ProcessesResult(result, processes, statuses),
    )


def child_record(
    record: RunRecord, number: int, run_id: str | None, parent: str | None
) -> RunRecord:
    """A child's own record of a move-like run: the parent's, naming the parent and its
    number."""
    return RunRecord(record.command, {**record.info, "parent": parent, "process": number}, run_id)


def crossing_options(options: MoveOptions, wiring: Wiring) -> MoveOptions:
    """The options as they cross to the children: the Celery app and its result backend do
    not (each child opens its own, Wiring.rebuild); the parent's serve the checks it made."""
    crossing = replace(options, celery=None, results=None) if wiring.rebuild else options
    check_picklable(crossing, "these options")
    return crossing


@dataclass(frozen=True, slots=True)
class MoveRun:
    """A move-like run (move, apply of a move plan, replay) as its parent sees it."""

    target: DlqTarget
    ledger: Ledger | None
    options: MoveOptions
    record: RunRecord
    stop: threading.Event

    def blank(self, run_id: str | None) -> MoveResult:
        return MoveResult(
            dry_run=not self.options.execute,
            target=self.target.label,
            dlq=self.target.dlq.name,
            run_id=run_id,
            ledger=self.ledger.location if self.ledger is not None else None,
        )

    def progress(self, snapshots: Sequence[tuple[int, ...]], run_id: str | None) -> MoveResult:
        shown = self.blank(run_id)
        shown.scanned = sum(s[0] for s in snapshots)
        shown.matched = sum(s[1] for s in snapshots)
        shown.moved = sum(s[2] for s in snapshots)
        shown.depth_before = max((s[3] for s in snapshots), default=None) or None
        return shown


def move_spread(
    run: MoveRun,
    info: Mapping[str, Any],
    job: Callable[[int, str | None, str | None], Job],
    *,
    move_of: Callable[[Any], MoveResult | None],
    wrap: Callable[[MoveResult, Sequence[Child]], R],
    unwrap: Callable[[R], MoveResult],
) -> Spread[R]:
    """How a move-like run goes in processes: ``move_of`` finds the engine's result in a
    child's, ``wrap`` makes the command's result of the merged one (``unwrap``: back)."""
    started = time.monotonic()
    options = run.options

    def merge(children: Sequence[Child], statuses: Sequence[ChildStatus], run_id: str | None) -> R:
        parts = [move_of(c.result) for c in children]
        result = _merged_moves(run.blank(run_id), children, parts, statuses, run.ledger, options)
        result.seconds = time.monotonic() - started
        # Children stop when told: on the operator's Ctrl-C (interrupted), or because a
        # sibling died (then the run needs attention, exit 3, not 130).
        result.interrupted = run.stop.is_set()
        return wrap(result, children)

    return Spread(
        ledger=run.ledger,
        execute=options.execute,
        command=run.record.command,
        info={**info, "filters": options.selection.describe(), **run.record.info},
        lease=options.lease,
        limit=options.selection.limit,
        rate=options.rate,
        job=job,
        progress_of=_move_progress,
        progress=run.progress,
        merge=merge,
        counts=lambda result: unwrap(result).run_counts(),
    )


def _merged_moves(
    template: MoveResult,
    children: Sequence[Child],
    results: Sequence[MoveResult | None],
    statuses: Sequence[ChildStatus],
    ledger: Ledger | None,
    options: MoveOptions,
) -> MoveResult:
    parts = [r for r in results if r is not None]
    sightings = merge_sightings(options.selection, [c.sightings for c in children])
    result = merge_move_results(template, parts, sightings)
    for child, part, status in zip(children, results, statuses, strict=True):
        if part is None:
            _add_left(result, child.progress, status, left_by(ledger, status))
    result.cut_short = any(s.died for s in statuses)
    return result


def _add_left(
    result: MoveResult, progress: tuple[int, ...], status: ChildStatus, left: Left
) -> None:
    """A child that ended without its result (it died), counted from the ledger: its sends
    (moved, per task), its claims (in doubt, listed); matched and scanned at least that, and
    at least what it last reported."""
    for entry in left.sent:
        counts = result.task(entry.task)
        counts.matched += 1
        counts.moved += 1
        counts.targets[entry.target.rsplit("/", 1)[-1]] += 1
    result.moved += status.moved
    result.in_doubt += status.in_doubt
    if status.died:
        result.died_in_doubt += status.in_doubt
    scanned, matched = progress[:2] if progress else (0, 0)
    known = status.moved + status.in_doubt
    matched = max(matched, known)
    result.matched += matched
    result.scanned += max(scanned, matched)
    if matched > known:
        # What it matched and the ledger holds nothing of (its last report counted them):
        # skipped, copies, or not reached yet; none sent (a send is claimed first). Counted
        # under a row of its own, so that the rows add up to the totals.
        row = result.task(UNRECORDED_ROW)
        row.matched += matched - known
        row.skipped[UNRECORDED] += matched - known
        result.skipped[UNRECORDED] += matched - known
    for item in left.in_doubt:
        result.skipped[IN_DOUBT] += 1
        result.task(item.task).matched += 1
        result.task(item.task).skipped[IN_DOUBT] += 1
        if len(result.in_doubt_messages) < MAX_LISTED:
            result.in_doubt_messages.append(item)
