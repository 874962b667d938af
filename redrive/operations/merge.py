"""One result from the results of a ``--processes N`` run's children: counts summed, listed
messages joined (at most MAX_LISTED each, as one process lists), filter misses from the
sightings of all of them (a ``--task`` missed only when no child saw it)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from redrive.operations.move import MoveResult, TaskCounts
from redrive.operations.move.repair_step import RepairReport
from redrive.operations.purge.engine import PurgeResult
from redrive.runs.listed import joined
from redrive.selection import Selection, Sightings


def merge_sightings(selection: Selection, parts: Sequence[Sightings | None]) -> Sightings | None:
    """The children's sightings as one scan's (None when the selection keeps none)."""
    known = [p for p in parts if p is not None]
    if not known:
        return None
    merged = Sightings(selection)
    for part in known:
        # Each child counted at most MAX_SEEN_TASKS names: N children's union stays bounded.
        merged.tasks.update(part.tasks)
        merged.uncounted_hits.update(part.uncounted_hits)
        merged.uncounted += part.uncounted
        merged.ids_seen |= part.ids_seen
    return merged


def merge_task_counts(parts: Sequence[TaskCounts]) -> TaskCounts:
    merged = TaskCounts()
    for part in parts:
        merged.matched += part.matched
        merged.moved += part.moved
        merged.failed += part.failed
        merged.duplicates += part.duplicates
        merged.skipped.update(part.skipped)
        merged.targets.update(part.targets)
        merged.rerouted.update(part.rerouted)
    return merged


def merge_move_results(
    template: MoveResult, parts: Sequence[MoveResult], sightings: Sightings | None
) -> MoveResult:
    """``parts`` as one result, with the run's own identity (``template``: its run id,
    target, ledger)."""
    merged = replace(
        template,
        skipped=Counter(),
        tasks={},
        in_doubt_messages=[],
        failed_messages=[],
        ambiguous_messages=[],
        no_target_candidates=list(template.no_target_candidates),
        stopped_leases={},
        live_runs=[],
    )
    _merge_common(merged, parts, sightings)
    for part in parts:
        merged.moved += part.moved
        merged.in_doubt += part.in_doubt
        merged.died_in_doubt += part.died_in_doubt
        merged.own_in_doubt += part.own_in_doubt
        merged.stopped_leases.update(part.stopped_leases)
        merged.live_runs += [r for r in part.live_runs if r not in merged.live_runs]
        merged.duplicates += part.duplicates
        merged.skipped.update(part.skipped)
        merged.throttled += part.throttled
        merged.stopped_by_returns = merged.stopped_by_returns or part.stopped_by_returns
        merged.dlq_grew_by = max(merged.dlq_grew_by, part.dlq_grew_by)
        if merged.no_target_reason is None and part.no_target_reason is not None:
            merged.no_target_reason = part.no_target_reason
            merged.no_target_candidates = list(part.no_target_candidates)
            merged.no_target_missing = part.no_target_missing
            merged.no_target_by_route = part.no_target_by_route
    repairs = [part.repair for part in parts if part.repair is not None]
    if repairs:
        merged.repair = RepairReport(list(repairs[0].edits))
        archives = list(dict.fromkeys(r.archive for r in repairs if r.archive))
        # --processes: each process archives beside the run's path; the first names them.
        merged.repair.archive = ", ".join(archives) or None
        for report in repairs:
            merged.repair.merge(report)
    names = sorted({name for part in parts for name in part.tasks})
    merged.tasks = {
        name: merge_task_counts([p.tasks[name] for p in parts if name in p.tasks]) for name in names
    }
    merged.in_doubt_messages = joined([p.in_doubt_messages for p in parts])
    merged.failed_messages = joined([p.failed_messages for p in parts])
    merged.ambiguous_messages = joined([p.ambiguous_messages for p in parts])
    return merged


def _merge_common(
    merged: MoveResult | PurgeResult,
    parts: Sequence[MoveResult | PurgeResult],
    sightings: Sightings | None,
) -> None:
    """What a move's and a purge's results merge alike: their common counts, SQS's depth
    (each child read it as it started: the largest), what SQS still hid, the filters' misses."""
    for part in parts:
        merged.scanned += part.scanned
        merged.matched += part.matched
        merged.failed += part.failed
        merged.redelivered += part.redelivered
        merged.interrupted = merged.interrupted or part.interrupted
        merged.error = merged.error or part.error
    merged.depth_before = max((p.depth_before or 0 for p in parts), default=0) or None
    merged.misses = sightings.misses() if sightings is not None else None
    # Each child counted what SQS still hid when it ended; the last to end saw its siblings'
    # holds given back, so the smallest count is the run's.
    ended = [p.still_hidden for p in parts]
    merged.still_hidden = min(ended) if ended else 0
    if isinstance(merged, MoveResult):
        untils = [p.hidden_until for p in parts if isinstance(p, MoveResult) and p.hidden_until]
        merged.hidden_until = max(untils) if untils and merged.still_hidden else None


def merge_purge_results(
    template: PurgeResult, parts: Sequence[PurgeResult], sightings: Sightings | None
) -> PurgeResult:
    merged = replace(template, by_task=Counter())
    _merge_common(merged, parts, sightings)
    for part in parts:
        merged.archived += part.archived
        merged.purged += part.purged
        merged.changed_since_plan += part.changed_since_plan
        merged.by_task.update(part.by_task)
    return merged
