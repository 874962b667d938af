"""Inspect: scan a DLQ without disturbing it and group its messages by Celery task (or by a
``--group-by`` expression), counting only the messages a ``--where`` selects."""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from redrive import attributes
from redrive.broker.base import Broker, Delivery, DlqTarget
from redrive.celery.results import (
    BatchReader,
    LookupsAhead,
    ResultCounts,
    ResultLookup,
    TaskRecord,
    exception_group,
)
from redrive.dlq.receive_log import ReceiveLog
from redrive.dlq.scan import DlqScan, run_pipelines
from redrive.durations import iso_utc
from redrive.message_record import RecordBuilder, TaskOutcome
from redrive.message_record import ResultLookup as RecordLookup
from redrive.messages import TaskInfo, decode
from redrive.reporting.timeline import SentTimes, Timeline, fit_timelines
from redrive.where import Expression, Where, group_value

SAMPLES_PER_GROUP = 3
# How much of a body that is not a Celery task --show-args shows instead of its arguments.
SHOWN_BODY_CHARS = 300
DAY = 86_400
DEFAULT_MAX_REDRIVES = 3
DEFAULT_LEASE = 30
# A group's value in JSON when the group is a task name (the usual case).
_TASK_NAME: Any = object()


def is_task_name(value: Any) -> bool:
    """Whether a group's ``value`` says it is a task's group (not a --group-by value). The
    marker is this process's own object: one unpickled from another process (``--processes``)
    is a bare object too, and means the same."""
    return value is _TASK_NAME or type(value) is object


@dataclass(frozen=True, slots=True)
class GroupKey:
    """Which group a message counts in: ``identity`` tells groups apart, ``label`` is what
    a table shows in the task column, ``value`` what JSON shows (the task name, or a
    --group-by expression's value: a string, a number, null...)."""

    identity: str
    label: str
    value: Any = _TASK_NAME

    @classmethod
    def of_task(cls, info: TaskInfo) -> GroupKey:
        return cls(info.task, info.task)

    @classmethod
    def of_value(cls, value: Any) -> GroupKey:
        identity, label = group_value(value)
        return cls(identity, label, value)


@dataclass(slots=True)
class TaskGroup:
    """Counters for one task name; never a list of every message."""

    task: str
    """The table's first column: the task name, or the --group-by value as text."""
    count: int = 0
    oldest: float | None = None
    newest: float | None = None
    max_receive_count: int = 0
    """The highest receive count the broker gave: redrive's own receives included."""
    max_consumer_receives: int = 0
    """The highest receive count without redrive's own receives: how often the queue's
    consumers (the workers, and any reader that is not redrive) received a message."""
    max_redrive_receives: int = 0
    """The most times redrive itself received one message of the group (inspect, report,
    dry runs, archive), as far as its receive log in the state directory knows."""
    expired: int = 0
    redriven: int = 0
    poison: int = 0
    leaving_within_24h: int = 0
    sample_task_ids: list[str] = field(default_factory=list)
    sample_message_ids: list[str] = field(default_factory=list)
    sample_args: list[dict[str, str | int | None]] = field(default_factory=list)
    protocols: Counter[str] = field(default_factory=Counter)
    notes: Counter[str] = field(default_factory=Counter)
    value: Any = _TASK_NAME
    """The --group-by value (JSON's "task"); the task name when grouped by task."""
    sent_times: SentTimes = field(default_factory=SentTimes)
    timeline: Timeline | None = None
    """When the group's messages were enqueued, over the DLQ's span (set by sorted_groups)."""
    unregistered: int | None = None
    """Messages of a task the Celery app does not register (None: no app to ask)."""
    routes_to: str | None = None
    """The queue the task routes to now, when that is not the DLQ's source (redrive.celery)."""
    results: ResultCounts | None = None
    """What Celery's result backend says of the group's task ids (--result-backend)."""
    exception: str | None = None
    """The exception type the group holds, with --group-by exception."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "task": self.task if self.value is _TASK_NAME else self.value,
            "count": self.count,
            "oldest": iso_utc(self.oldest),
            "newest": iso_utc(self.newest),
            "max_receive_count": self.max_receive_count,
            "max_consumer_receives": self.max_consumer_receives,
            "max_redrive_receives": self.max_redrive_receives,
            "expired": self.expired,
            "redriven": self.redriven,
            "poison": self.poison,
            "leaving_within_24h": self.leaving_within_24h,
            "sample_task_ids": self.sample_task_ids,
            "sample_message_ids": self.sample_message_ids,
            "protocols": dict(self.protocols),
            "timeline": self.timeline.to_json() if self.timeline is not None else None,
        }
        if self.notes:
            data["notes"] = dict(self.notes)
        if self.unregistered is not None:
            data["unregistered"] = self.unregistered
        if self.unregistered is not None or self.routes_to is not None:
            data["routes_to"] = self.routes_to
        if self.sample_args:
            data["sample_args"] = self.sample_args
        if self.results is not None:
            data.update(self.results.to_json())
        if self.exception is not None:
            data["exception"] = self.exception
        return data


@dataclass(slots=True)
class Grouping:
    """Accumulates messages into groups (by task, or by a --group-by expression), counting
    only what a --where selects; shared by live inspect and archive inspect."""

    now: float
    retention_seconds: int | None = None
    show_args: bool = False
    max_redrives: int = DEFAULT_MAX_REDRIVES
    groups: dict[str, TaskGroup] = field(default_factory=dict)
    total: int = 0
    with_results: bool = False
    """Whether records are read (--result-backend): groups then count their states."""
    group_by: str | None = None
    """``exception``: a group per task and exception type."""
    where: Where | None = None
    group_expression: Expression | None = None
    """--group-by EXPR: groups by the expression's value instead of the task name."""
    sources: tuple[str, ...] = ()
    """The DLQ's source queue names (the record's ``queue`` when SQS did not say)."""
    record_results: RecordLookup | None = None
    """What answers the record's ``state`` and ``exception`` when no batch of backend
    records is at hand (None: they are null then)."""
    scanned: int = 0
    """Messages offered, selected or not (``total`` counts the selected ones)."""
    limit: int | None = None
    """--limit: the most messages counted (with a --where, the most that match)."""
    now_utc: datetime = field(init=False)
    _records: RecordBuilder | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        # Once per scan, not once per message.
        self.now_utc = datetime.fromtimestamp(self.now, UTC)
        if self.where is not None or self.group_expression is not None:
            fields = (self.where.fields if self.where else frozenset()) | (
                self.group_expression.fields if self.group_expression else frozenset()
            )
            results = self.record_results or (self.where.results if self.where else None)
            self._records = RecordBuilder(tuple(fields), self.sources, results)

    @property
    def full(self) -> bool:
        """--limit reached: nothing more is counted (``total`` is what was selected)."""
        return self.limit is not None and self.total >= self.limit

    def offer(self, message: Delivery, info: TaskInfo) -> None:
        """One scanned message: counted in its group when the --where (if any) selects it."""
        self.count(message, info, self.place(message, info))

    def place(
        self, message: Delivery, info: TaskInfo, backend: TaskRecord | None = None
    ) -> GroupKey | None:
        """The group a message counts in; None when the --where leaves it out. Pure.
        ``backend``: the result backend's record of its task id (the record's ``state``
        and ``exception``), when inspect read one.

        The seam for other groupings: a key is any (identity, label, JSON value)."""
        builder = self._records
        if builder is None:
            return GroupKey.of_task(info)
        outcome = TaskOutcome(backend.state, backend.exception) if backend is not None else None
        record = builder.build(info, message, now=self.now, outcome=outcome)
        if self.where is not None and not self.where.holds(record):
            return None
        if self.group_expression is not None:
            return GroupKey.of_value(self.group_expression.evaluate(record))
        return GroupKey.of_task(info)

    def count(
        self,
        message: Delivery,
        info: TaskInfo,
        key: GroupKey | None,
        backend: TaskRecord | None = None,
    ) -> None:
        """Count one scanned message (in group ``key``; only as scanned when None)."""
        if key is None:
            self.scanned += 1
            return
        self.add(
            info,
            message_id=message.message_id,
            sent_at=message.enqueued_at,
            receive_count=message.receive_count,
            redrive_count=attributes.redrive_count(message.message_attributes),
            body=message.body,
            redrive_receives=message.redrive_receives,
            key=key,
            record=backend,
        )

    def add(
        self,
        info: TaskInfo,
        *,
        message_id: str,
        sent_at: float | None,
        receive_count: int,
        redrive_count: int,
        body: str | None = None,
        redrive_receives: int = 0,
        key: GroupKey | None = None,
        record: TaskRecord | None = None,
    ) -> None:
        group = self._group(key or GroupKey.of_task(info), record)
        self.total += 1
        self.scanned += 1
        group.count += 1
        if sent_at is not None:
            group.sent_times.add(sent_at)  # timeline seam: counts per bucket, per group key
            group.oldest = sent_at if group.oldest is None else min(group.oldest, sent_at)
            group.newest = sent_at if group.newest is None else max(group.newest, sent_at)
            if (
                self.retention_seconds is not None
                and sent_at + self.retention_seconds - self.now < DAY
            ):
                group.leaving_within_24h += 1
        group.max_receive_count = max(group.max_receive_count, receive_count)
        group.max_consumer_receives = max(
            group.max_consumer_receives, max(0, receive_count - redrive_receives)
        )
        group.max_redrive_receives = max(group.max_redrive_receives, redrive_receives)
        if info.is_expired(self.now_utc):
            group.expired += 1
        if redrive_count > 0:
            group.redriven += 1
        if redrive_count >= self.max_redrives:
            group.poison += 1
        group.protocols[str(info.protocol) if info.protocol else info.body_format] += 1
        if info.note:
            group.notes[info.note] += 1
        if len(group.sample_message_ids) < SAMPLES_PER_GROUP:
            group.sample_message_ids.append(message_id)
            if info.task_id:
                group.sample_task_ids.append(info.task_id)
            if self.show_args:
                group.sample_args.append(_sample(info, body))

    def _group(self, key: GroupKey, record: TaskRecord | None) -> TaskGroup:
        exception = exception_group(record) if self.group_by == "exception" else None
        identity = key.identity if exception is None else f"{key.identity}\0{exception}"
        group = self.groups.get(identity)
        if group is None:
            group = self.groups[identity] = TaskGroup(
                task=key.label, value=key.value, exception=exception
            )
            if self.with_results:
                group.results = ResultCounts()
        if group.results is not None and record is not None:
            group.results.add(record, show_args=self.show_args)
        return group

    def sorted_groups(self) -> list[TaskGroup]:
        groups = sorted(self.groups.values(), key=lambda g: (-g.count, g.task))
        # The scan is over: every group's timeline over the span of them all.
        for group, timeline in zip(
            groups, fit_timelines([g.sent_times for g in groups]), strict=True
        ):
            group.timeline = timeline
        return groups

    @property
    def oldest(self) -> float | None:
        times = [g.oldest for g in self.groups.values() if g.oldest is not None]
        return min(times) if times else None


def _sample(info: TaskInfo, body: str | None) -> dict[str, str | int | None]:
    """A task's arguments; for a body that is not a Celery task (it has none), the start of
    the body itself, which is all there is to look at."""
    sample: dict[str, str | int | None] = {"args": info.args, "kwargs": info.kwargs}
    if not info.is_celery and body is not None:
        shown = body[:SHOWN_BODY_CHARS]
        sample["body"] = shown if len(shown) == len(body) else shown + "..."
        sample["body_chars"] = len(body)
    return sample


@dataclass(slots=True)
class InspectResult:
    label: str
    dlq: str
    dlq_url: str
    sources: list[str]
    total: int
    groups: list[TaskGroup]
    oldest: float | None
    scanned_at: float
    seconds: float
    depth_before: int
    hidden_before: int
    partial: bool
    """True when --limit stopped the scan before the queue was covered."""
    limit: int | None = None
    """The --limit given (with a --where, of matches)."""
    interrupted: bool = False
    seen_again: int = 0
    released: int = 0
    fifo: bool = False
    receive_log_problem: str | None = None
    """Why redrive's own receives could not be told apart (then they are in the counts)."""
    scanned: int | None = None
    """Messages scanned, selected or not (None: as many as ``total``)."""
    where: tuple[str, ...] = ()
    """The --where expressions that selected the ``total`` messages counted."""
    group_by: str | None = None
    """The --group-by expression the groups are by (None: by task)."""
    result_backend: str | None = None
    """The result backend read (password masked), with --result-backend."""
    result_backend_problem: str | None = None
    """Why the backend stopped answering: the groups then count only what it said before."""

    @property
    def scanned_total(self) -> int:
        return self.total if self.scanned is None else self.scanned

    @property
    def incomplete(self) -> bool:
        """The scan saw fewer messages than SQS counted at its start, with no --limit and no
        interrupt: held messages came back before it ended (SQS would not renew their
        holds) or SQS's in-flight quota (about 120,000 per queue) stopped it. Said, never
        silently reported as the whole DLQ."""
        return not (self.partial or self.interrupted) and self.scanned_total < self.depth_before

    @property
    def redrive_receives(self) -> int:
        """The most times redrive itself received one of these messages."""
        return max((g.max_redrive_receives for g in self.groups), default=0)

    @property
    def expired(self) -> int:
        return sum(g.expired for g in self.groups)

    @property
    def poison(self) -> int:
        return sum(g.poison for g in self.groups)

    @property
    def leaving_within_24h(self) -> int:
        return sum(g.leaving_within_24h for g in self.groups)

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.label,
            "dlq": self.dlq,
            "dlq_url": self.dlq_url,
            "sources": self.sources,
            "total": self.total,
            "oldest": iso_utc(self.oldest),
            "oldest_age_seconds": (
                round(self.scanned_at - self.oldest, 3) if self.oldest is not None else None
            ),
            "expired": self.expired,
            "poison": self.poison,
            "leaving_within_24h": self.leaving_within_24h,
            "groups": [g.to_json() for g in self.groups],
            "scanned_at": iso_utc(self.scanned_at),
            "seconds": round(self.seconds, 3),
            "depth_before": self.depth_before,
            "hidden_before": self.hidden_before,
            "partial": self.partial,
            "limit": self.limit,
            "incomplete": self.incomplete,
            "interrupted": self.interrupted,
            "receive_log_problem": self.receive_log_problem,
            "scanned": self.scanned_total,
            "where": list(self.where),
            "matched": self.total if self.where else None,
            "group_by": self.group_by,
        } | (
            {
                "result_backend": self.result_backend,
                "result_backend_problem": self.result_backend_problem,
            }
            if self.result_backend is not None
            else {}
        )


@dataclass(frozen=True, slots=True)
class Focus:
    """What an inspect counts and how it groups: a --where, a --group-by, the result
    backend their records may ask (``state``, ``exception``), and --show-args."""

    where: Where | None = None
    group_by: Expression | None = None
    results: RecordLookup | None = None
    """Answers the record's ``state`` and ``exception`` where no backend batch is read."""
    show_args: bool = False

    @classmethod
    def of(cls, focus: Focus | None, show_args: bool) -> Focus:
        """``focus`` (or none), showing arguments when either asks for them."""
        focus = focus or cls()
        return dataclasses.replace(focus, show_args=True) if show_args else focus

    def grouping(
        self, now: float, target: DlqTarget | None, max_redrives: int, **backend: Any
    ) -> Grouping:
        """The grouping of one scan; ``backend``: Grouping's ``with_results`` and
        ``group_by`` (``exception``) for a scan that reads Celery's result backend."""
        return Grouping(
            now=now,
            retention_seconds=target.dlq.retention_seconds if target is not None else None,
            show_args=self.show_args,
            max_redrives=max_redrives,
            where=self.where,
            group_expression=self.group_by,
            sources=tuple(s.name for s in target.sources) if target is not None else (),
            record_results=self.results,
            **backend,
        )

    def describe(self) -> dict[str, Any]:
        """The InspectResult fields that say what was counted."""
        return {
            "where": self.where.texts if self.where is not None else (),
            "group_by": self.group_by.text if self.group_by is not None else None,
        }


def inspect_dlq(
    target: DlqTarget,
    broker_factory: Callable[[], Broker],
    *,
    limit: int | None = None,
    show_args: bool = False,
    workers: int = 1,
    stop: threading.Event | None = None,
    on_progress: Callable[[int], None] | None = None,
    max_redrives: int = DEFAULT_MAX_REDRIVES,
    now: float | None = None,
    on_depth: Callable[[int], None] | None = None,
    lease: int = DEFAULT_LEASE,
    receive_log: ReceiveLog | None = None,
    focus: Focus | None = None,
    results: ResultLookup | None = None,
    group_by: str | None = None,
    scan_ended: Callable[[], None] | None = None,
    counts: tuple[int, int] | None = None,
) -> InspectResult:
    """Scan the DLQ once and leave it as it was: every message received is released.
    ``focus``: --where, --group-by EXPR; ``results``: Celery's result backend, read once per
    batch (one that fails is said, the scan goes on); ``group_by="exception"``: by exception.
    ``scan_ended``: called before what was received is given back (``--processes``: it waits
    for the sibling processes' scans, so that none receives again what this one held).
    ``counts``: SQS's depth and in-flight count, read already (``--processes``: by the
    parent, before any process received)."""
    started = time.monotonic()
    now = time.time() if now is None else now
    focus = Focus.of(focus, show_args)
    broker = broker_factory()
    depth, hidden = counts if counts is not None else inspect_counts(broker, target.dlq.url)
    if on_depth is not None:
        on_depth(depth)
    # With a --where the limit is on matches, which only counting can tell: the scan
    # receives until the grouping is full.
    scan_limit = limit if focus.where is None else None
    scan = _inspect_scan(target, broker_factory, lease, scan_limit, stop, on_progress, receive_log)
    grouping = focus.grouping(
        now, target, max_redrives, with_results=results is not None, group_by=group_by
    )
    grouping.limit = limit
    problem = _scan_into(grouping, scan, broker, broker_factory, workers, results, scan_ended)
    return InspectResult(
        **_target_fields(target),
        **grouping_fields(grouping),
        **focus.describe(),
        scanned_at=now,
        seconds=time.monotonic() - started,
        depth_before=depth,
        hidden_before=hidden,
        partial=grouping.full,
        limit=limit,
        interrupted=scan.stop.is_set(),
        seen_again=scan.stats.seen_again,
        released=scan.stats.released,
        receive_log_problem=receive_log.problem if receive_log is not None else None,
        result_backend=results.location if results is not None else None,
        result_backend_problem=problem,
    )


def _inspect_scan(
    target: DlqTarget,
    broker_factory: Callable[[], Broker],
    lease: int,
    limit: int | None,
    stop: threading.Event | None,
    on_progress: Callable[[int], None] | None,
    receive_log: ReceiveLog | None,
) -> DlqScan:
    """The one pass inspect makes: it holds what it receives until the end, then releases it."""
    return DlqScan(
        url=target.dlq.url,
        lease=lease,
        receive_held=True,
        max_messages=limit,
        stop=stop or threading.Event(),
        on_receive=on_progress,
        broker_factory=broker_factory,
        receive_log=receive_log,
    )


def _target_fields(target: DlqTarget) -> dict[str, Any]:
    return {
        "label": target.label,
        "dlq": target.dlq.name,
        "dlq_url": target.dlq.url,
        "sources": [s.name for s in target.sources],
        "fifo": target.dlq.fifo,
    }


def grouping_fields(grouping: Grouping) -> dict[str, Any]:
    """The InspectResult fields a grouping fills (shared with archive inspect)."""
    return {
        "total": grouping.total,
        "groups": grouping.sorted_groups(),
        "oldest": grouping.oldest,
        "scanned": grouping.scanned,
    }


def inspect_counts(broker: Broker, url: str) -> tuple[int, int]:
    """The broker's counts of the DLQ's visible and in-flight messages."""
    counts = broker.counts(url)
    return counts.ready, counts.held


def _scan_into(
    grouping: Grouping,
    scan: DlqScan,
    broker: Broker,
    broker_factory: Callable[[], Broker],
    workers: int,
    results: ResultLookup | None,
    scan_ended: Callable[[], None] | None = None,
) -> str | None:
    """Run the scan, counting each batch into ``grouping``, and give back everything it
    received; returns why the result backend stopped answering, if it did."""
    ahead = LookupsAhead(BatchReader(results)) if results is not None else None
    lock = threading.Lock()

    def work(worker_sqs: Broker) -> None:
        while (batch := scan.next_batch(worker_sqs)) is not None:
            try:
                infos = [(m, decode(m.body)) for m in batch]
                count = functools.partial(_count, grouping, lock, infos, full=scan.stop_receiving)
                if ahead is None:
                    count(None)
                else:
                    # One lookup per batch, on the lookups' own thread: receives go on.
                    ahead.submit([i.task_id for _, i in infos], count)
            finally:
                # Spooled even if counting failed, so release_all gives this batch back too
                # instead of leaving it hidden for the whole lease.
                scan.keep(worker_sqs, batch)

    try:
        run_pipelines(work, broker, broker_factory, workers, scan.stop)
        if ahead is not None:
            ahead.finish()
    finally:
        if ahead is not None:
            ahead.close()
        # Ctrl-C or an error: what was received goes back all the same.
        if scan_ended is not None:
            scan_ended()
        scan.release_all(broker)
        scan.close()
    problem = ahead.reader.problem if ahead is not None else None
    if problem is not None:
        # Counts of part of the scan would read as the whole: none at all, and say why.
        for group in grouping.groups.values():
            group.results = None
    return problem


def _count(
    grouping: Grouping,
    lock: threading.Lock,
    infos: list[tuple[Delivery, TaskInfo]],
    records: dict[str, TaskRecord] | None,
    *,
    full: Callable[[], None],
) -> None:
    """Count a batch; once --limit is reached, the rest of it is left out and ``full``
    called (the scan stops receiving)."""
    # Placed (--where, --group-by: pure) outside the lock that guards the counts.
    placed = []
    for message, info in infos:
        backend = records.get(info.task_id) if records and info.task_id else None
        placed.append((message, info, grouping.place(message, info, backend), backend))
    with lock:
        for message, info, key, backend in placed:
            if grouping.full:
                break
            grouping.count(message, info, key, backend)
        if grouping.full:
            full()
