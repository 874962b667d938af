"""The in-memory broker as a :class:`redrive.broker.base.Broker`: a third backend beside
SQS and RabbitMQ, for tests (it passes tests/test_broker_contract.py) and for the
coordinator's own tests, which then need neither moto nor RabbitMQ. Not persistent: its
queues live in this process (:mod:`.store`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

from redrive.broker.base import (
    BatchResult,
    Broker,
    Capabilities,
    Delivery,
    DlqTarget,
    Headers,
    QueueCounts,
    QueueRef,
    SendEntry,
    queue_name,
)
from redrive.broker.memory.store import MemoryQueue, MemoryStore, Stored
from redrive.broker.server import BrokerServer
from redrive.errors import NoDeadLetterQueue, QueueNotFound

if TYPE_CHECKING:
    from redrive.config import Family, Layout

MAX_MESSAGE_BYTES: Final = 262_144
#: What an archive keeps of a delivery's own facts: its metadata, so a restored copy has it.
ARCHIVED_ATTRIBUTES: Final = ("enqueued_at", "receive_count", "died_in")
CAPABILITIES: Final = Capabilities(
    spoken_name="the in-memory broker",
    key_namespace="memory",
    durable_holds=True,
    receive_count=True,
    fifo_groups=False,
    batch_size=10,
    batch_bytes=MAX_MESSAGE_BYTES,
    message_size_limits=(MAX_MESSAGE_BYTES,),
    max_hold_seconds=43_200,
    native_move=False,
    dead_letter_setting="dead-letter queue",
    receive_limit_setting="receive limit",
    max_message_attributes=10,
    archived_attributes=ARCHIVED_ATTRIBUTES,
    shared_by_threads=True,
    receive_limit_way_out="raise or remove it: make {name} again without a receive limit",
)
# What a body may hold: XML's characters, as SQS allows (a NUL is refused, per entry).
_REFUSED: Final = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


class MemoryBroker:
    """One in-memory broker's queues (:class:`.store.MemoryStore`), as every operation
    uses them."""

    capabilities = CAPABILITIES

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.throttled = 0

    def server(self) -> BrokerServer:
        return BrokerServer("memory", None, f"memory://{self.store.name}")

    # -- queues ------------------------------------------------------------------------

    def describe(self, name_or_address: str) -> QueueRef:
        with self.store.lock:
            return _ref(self.store.queue(name_or_address))

    def resolve(
        self, layout: Layout, target: str, broker_for: Callable[[str | None], Broker]
    ) -> DlqTarget:
        family = layout.family(target)
        if family is not None:
            return self.resolve_family(family)
        try:
            queue = self.describe(target)
        except QueueNotFound:
            known = ", ".join(f.name for f in layout.families)
            raise QueueNotFound(
                f"'{target}' is neither a family ({known}) nor an existing queue"
            ) from None
        for fam in layout.families:
            if queue.name in {queue_name(fam.queue), queue_name(fam.dlq or fam.queue)}:
                return self.resolve_family(fam)
        if queue.dead_letter_target is not None:
            return DlqTarget(queue.name, None, self.dlq_of(queue), (queue,))
        with self.store.lock:
            sources = tuple(
                _ref(q)
                for q in sorted(self.store.queues.values(), key=lambda q: q.name)
                if q.dead_letter_target == queue.ident
            )
        if not sources:
            raise NoDeadLetterQueue(f"queue {queue.name} has no DLQ and is no DLQ")
        return DlqTarget(queue.name, None, queue, sources)

    def resolve_family(self, family: Family) -> DlqTarget:
        source = self.describe(family.queue)
        dlq = self.describe(family.dlq) if family.dlq else self.dlq_of(source)
        return DlqTarget(label=family.name, family=family, dlq=dlq, sources=(source,))

    def dlq_of(self, source: QueueRef) -> QueueRef:
        if not source.dead_letter_target:
            raise NoDeadLetterQueue(f"queue {source.name} has no DLQ")
        return self.describe(source.dead_letter_target)

    def queues_named(self, prefix: str) -> list[str]:
        with self.store.lock:
            return sorted(q.url for q in self.store.queues.values() if q.name.startswith(prefix))

    def counts(self, queue: str) -> QueueCounts:
        with self.store.lock:
            found = self.store.queue(queue)
            ready = len(self.store.visible(found, self.store.clock()))
            return QueueCounts(ready=ready, held=len(found.messages) - ready)

    def exact_ready(self, queue: str) -> int | None:
        return self.counts(queue).ready

    def purge(self, queue: str) -> None:
        with self.store.lock:
            self.store.queue(queue).messages.clear()

    # -- copies ------------------------------------------------------------------------

    def receive(
        self, queue: str, *, hold: int, wait_seconds: int = 1, max_messages: int = 10
    ) -> list[Delivery]:
        store = self.store
        with store.lock:
            found = store.queue(queue)
            deadline = store.clock() + wait_seconds
            while True:
                now = store.clock()
                got = self._take(found, now, hold, max_messages)
                if got or now >= deadline:
                    return got
                store.lock.wait(deadline - now)

    def _take(self, queue: MemoryQueue, now: float, hold: int, most: int) -> list[Delivery]:
        got: list[Delivery] = []
        for message in self.store.visible(queue, now):
            if len(got) == most:
                break
            if self.store.dead_letter(queue, message):
                continue
            message.receive_count += 1
            message.visible_at = now + hold
            message.tag = f"{message.message_id}#{message.receive_count}"
            got.append(_delivery(message, hidden_until=now + hold))
        return got

    def extend(self, queue: str, tags: Mapping[str, str], seconds: int) -> BatchResult:
        return self._settle(queue, tags, lambda q, m, now: _hold(m, now + seconds))

    def release(self, queue: str, tags: Mapping[str, str]) -> BatchResult:
        return self._settle(queue, tags, lambda q, m, now: _release(m, now))

    def ack(self, queue: str, tags: Mapping[str, str]) -> BatchResult:
        return self._settle(queue, tags, lambda q, m, now: q.messages.pop(m.message_id))

    def _settle(
        self,
        queue: str,
        tags: Mapping[str, str],
        change: Callable[[MemoryQueue, Stored, float], object],
    ) -> BatchResult:
        """Change each held copy a tag names; a tag of an earlier receive, or of a copy
        whose hold ran out, changes nothing (that entry fails)."""
        ok: dict[str, str] = {}
        failed: dict[str, str] = {}
        with self.store.lock:
            found = self.store.queue(queue)
            now = self.store.clock()
            for entry_id, tag in tags.items():
                message = found.messages.get(tag.partition("#")[0])
                if message is None or message.tag != tag or message.visible_at <= now:
                    failed[entry_id] = "NotHeld: the copy is gone or no longer held by this tag"
                    continue
                change(found, message, now)
                ok[entry_id] = ""
            self.store.lock.notify_all()
        return BatchResult(ok, failed)

    def send(self, queue: str, entries: Sequence[SendEntry]) -> BatchResult:
        ok: dict[str, str] = {}
        failed: dict[str, str] = {}
        with self.store.lock:
            found = self.store.queue(queue)
            for entry in entries:
                problem = _refused(entry)
                if problem:
                    failed[entry.id] = problem
                    continue
                stored = Stored(
                    message_id=self.store.new_id(),
                    body=entry.body,
                    headers=dict(entry.headers),
                    enqueued_at=self.store.wall(),
                    group_id=entry.group_id,
                )
                self.store.enqueue(found, stored)
                ok[entry.id] = stored.message_id
            lost = frozenset(i for i in ok if i in self.store.lost_confirms)
        for entry_id in lost:
            del ok[entry_id]
            failed[entry_id] = "Unconfirmed: the answer was lost (the message may be queued)"
        return BatchResult(ok, failed, lost)

    def restored(
        self, message_id: str, body: str, attributes: Mapping[str, str], headers: Headers
    ) -> Delivery:
        return restored_delivery(message_id, body, attributes, headers)


def _hold(message: Stored, until: float) -> None:
    message.visible_at = until


def _release(message: Stored, now: float) -> None:
    message.visible_at, message.tag = now, ""


def _refused(entry: SendEntry) -> str | None:
    if _REFUSED.search(entry.body):
        return "InvalidMessageContents: the body holds a character no message may hold"
    if entry.size() > MAX_MESSAGE_BYTES:
        return f"MessageTooLong: {entry.size()} bytes, more than {MAX_MESSAGE_BYTES}"
    return None


def _ref(queue: MemoryQueue) -> QueueRef:
    return QueueRef(
        url=queue.url,
        name=queue.name,
        ident=queue.ident,
        fifo=False,
        dead_letter_target=queue.dead_letter_target,
        max_receive_count=queue.max_receive_count,
    )


def _delivery(message: Stored, *, hidden_until: float) -> Delivery:
    return Delivery(
        message_id=message.message_id,
        tag=message.tag,
        body=message.body,
        attributes=_facts(message),
        headers=dict(message.headers),
        receive_count=message.receive_count,
        enqueued_at=message.enqueued_at,
        died_in=message.died_in,
        group_id=message.group_id,
        hidden_until=hidden_until,
    )


def _facts(message: Stored) -> dict[str, str]:
    """The delivery's own facts, as text (what an archive keeps of them)."""
    facts = {"enqueued_at": repr(message.enqueued_at), "receive_count": str(message.receive_count)}
    if message.died_in:
        facts["died_in"] = message.died_in
    return facts


def restored_delivery(
    message_id: str, body: str, attributes: Mapping[str, str], headers: Headers
) -> Delivery:
    """A delivery rebuilt from an archive record, its metadata from the facts kept."""
    count = attributes.get("receive_count", "0")
    try:
        enqueued: float | None = float(attributes.get("enqueued_at", ""))
    except ValueError:
        enqueued = None
    return Delivery(
        message_id=message_id,
        tag="",
        body=body,
        attributes=dict(attributes),
        headers=dict(headers),
        receive_count=int(count) if count.isdigit() else 0,
        enqueued_at=enqueued,
        died_in=attributes.get("died_in") or None,
    )
