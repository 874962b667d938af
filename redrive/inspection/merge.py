"""One inspect from the scans of its ``--processes`` processes: their groups merged, each
group's counts, samples and enqueue times."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from redrive.celery.results import ResultCounts
from redrive.inspection.groups import SAMPLES_PER_GROUP, TaskGroup, is_task_name
from redrive.inspection.scan import InspectResult
from redrive.inspection.timeline import BUCKET_LADDER, KEPT_BUCKETS, SentTimes, fit_timelines
from redrive.runs.listed import joined


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
    merged.sample_message_ids = joined([p.sample_message_ids for p in parts], SAMPLES_PER_GROUP)
    merged.sample_task_ids = joined([p.sample_task_ids for p in parts], SAMPLES_PER_GROUP)
    merged.sample_args = joined([p.sample_args for p in parts], SAMPLES_PER_GROUP)
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
