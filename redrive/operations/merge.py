"""One result from the results of a ``--processes N`` run's children: counts summed, listed
messages joined (at most MAX_LISTED each, as one process lists), filter misses from the
sightings of all of them (a ``--task`` missed only when no child saw it)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar

from redrive.celery.results import ResultCounts
from redrive.inspection.groups import SAMPLES_PER_GROUP, TaskGroup, is_task_name
from redrive.inspection.scan import InspectResult
from redrive.inspection.timeline import BUCKET_LADDER, KEPT_BUCKETS, SentTimes, fit_timelines
from redrive.operations.move import MAX_LISTED, MoveResult, TaskCounts
from redrive.operations.move.repair_step import RepairReport
from redrive.operations.purge import PurgeResult
from redrive.selection import Selection, Sightings

T = TypeVar("T")


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


def _joined(lists: Sequence[list[T]], cap: int = MAX_LISTED) -> list[T]:
    """The lists one after another, the first ``cap`` items (as one scan keeps them)."""
    out: list[T] = []
    for listing in lists:
        out.extend(listing[: cap - len(out)])
    return out


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
    merged.in_doubt_messages = _joined([p.in_doubt_messages for p in parts])
    merged.failed_messages = _joined([p.failed_messages for p in parts])
    merged.ambiguous_messages = _joined([p.ambiguous_messages for p in parts])
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


# -- inspect --------------------------------------------------------------------------------


def merge_sent_times(parts: Sequence[SentTimes]) -> SentTimes:
    """One group's enqueue times from its parts': buckets at the coarsest width of any."""
    width = max((p.width for p in parts), default=BUCKET_LADDER[0])
    merged = SentTimes(width=width)
    for part in parts:
        coarse = SentTimes(part.width, Counter(part.counts), part.first, part.last)
        coarse.coarsen(width)
        merged.counts.update(coarse.counts)
        for when in (part.first, part.last):
            if when is not None:
                merged.first = when if merged.first is None else min(merged.first, when)
                merged.last = when if merged.last is None else max(merged.last, when)
    while len(merged.counts) > KEPT_BUCKETS and merged.width < BUCKET_LADDER[-1]:
        merged.coarsen(BUCKET_LADDER[BUCKET_LADDER.index(merged.width) + 1])
    return merged


def _group_key(group: TaskGroup) -> tuple[str, str, str | None]:
    plain = is_task_name(group.value)
    return (group.task, "" if plain else repr(group.value), group.exception)


def merge_task_groups(parts: Sequence[TaskGroup]) -> TaskGroup:
    """One group (a task, or a --group-by value) from the same group of several scans."""
    first = parts[0]
    merged = TaskGroup(
        task=first.task,
        value=first.value if not is_task_name(first.value) else TaskGroup(task="").value,
        exception=first.exception,
        unregistered=first.unregistered,
        routes_to=first.routes_to,
    )
    merged.results = ResultCounts() if any(p.results is not None for p in parts) else None
    for part in parts:
        merged.count += part.count
        for when in (part.oldest, part.newest):
            if when is not None:
                merged.oldest = when if merged.oldest is None else min(merged.oldest, when)
                merged.newest = when if merged.newest is None else max(merged.newest, when)
        merged.max_receive_count = max(merged.max_receive_count, part.max_receive_count)
        merged.max_consumer_receives = max(merged.max_consumer_receives, part.max_consumer_receives)
        merged.max_redrive_receives = max(merged.max_redrive_receives, part.max_redrive_receives)
        merged.expired += part.expired
        merged.redriven += part.redriven
        merged.poison += part.poison
        merged.leaving_within_24h += part.leaving_within_24h
        merged.protocols.update(part.protocols)
        merged.notes.update(part.notes)
        merged.death_reasons.update(part.death_reasons)
        merged.died_in.update(part.died_in)
        for when in (part.died_oldest, part.died_newest):
            if when is not None:
                merged.died_oldest = min(merged.died_oldest or when, when)
                merged.died_newest = max(merged.died_newest or when, when)
        if merged.results is not None and part.results is not None:
            merged.results.states.update(part.results.states)
            merged.results.exceptions.update(part.results.exceptions)
            merged.results.worker_died += part.results.worker_died
            for name, sample in part.results.samples.items():
                if len(merged.results.samples) < 10:
                    merged.results.samples.setdefault(name, sample)
    merged.sample_message_ids = _joined([p.sample_message_ids for p in parts], SAMPLES_PER_GROUP)
    merged.sample_task_ids = _joined([p.sample_task_ids for p in parts], SAMPLES_PER_GROUP)
    merged.sample_args = _joined([p.sample_args for p in parts], SAMPLES_PER_GROUP)
    merged.sent_times = merge_sent_times([p.sent_times for p in parts])
    return merged


def merge_inspect_results(
    parts: Sequence[InspectResult], *, depth_before: int, hidden_before: int, seconds: float
) -> InspectResult:
    """One inspect from its processes' scans (SQS's counts: the parent's, read before any
    of them received)."""
    first = parts[0]
    by_key: dict[tuple[str, str, str | None], list[TaskGroup]] = {}
    for part in parts:
        for group in part.groups:
            by_key.setdefault(_group_key(group), []).append(group)
    groups = sorted(
        (merge_task_groups(same) for same in by_key.values()), key=lambda g: (-g.count, g.task)
    )
    for group, timeline in zip(groups, fit_timelines([g.sent_times for g in groups]), strict=True):
        group.timeline = timeline
    problem = next((p.result_backend_problem for p in parts if p.result_backend_problem), None)
    if problem is not None:
        # Counts of part of the scan would read as the whole: none at all (as one scan does).
        for group in groups:
            group.results = None
    oldest = [p.oldest for p in parts if p.oldest is not None]
    return replace(
        first,
        total=sum(p.total for p in parts),
        groups=groups,
        oldest=min(oldest) if oldest else None,
        seconds=seconds,
        depth_before=depth_before,
        hidden_before=hidden_before,
        partial=any(p.partial for p in parts),
        interrupted=any(p.interrupted for p in parts),
        seen_again=sum(p.seen_again for p in parts),
        released=sum(p.released for p in parts),
        receive_log_problem=next(
            (p.receive_log_problem for p in parts if p.receive_log_problem), None
        ),
        scanned=sum(p.scanned_total for p in parts),
        result_backend_problem=problem,
    )
