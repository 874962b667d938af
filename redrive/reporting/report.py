"""Report: every family's DLQ inspected, in one document for scheduled runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redrive.aws.sqs import Sqs
from redrive.celery.results import ResultLookup
from redrive.config import Layout
from redrive.dlq.queues import resolve_family
from redrive.dlq.receive_log import ReceiveLog
from redrive.durations import iso_utc
from redrive.errors import AwsUnavailable, RedriveError
from redrive.reporting.inspect import InspectResult, inspect_dlq


@dataclass(slots=True)
class FamilyReport:
    family: str
    dlq: str | None
    result: InspectResult | None
    error: str | None = None

    @property
    def messages(self) -> int:
        return self.result.total if self.result else 0

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"family": self.family, "dlq": self.dlq, "messages": self.messages}
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
        return data


@dataclass(slots=True)
class Report:
    generated_at: float
    layout: str
    queues: list[FamilyReport] = field(default_factory=list)

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
    sqs_for: Callable[[str | None], Sqs],
    *,
    stop: threading.Event | None = None,
    on_progress: Callable[[str, int], None] | None = None,
    now: float | None = None,
    receive_log: ReceiveLog | None = None,
    show_args: bool = False,
    results: ResultLookup | None = None,
) -> Report:
    now = time.time() if now is None else now
    report = Report(generated_at=now, layout=layout.source)
    for family in layout.families:
        try:
            target = resolve_family(sqs_for(family.region), family)
            result = inspect_dlq(
                target,
                lambda region=family.region: sqs_for(region),  # type: ignore[misc]
                stop=_FamilyStop(stop) if stop is not None else None,
                on_progress=(lambda n, name=family.name: on_progress(name, n))  # type: ignore[misc]
                if on_progress
                else None,
                now=now,
                receive_log=receive_log,
                show_args=show_args,
                results=results,
            )
            report.queues.append(FamilyReport(family.name, target.dlq.name, result))
        except AwsUnavailable:
            # Credentials or network: every family would fail the same way; say it once.
            raise
        except RedriveError as exc:
            report.queues.append(FamilyReport(family.name, family.dlq, None, str(exc)))
        if stop is not None and stop.is_set():
            break
    return report
