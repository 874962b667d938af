"""``purge`` and ``archive`` (and ``apply`` of a purge plan) in ``--processes``: each child's
job, archiving to its own file, and how the parent merges them (redrive.runs.processes
runs them)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from redrive.archive.storage import absolute_location, archive_part
from redrive.broker.base import DlqTarget
from redrive.ledger import Ledger
from redrive.operations.merge import (
    merge_purge_results,
    merge_sightings,
)
from redrive.operations.purge.engine import (
    PurgeOptions,
    PurgeResult,
    archive_location,
    check_archive_path,
    run_purge,
)
from redrive.runs.observer import NULL_OBSERVER, RunObserver
from redrive.runs.processes import (
    Child,
    ChildRun,
    ChildStatus,
    Job,
    ProcessesResult,
    Spread,
    Wiring,
    check_picklable,
    check_processes,
    run_spread,
)
from redrive.selection import Sightings

# -- purge and archive --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PurgeJob:
    target: DlqTarget
    options: PurgeOptions
    command: str
    record: Mapping[str, Any] | None
    run_id: str | None

    def run(self, child: ChildRun) -> tuple[PurgeResult, Sightings | None]:
        seen: list[Sightings | None] = []
        with child.ledger() as ledger, child.receive_log() as receive_log:
            result = run_purge(
                self.target,
                self.options,
                broker_factory=child.broker,
                ledger=ledger,
                command=self.command,
                record=self.record,
                s3_client_factory=lambda: child.aws.client("s3"),
                observer=child.observer,
                stop=child.stop,
                receive_log=receive_log,
                run_id=self.run_id,
                shares=child.shares,
                sightings=seen.append,
            )
        return result, seen[0] if seen else None


def _purge_progress(result: PurgeResult) -> tuple[int, ...]:
    return (
        result.scanned,
        result.matched,
        result.archived,
        result.purged,
        result.depth_before or 0,
    )


def purge_in_processes(
    target: DlqTarget,
    options: PurgeOptions,
    *,
    processes: int,
    wiring: Wiring,
    ledger: Ledger | None = None,
    command: str = "purge",
    record: Mapping[str, Any] | None = None,
    observer: RunObserver[PurgeResult] = NULL_OBSERVER,
    stop: threading.Event | None = None,
) -> ProcessesResult[PurgeResult]:
    """``purge`` or ``archive`` (or ``apply`` of a purge plan) in ``processes`` processes,
    each archiving to its own file (:func:`archive_part`) before it deletes."""
    check_processes(processes)
    check_picklable(options, "these options")
    stop = stop or threading.Event()
    where = archive_location(target, options)
    if where and options.archive and "://" not in where:
        # Each process's archive must be writable before any of them deletes anything: one
        # refused later would leave the run half done. The name given must be free too: it
        # stands for the parts (replay takes it), not for an earlier archive of that name.
        check_archive_path(where)
        for number in range(1, processes + 1):
            check_archive_path(archive_part(where, number))
    run = _PurgeRun(target, options, stop, where)

    def job(number: int, run_id: str | None, parent: str | None) -> Job:
        mine = replace(options, archive_to=archive_part(where, number) if where else None)
        info = {**(record or {}), "parent": parent, "process": number}
        # An archive without a ledger still names its run in its records: the child's own.
        return PurgeJob(target, mine, command, info, run_id)

    spread = Spread(
        ledger=ledger,
        execute=options.execute,
        command=command,
        info={**(record or {}), "archive": absolute_location(where), "dlq": target.dlq.url},
        lease=options.lease,
        limit=options.selection.limit,
        rate=None,
        job=job,
        progress_of=_purge_progress,
        progress=run.progress,
        merge=run.merge,
        counts=PurgeResult.run_counts,
        claims=False,
    )
    return run_spread(
        spread,
        processes=processes,
        wiring=wiring,
        observer=observer,
        stop=stop,
        done=lambda result, statuses: ProcessesResult(
            result, processes, statuses, archives=run.archives
        ),
    )


@dataclass(slots=True)
class _PurgeRun:
    """A purge or archive as its parent sees it: its progress and its merged result."""

    target: DlqTarget
    options: PurgeOptions
    stop: threading.Event
    where: str | None
    """The run's archive location (each process's is beside it: :func:`archive_part`)."""
    started: float = field(default_factory=time.monotonic)
    archives: list[str] = field(default_factory=list)
    """The children's archives, as they reported them (none for one that archived none)."""

    def blank(self, run_id: str | None, archive: str | None = None) -> PurgeResult:
        return PurgeResult(
            dry_run=not self.options.execute,
            target=self.target.label,
            dlq=self.target.dlq.name,
            archive=archive,
            command="purge" if self.options.delete else "archive",
            run_id=run_id,
        )

    def progress(self, snapshots: Sequence[tuple[int, ...]], run_id: str | None) -> PurgeResult:
        shown = self.blank(run_id)
        shown.scanned = sum(s[0] for s in snapshots)
        shown.matched = sum(s[1] for s in snapshots)
        shown.archived = sum(s[2] for s in snapshots)
        shown.purged = sum(s[3] for s in snapshots)
        shown.depth_before = max((s[4] for s in snapshots), default=None) or None
        return shown

    def merge(
        self, children: Sequence[Child], statuses: Sequence[ChildStatus], run_id: str | None
    ) -> PurgeResult:
        parts = [c.result for c in children if isinstance(c.result, PurgeResult)]
        sightings = merge_sightings(self.options.selection, [c.sightings for c in children])
        archives = [p.archive for p in parts if p.archive]
        result = merge_purge_results(self.blank(run_id, None), parts, sightings)
        for child, status in zip(children, statuses, strict=True):
            if isinstance(child.result, PurgeResult):
                continue
            left = archive_part(self.where, status.number) if self.where else None
            if left and ("://" in left or Path(left).expanduser().exists()):
                # It ended before it could say (died, or aborted by a second Ctrl-C): what
                # it archived is there all the same.
                archives.append(left)
            if child.progress:
                # What it archived and deleted before it died is in its archive and gone
                # from the DLQ: counted as it last reported.
                scanned, matched, archived, purged, _ = child.progress
                result.scanned += scanned
                result.matched += matched
                result.archived += archived
                result.purged += purged
        self.archives[:] = archives  # set, not added: the run's end may merge again
        if archives and self.where:
            # The name given stands for every part (replay takes it); each is named too.
            result.archive, result.parts = self.where, list(archives)
        result.seconds = time.monotonic() - self.started
        result.interrupted = self.stop.is_set()
        return result
