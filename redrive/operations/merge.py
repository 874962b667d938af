"""One result from the results of a ``--processes N`` run's children: counts summed, listed
messages joined (at most MAX_LISTED each, as one process lists), filter misses from the
sightings of all of them (a ``--task`` missed only when no child saw it)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from redrive.operations.move import MAX_LISTED, Listed, MoveResult, TaskCounts
from redrive.operations.purge import PurgeResult
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


def _joined(lists: Sequence[list[Listed]]) -> list[Listed]:
    out: list[Listed] = []
    for listing in lists:
        out.extend(listing[: MAX_LISTED - len(out)])
    return out


def merge_move_results(
    template: MoveResult, parts: Sequence[MoveResult], sightings: Sightings | None
) -> MoveResult:
    """``parts`` as one result, with the run's own identity (``template``: its run id,
    target, ledger, and SQS's depth at its start)."""
    merged = replace(
        template,
        skipped=Counter(),
        tasks={},
        in_doubt_messages=[],
        failed_messages=[],
        ambiguous_messages=[],
        no_target_candidates=list(template.no_target_candidates),
    )
    for part in parts:
        merged.scanned += part.scanned
        merged.matched += part.matched
        merged.moved += part.moved
        merged.failed += part.failed
        merged.in_doubt += part.in_doubt
        merged.duplicates += part.duplicates
        merged.skipped.update(part.skipped)
        merged.throttled += part.throttled
        merged.redelivered += part.redelivered
        merged.interrupted = merged.interrupted or part.interrupted
        if merged.error is None:
            merged.error = part.error
        if merged.no_target_reason is None and part.no_target_reason is not None:
            merged.no_target_reason = part.no_target_reason
            merged.no_target_candidates = list(part.no_target_candidates)
    names = sorted({name for part in parts for name in part.tasks})
    merged.tasks = {
        name: merge_task_counts([p.tasks[name] for p in parts if name in p.tasks]) for name in names
    }
    merged.in_doubt_messages = _joined([p.in_doubt_messages for p in parts])
    merged.failed_messages = _joined([p.failed_messages for p in parts])
    merged.ambiguous_messages = _joined([p.ambiguous_messages for p in parts])
    _merge_hidden(merged, parts)
    merged.misses = sightings.misses() if sightings is not None else None
    return merged


def _merge_hidden(
    merged: MoveResult | PurgeResult, parts: Sequence[MoveResult | PurgeResult]
) -> None:
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
    for part in parts:
        merged.scanned += part.scanned
        merged.matched += part.matched
        merged.archived += part.archived
        merged.purged += part.purged
        merged.failed += part.failed
        merged.by_task.update(part.by_task)
        merged.redelivered += part.redelivered
        merged.interrupted = merged.interrupted or part.interrupted
    _merge_hidden(merged, parts)
    merged.misses = sightings.misses() if sightings is not None else None
    return merged
