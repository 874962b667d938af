"""Inspect: scan a DLQ without disturbing it and group its messages by Celery task (or by a
``--group-by`` expression, :mod:`redrive.inspection.groups`), counting only the messages a
``--where`` selects."""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redrive.broker.base import Broker, Delivery, DlqTarget
from redrive.celery.results import (
    BatchReader,
    LookupsAhead,
    ResultLookup,
    TaskRecord,
)
from redrive.dlq.receive_log import ReceiveLog
from redrive.dlq.scan import DlqScan, run_pipelines
from redrive.durations import iso_utc
from redrive.inspection.groups import DEFAULT_MAX_REDRIVES, Counted, Grouping, TaskGroup
from redrive.message_record import ResultLookup as RecordLookup
from redrive.messages import TaskInfo, decode
from redrive.where import Expression, Where

DEFAULT_LEASE = 30


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
    on_counted: Counted | None = None
    """Hears each message counted (in this process: it does not cross to --processes')."""

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
            on_counted=self.on_counted,
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
                infos = [(m, decode(m.body, m.parsed)) for m in batch]
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
