"""Status: queue counts of every family, from the broker's own counts (instant at any depth)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redrive.broker.base import Broker
from redrive.broker.base import QueueCounts as BrokerCounts
from redrive.config import Layout
from redrive.errors import BrokerUnavailable, RedriveError


@dataclass(frozen=True, slots=True)
class QueueCounts:
    visible: int
    in_flight: int
    delayed: int

    @classmethod
    def of(cls, counts: BrokerCounts) -> QueueCounts:
        return cls(visible=counts.ready, in_flight=counts.held, delayed=counts.delayed)

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


def family_status(layout: Layout, broker_for: Callable[[str | None], Broker]) -> list[FamilyStatus]:
    """One row per family. A family that cannot be resolved gets its error in its row, so
    one broken queue does not hide the others; the caller decides the exit code."""
    rows = []
    for family in layout.families:
        try:
            # Inside the try: a family's own region may be what is broken.
            broker = broker_for(family.region)
            target = broker.resolve_family(family)
            source = target.sources[0]
            rows.append(
                FamilyStatus(
                    family=family.name,
                    queue=source.name,
                    dlq=target.dlq.name,
                    queue_counts=QueueCounts.of(broker.counts(source.url)),
                    dlq_counts=QueueCounts.of(broker.counts(target.dlq.url)),
                    dlq_retention_seconds=target.dlq.retention_seconds,
                )
            )
        except BrokerUnavailable:
            # Credentials or network: every family would fail the same way; say it once.
            raise
        except RedriveError as exc:
            counts = _source_counts(broker_for, family.region, family.queue)
            rows.append(
                FamilyStatus(family.name, family.queue, family.dlq, counts, None, None, str(exc))
            )
    return rows


def _source_counts(
    broker_for: Callable[[str | None], Broker], region: str | None, queue: str
) -> QueueCounts | None:
    """A family whose DLQ is not found may still have its source queue: its counts, so that
    its row does not read as if the queue were missing too (None: it is, or cannot say)."""
    try:
        broker = broker_for(region)
        return QueueCounts.of(broker.counts(broker.describe(queue).url))
    except RedriveError:
        return None
