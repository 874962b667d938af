"""A DLQ's messages counted into groups: by Celery task, or by a ``--group-by`` expression,
counting only the messages a ``--where`` selects. Counters only, never a list of every
message; shared by live inspect, archive inspect and the merge of ``--processes`` children."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from redrive import attributes
from redrive.broker.base import Delivery, consumer_receives, queue_name
from redrive.celery.results import ResultCounts, TaskRecord, exception_group
from redrive.durations import iso_utc
from redrive.inspection.timeline import SentTimes, Timeline, fit_timelines
from redrive.message_record import RecordBuilder, TaskOutcome
from redrive.message_record import ResultLookup as RecordLookup
from redrive.messages import TaskInfo
from redrive.where import Expression, Where, group_value

SAMPLES_PER_GROUP = 3
# How much of a body that is not a Celery task --show-args shows instead of its arguments.
SHOWN_BODY_CHARS = 300
DAY = 86_400
Counted = Callable[["GroupKey", Delivery, TaskInfo, "TaskRecord | None"], None]
"""Hears each message counted: its group's key, the message, its task, the backend's
record of it (the console keeps a few of each group's for its message page)."""
DEFAULT_MAX_REDRIVES = 3
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
    death_reasons: Counter[str] = field(default_factory=Counter)
    """Why its messages were last dead-lettered, where the broker says (RabbitMQ's x-death
    reasons); empty where it does not (SQS), and then left out of the JSON."""
    died_in: Counter[str] = field(default_factory=Counter)
    """The queues (names) its messages were last dead-lettered from, where the broker says."""
    died_oldest: float | None = None
    died_newest: float | None = None
    """The earliest and latest of its messages' last deaths (the broker's death times)."""

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
        if self.death_reasons:
            # Only where a broker tells: an SQS group's JSON stays as it was.
            data["death_reasons"] = dict(self.death_reasons)
            data["died_in"] = dict(self.died_in)
            data["died_oldest"] = iso_utc(self.died_oldest)
            data["died_newest"] = iso_utc(self.died_newest)
        return data

    def add_death(self, reason: str | None, queue: str | None, at: float | None) -> None:
        """Count one message's last death, as far as the broker told it."""
        if reason is None:
            return
        self.death_reasons[reason] += 1
        if queue is not None:
            self.died_in[queue_name(queue)] += 1
        if at is not None:
            self.died_oldest = at if self.died_oldest is None else min(self.died_oldest, at)
            self.died_newest = at if self.died_newest is None else max(self.died_newest, at)


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
    on_counted: Counted | None = None
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
            consumer=consumer_receives(message),
            key=key,
            record=backend,
            death=(message.death_reason, message.died_in, message.died_at),
        )
        if self.on_counted is not None:
            self.on_counted(key, message, info, backend)

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
        consumer: int | None = None,
        key: GroupKey | None = None,
        record: TaskRecord | None = None,
        death: tuple[str | None, str | None, float | None] = (None, None, None),
    ) -> None:
        group = self._group(key or GroupKey.of_task(info), record)
        group.add_death(*death)
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
        if consumer is None:  # redrive.broker.base.consumer_receives, from the counts alone
            consumer = max(0, receive_count - redrive_receives)
        group.max_consumer_receives = max(group.max_consumer_receives, consumer)
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
