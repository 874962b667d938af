"""Report: every family's DLQ inspected, in one document for scheduled runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from redrive.broker.base import Broker
from redrive.celery.results import ResultLookup
from redrive.config import Layout
from redrive.dlq import delivery_limit
from redrive.dlq.receive_log import ReceiveLog
from redrive.durations import iso_utc
from redrive.errors import BrokerUnavailable, RedriveError
from redrive.inspection.scan import Focus, InspectResult, inspect_dlq

Coverage = Literal["full", "partial", "none"]
"""How much of a DLQ a report scanned: to the end, until it was interrupted, or nothing (an
interrupt came first, or the scan failed: then ``error`` says why)."""


@dataclass(slots=True)
class FamilyReport:
    family: str
    dlq: str | None
    result: InspectResult | None
    error: str | None = None

    @property
    def messages(self) -> int:
        return self.result.total if self.result else 0

    @property
    def coverage(self) -> Coverage:
        if self.result is None:
            return "none"
        return "partial" if self.result.interrupted else "full"

    @property
    def skipped(self) -> bool:
        """Not scanned at all: the report was interrupted before this DLQ's turn."""
        return self.result is None and self.error is None

    def to_json(self) -> dict[str, Any]:
        # A DLQ never scanned has no count: 0 would read as empty.
        messages = None if self.skipped else self.messages
        data: dict[str, Any] = {"family": self.family, "dlq": self.dlq, "messages": messages}
        if self.result is not None:
            inspected = self.result.to_json()
            data.update(
                oldest=inspected["oldest"],
                oldest_age_seconds=inspected["oldest_age_seconds"],
                expired=inspected["expired"],
                poison=inspected["poison"],
                leaving_within_24h=inspected["leaving_within_24h"],
                groups=inspected["groups"],
            )
        else:
            data["groups"] = []
        data["error"] = self.error
        data["coverage"] = self.coverage
        if self.coverage == "partial" and self.result is not None:
            data["depth_before"] = self.result.depth_before
        return data


@dataclass(slots=True)
class Report:
    generated_at: float
    layout: str
    queues: list[FamilyReport] = field(default_factory=list)
    where: tuple[str, ...] = ()
    """The --where expressions: each DLQ's counts are of the messages they select."""
    group_by: str | None = None
    """The --group-by expression the groups are by (None: by task)."""
    interrupted: bool = False
    """Stopped (Ctrl-C, SIGTERM) before every DLQ was scanned to its end: each queue's
    ``coverage`` says what its counts cover."""

    @property
    def total(self) -> int:
        return sum(q.messages for q in self.queues)

    @property
    def result_backend_problem(self) -> str | None:
        """Why Celery's result backend did not answer (said once; the report goes on)."""
        problems = [q.result.result_backend_problem for q in self.queues if q.result]
        return next((p for p in problems if p), None)

    @property
    def errors(self) -> list[str]:
        return [f"{q.family}: {q.error}" for q in self.queues if q.error]

    def to_json(self) -> dict[str, Any]:
        return {
            "generated_at": iso_utc(self.generated_at),
            "layout": self.layout,
            "total": self.total,
            "queues": [q.to_json() for q in self.queues],
            "where": list(self.where),
            "group_by": self.group_by,
            "interrupted": self.interrupted,
        }


class _FamilyStop(threading.Event):
    """One family's scan stop: set by the caller's stop, or by the scan itself when one of
    its workers fails. The latter must end that scan only, not the whole report."""

    def __init__(self, outer: threading.Event) -> None:
        super().__init__()
        self._outer = outer

    def is_set(self) -> bool:
        return super().is_set() or self._outer.is_set()


def build_report(
    layout: Layout,
    broker_for: Callable[[str | None], Broker],
    *,
    stop: threading.Event | None = None,
    on_progress: Callable[[str, int], None] | None = None,
    now: float | None = None,
    receive_log: ReceiveLog | None = None,
    focus: Focus | None = None,
    show_args: bool = False,
    results: ResultLookup | None = None,
    allow_delivery_limit: bool = False,
) -> Report:
    """Inspect every family's DLQ (with ``focus``: counting what a --where selects, grouped
    by a --group-by)."""
    now = time.time() if now is None else now
    report = Report(generated_at=now, layout=layout.source)
    if focus is not None:
        report.where = tuple(focus.describe()["where"])
        report.group_by = focus.describe()["group_by"]
    for family in layout.families:
        try:
            broker = broker_for(family.region)
            target = broker.resolve_family(family)
            delivery_limit.guard(
                target.dlq, broker.capabilities, lambda: receive_log, allowed=allow_delivery_limit
            )
            result = inspect_dlq(
                target,
                lambda region=family.region: broker_for(region),  # type: ignore[misc]
                stop=_FamilyStop(stop) if stop is not None else None,
                on_progress=(lambda n, name=family.name: on_progress(name, n))  # type: ignore[misc]
                if on_progress
                else None,
                now=now,
                receive_log=receive_log,
                focus=focus,
                show_args=show_args,
                results=results,
            )
            report.queues.append(FamilyReport(family.name, target.dlq.name, result))
        except BrokerUnavailable:
            # Credentials or network: every family would fail the same way; say it once.
            raise
        except RedriveError as exc:
            report.queues.append(FamilyReport(family.name, family.dlq, None, str(exc)))
        if stop is not None and stop.is_set():
            break
    if stop is not None and stop.is_set():
        report.interrupted = True
        # Listed all the same: a DLQ left out of the document would read as one not there.
        done = {q.family for q in report.queues}
        report.queues.extend(
            FamilyReport(f.name, f.dlq, None) for f in layout.families if f.name not in done
        )
    return report
