"""SQS as a :class:`redrive.broker.base.Broker` (kombu's model: one transport per broker).

The SQS calls keep SQS's names (:class:`.calls.SqsCalls`: ``send_batch``, ``delete_batch``,
...); the seam's (``send``, ``ack``, ``extend``, ...) are built on them here, so a test that
injects a fault into an SQS call sees it through the seam.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from redrive.broker.base import BatchResult, Broker, DlqTarget, QueueCounts, QueueRef, SendEntry
from redrive.broker.server import BrokerServer
from redrive.broker.sqs.calls import COUNT_ATTRIBUTES, SqsCalls
from redrive.broker.sqs.queues import describe_queue, dlq_of, resolve_family, resolve_target

if TYPE_CHECKING:
    from redrive.config import Family, Layout


class SqsBroker(SqsCalls):
    """SQS queues as every operation uses them."""

    def describe(self, name_or_address: str) -> QueueRef:
        return describe_queue(self, name_or_address)

    def resolve(
        self, layout: Layout, target: str, broker_for: Callable[[str | None], Broker]
    ) -> DlqTarget:
        return resolve_target(layout, target, broker_for, default=self)

    def resolve_family(self, family: Family) -> DlqTarget:
        return resolve_family(self, family)

    def dlq_of(self, source: QueueRef) -> QueueRef:
        return dlq_of(self, source)

    def queues_named(self, prefix: str) -> list[str]:
        return self.list_queues(prefix)

    def server(self) -> BrokerServer:
        """SQS has no version to say: named by its endpoint (issue 39)."""
        return BrokerServer("sqs", None, str(self.client.meta.endpoint_url))

    def counts(self, queue: str) -> QueueCounts:
        return counts_of(self.attributes(queue, COUNT_ATTRIBUTES))

    def exact_ready(self, queue: str) -> int | None:
        return None  # ApproximateNumberOfMessages: eventually consistent, never exact

    def extend(self, queue: str, tags: Mapping[str, str], seconds: int) -> BatchResult:
        return self.change_visibility_batch(queue, tags, seconds)

    def release(self, queue: str, tags: Mapping[str, str]) -> BatchResult:
        return self.change_visibility_batch(queue, tags, 0)

    def send(self, queue: str, entries: Sequence[SendEntry]) -> BatchResult:
        return self.send_batch(queue, entries)

    def ack(self, queue: str, tags: Mapping[str, str]) -> BatchResult:
        return self.delete_batch(queue, tags)


def counts_of(attributes: Mapping[str, str]) -> QueueCounts:
    """A queue's counts from GetQueueAttributes (instant at any depth); a missing or odd
    figure counts 0."""
    ready, held, delayed = (attributes.get(name, "0") for name in COUNT_ATTRIBUTES)
    return QueueCounts(
        ready=int(ready) if ready.isdigit() else 0,
        held=int(held) if held.isdigit() else 0,
        delayed=int(delayed) if delayed.isdigit() else 0,
    )
