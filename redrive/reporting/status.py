"""Status: queue counts of every family, from GetQueueAttributes only (instant at any depth)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redrive.aws.sqs import Sqs
from redrive.config import Layout
from redrive.dlq.queues import COUNT_ATTRIBUTES, resolve_family
from redrive.errors import AwsUnavailable, RedriveError


@dataclass(frozen=True, slots=True)
class QueueCounts:
    visible: int
    in_flight: int
    delayed: int

    @classmethod
    def from_attributes(cls, attrs: dict[str, str]) -> QueueCounts:
        def number(name: str) -> int:
            value = attrs.get(name, "0")
            return int(value) if value.isdigit() else 0

        return cls(
            visible=number(COUNT_ATTRIBUTES[0]),
            in_flight=number(COUNT_ATTRIBUTES[1]),
            delayed=number(COUNT_ATTRIBUTES[2]),
        )

    def to_json(self) -> dict[str, int]:
        return {"visible": self.visible, "in_flight": self.in_flight, "delayed": self.delayed}


@dataclass(frozen=True, slots=True)
class FamilyStatus:
    family: str
    queue: str | None
    dlq: str | None
    queue_counts: QueueCounts | None
    dlq_counts: QueueCounts | None
    dlq_retention_seconds: int | None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "queue": self.queue,
            "dlq": self.dlq,
            "queue_counts": self.queue_counts.to_json() if self.queue_counts else None,
            "dlq_counts": self.dlq_counts.to_json() if self.dlq_counts else None,
            "dlq_retention_seconds": self.dlq_retention_seconds,
            "error": self.error,
        }


def family_status(layout: Layout, sqs_for: Callable[[str | None], Sqs]) -> list[FamilyStatus]:
    """One row per family. A family that cannot be resolved gets its error in its row, so
    one broken queue does not hide the others; the caller decides the exit code."""
    rows = []
    for family in layout.families:
        try:
            # Inside the try: a family's own region may be what is broken.
            sqs = sqs_for(family.region)
            target = resolve_family(sqs, family)
            source = target.sources[0]
            rows.append(
                FamilyStatus(
                    family=family.name,
                    queue=source.name,
                    dlq=target.dlq.name,
                    queue_counts=QueueCounts.from_attributes(
                        sqs.attributes(source.url, COUNT_ATTRIBUTES)
                    ),
                    dlq_counts=QueueCounts.from_attributes(
                        sqs.attributes(target.dlq.url, COUNT_ATTRIBUTES)
                    ),
                    dlq_retention_seconds=target.dlq.retention_seconds,
                )
            )
        except AwsUnavailable:
            # Credentials or network: every family would fail the same way; say it once.
            raise
        except RedriveError as exc:
            rows.append(
                FamilyStatus(family.name, family.queue, family.dlq, None, None, None, str(exc))
            )
    return rows
