"""``replay`` in ``--processes``: the parent checks the archive whole, then each child replays
its share, split by task id (redrive.runs.processes runs them)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from redrive.archive import ArchiveReader, ArchiveRecord, archive_label
from redrive.broker.base import QueueRef
from redrive.dlq.scan import digest
from redrive.errors import RedriveError, UsageProblem
from redrive.ledger import Ledger
from redrive.messages import decode
from redrive.operations.move import MoveEngine, MoveOptions, MoveResult
from redrive.operations.move.processes import (
    MoveRun,
    child_record,
    crossing_options,
    move_spread,
    run_to_the_end,
)
from redrive.operations.move.repair_step import RepairStep
from redrive.operations.replay.engine import (
    ArchiveSource,
    ReplayResult,
    archive_target,
    check_whole_archive,
    stopped_replay,
)
from redrive.runs.lifecycle import RunRecord
from redrive.runs.observer import NULL_OBSERVER, RunObserver
from redrive.runs.processes import (
    Child,
    ChildRun,
    Job,
    ProcessesResult,
    Wiring,
    check_processes,
    run_spread,
)
from redrive.selection import Sightings

# -- replay ------------------------------------------------------------------------------------


def share_of(record: ArchiveRecord, processes: int) -> int:
    """Which process (0-based) replays a record: by its task id (the body's, else its
    MessageId), so that every copy of a task is in one process's share and is settled
    there as one process settles it (a duplicate, never a busy claim of a sibling)."""
    task_id = decode(record.body).task_id
    return digest(task_id or record.message_id) % processes


@dataclass(frozen=True, slots=True)
class ReplayJob:
    source: str
    options: MoveOptions
    record: RunRecord
    allow_partial: bool
    number: int
    processes: int

    def run(self, child: ChildRun) -> tuple[ReplayResult, Sightings | None]:
        options = child.rebuilt(self.options)
        reader = ArchiveReader(
            self.source,
            s3_client_factory=lambda: child.aws.client("s3"),
            on_problem=lambda problem: None,  # the parent's check reported them
            skip_damage=self.allow_partial,
        )
        mine = (r for r in reader if share_of(r, self.processes) == self.number - 1)
        archive = ArchiveSource(mine, child.stop)
        with child.ledger() as ledger:
            engine = MoveEngine(
                archive_target(self.source),
                ledger,
                options,
                broker_factory=child.broker,
                observer=child.observer,
                stop=child.stop,
                source=archive,
                record=self.record,
                shares=child.shares,
                repair=RepairStep(options.repair) if options.repair is not None else None,
            )
            try:
                result = run_to_the_end(engine)
            except RedriveError as exc:
                if isinstance(exc.partial, MoveResult):
                    exc.partial = ReplayResult(exc.partial, archive.damage or reader.report())
                raise
        return ReplayResult(result, archive.damage or reader.report()), engine.sightings


def replay_in_processes(
    source: str,
    to: QueueRef | None,
    ledger: Ledger | None,
    options: MoveOptions,
    *,
    processes: int,
    wiring: Wiring,
    s3_client_factory: Callable[[], Any] | None = None,
    observer: RunObserver[MoveResult] = NULL_OBSERVER,
    stop: threading.Event | None = None,
    record: RunRecord | None = None,
    allow_partial: bool = False,
) -> ProcessesResult[ReplayResult]:
    """``replay`` in ``processes`` processes: the parent checks the archive whole (as one
    process does, before anything is sent), then each child replays its share of it
    (:func:`share_of`)."""
    check_processes(processes)
    if options.execute and ledger is None:
        raise UsageProblem("an executed replay needs a ledger")
    stop = stop or threading.Event()
    record = record or RunRecord("replay")
    check = check_whole_archive(source, s3_client_factory, observer, stop, allow_partial)
    if check is None:
        return ProcessesResult(stopped_replay(source, options), processes, [])
    options = replace(options, to=to)
    crossing = crossing_options(options, wiring)

    def job(number: int, run_id: str | None, parent: str | None) -> Job:
        mine = child_record(record, number, run_id, parent)
        return ReplayJob(source, crossing, mine, allow_partial, number, processes)

    def wrap(result: MoveResult, children: Sequence[Child]) -> ReplayResult:
        found = (c.result.damage for c in children if isinstance(c.result, ReplayResult))
        return ReplayResult(result, check.damage or next((d for d in found if d), None))

    spread = move_spread(
        MoveRun(archive_target(source), ledger, options, record, stop),
        {"target": archive_label(source), "dlq": source},
        job,
        move_of=lambda result: result.move if isinstance(result, ReplayResult) else None,
        wrap=wrap,
        unwrap=lambda result: result.move,
    )
    return run_spread(
        spread,
        processes=processes,
        wiring=wiring,
        observer=observer,
        stop=stop,
        done=lambda result, statuses: ProcessesResult(result, processes, statuses),
    )
