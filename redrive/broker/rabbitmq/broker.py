"""RabbitMQ as a :class:`redrive.broker.base.Broker`.

A received copy is an unacked delivery (held while the channel lives: holds do not outlive
the process, so nothing renews them; ``extend`` has nothing to do), its body kombu's
envelope of the AMQP message (:mod:`.envelope`). Sends go to the default exchange with the
queue's name as routing key (exactly that queue, never a fan-out through the original
exchange), persistent, ``mandatory``, and pipelined under publisher confirms: an entry is sent
only once confirmed and not returned (a basic.return is refused: no route; a nack refused);
one whose confirm never came is unconfirmed (in doubt).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

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
)
from redrive.broker.rabbitmq.api import ManagementApi
from redrive.broker.rabbitmq.envelope import (
    NotAnEnvelope,
    envelope_of,
    envelope_with_value,
    marks_of,
    message_id_of,
    resent,
    unpacked,
)
from redrive.broker.rabbitmq.link import Got, Link
from redrive.broker.rabbitmq.properties import Received
from redrive.broker.rabbitmq.queues import Queues
from redrive.broker.server import BrokerServer
from redrive.errors import BrokerUnavailable, RedriveError

if TYPE_CHECKING:
    from redrive.config import Family, Layout

#: RabbitMQ's default max_message_size (3.8 to 3.13; 4.x: 16 MiB). The envelope redrive
#: sees is larger (base64 of the body): counted by its own size, a message near the limit is
#: refused by redrive before the broker would.
MAX_MESSAGE_BYTES: Final = 134_217_728
#: RabbitMQ 4.x's default max_message_size: a body over it is refused (406, the channel
#: closed) where 3.x took it; a message that came in under 3.x, or while the limit was
#: higher, can sit in a DLQ above it. redrive sends no such body (:func:`too_large`).
MAX_MESSAGE_BYTES_4: Final = 16 * 1024 * 1024
#: consumer_timeout (30 min) closes a channel that holds a delivery longer: stay below.
MAX_HOLD_SECONDS: Final = 25 * 60
BATCH_SIZE: Final = 100
#: Facts of the delivery kept with an archived copy.
ARCHIVED_ATTRIBUTES: Final = ("exchange", "routing_key")
CAPABILITIES: Final = Capabilities(
    spoken_name="RabbitMQ",
    key_namespace="amqp",
    durable_holds=False,
    receive_count=False,
    fifo_groups=False,
    batch_size=BATCH_SIZE,
    batch_bytes=64 * 1024 * 1024,
    message_size_limits=(MAX_MESSAGE_BYTES,),
    max_hold_seconds=MAX_HOLD_SECONDS,
    native_move=True,
    native_mover="redrive.broker.rabbitmq.shovel:Shovels",
    dead_letter_setting="x-dead-letter-exchange",
    receive_limit_setting="x-delivery-limit",
    max_message_attributes=64,
    archived_attributes=ARCHIVED_ATTRIBUTES,
    declared_by_consumers=True,
    release_lands_later=True,
    # A queue's own x-delivery-limit argument may outrank a policy's: then only declaring
    # the DLQ again lifts it.
    receive_limit_way_out=(
        "raise or remove it: rabbitmqctl set_policy -p {scope} --apply-to queues "
        "redrive-{name} '^{name}$' '{{\"delivery-limit\": 1000000}}' (if its own "
        "x-delivery-limit argument outranks the policy, declare the DLQ again without it)"
    ),
)


def default_max_message(version: str | None) -> int | None:
    """The largest body a RabbitMQ of ``version`` takes unless configured otherwise (None:
    no version known)."""
    major = (version or "").split(".", 1)[0]
    if not major.isdigit():
        return None
    return MAX_MESSAGE_BYTES_4 if int(major) >= 4 else MAX_MESSAGE_BYTES


def too_large(size: int, version: str | None) -> str | None:
    """Why a body of ``size`` bytes is not sent to a RabbitMQ of ``version`` (None: it may
    be): over the version's default largest message, which the broker would refuse."""
    limit = default_max_message(version)
    if limit is None or size <= limit:
        return None
    return (
        f"TooLarge: its body is {size:,} bytes, over RabbitMQ {version}'s default largest "
        f"message of {limit // (1024 * 1024)} MiB (max_message_size); not sent, it stays "
        "in the DLQ"
    )


class RabbitBroker:
    """One vhost's queues, over lanes of its own of the process's link to its URL (each
    ``--workers`` thread has a broker: their calls never wait on each other's): one for
    receiving, acknowledging and counting, one for publishing."""

    capabilities = CAPABILITIES

    def __init__(
        self, link: Link, api: ManagementApi, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.link = link
        self.lane = link.lane()
        weakref.finalize(self, link.give_back, self.lane)
        # Publishes go on a lane of their own (connected on the first send): a worker's
        # next receive, waiting on its lane for deliveries, and this batch's confirms then
        # wait at once, not in turn (a lane's calls hold its lock while they wait).
        self.sending = link.lane()
        weakref.finalize(self, link.give_back, self.sending)
        self.queues = Queues(api, link.address.vhost)
        self.clock = clock
        self.throttled = 0
        self._server_version: tuple[str | None] | None = None
        self._limits: dict[str, int | None] = {}
        """Source queue name -> its delivery limit, asked once (see :meth:`_with_limits`)."""

    def _name(self, queue: str) -> str:
        return self.queues.name_of(queue)

    def _version(self) -> str | None:
        """The server's version for a send's size rule (asked once); None where the API
        cannot say: the broker's own refusal then tells (link.py)."""
        if self._server_version is None:
            try:
                self._server_version = (self.queues.server_version(),)
            except RedriveError:
                self._server_version = (None,)  # asked once: a send never waits on it again
        return self._server_version[0]

    # -- queues --------------------------------------------------------------------------

    def describe(self, name_or_address: str) -> QueueRef:
        return self.queues.describe(name_or_address)

    def resolve(
        self, layout: Layout, target: str, broker_for: Callable[[str | None], Broker]
    ) -> DlqTarget:
        return self.queues.resolve(layout, target, broker_for)

    def resolve_family(self, family: Family) -> DlqTarget:
        return self.queues.resolve_family(family)

    def dlq_of(self, source: QueueRef) -> QueueRef:
        return self.queues.dlq_of(source)

    def queues_named(self, prefix: str) -> list[str]:
        return [self.queues.ident(name) for name in self.queues.names(prefix)]

    def server(self) -> BrokerServer:
        """RabbitMQ and the version its management API says (issue 39), at its URL."""
        return BrokerServer("rabbitmq", self.queues.server_version(), self.link.masked)

    def counts(self, queue: str) -> QueueCounts:
        """Ready: exact (a passive declare). Held: the larger of this process's own holds
        and the management API's count (which lags by its statistics interval). Every
        release held back is sent first: a count after a release sees it."""
        name = self._name(queue)
        self.link.send_releases()
        ready, _ = self.lane.declared(name)
        held = self.link.held(name)
        try:
            raw = self.queues.raw(name)
            held = max(held, int(raw.get("messages_unacknowledged") or 0))
        except BrokerUnavailable:
            raise
        except Exception:  # a count the API does not have yet: our own holds stand
            pass
        return QueueCounts(ready=ready, held=held)

    def exact_ready(self, queue: str) -> int | None:
        ready, _ = self.lane.declared(self._name(queue))
        return ready

    def purge(self, queue: str) -> None:
        self.lane.purge(self._name(queue))

    # -- copies --------------------------------------------------------------------------

    def receive(
        self, queue: str, *, hold: int, wait_seconds: int = 1, max_messages: int = 10
    ) -> list[Delivery]:
        name = self._name(queue)
        hidden_until = self.clock() + min(hold, MAX_HOLD_SECONDS)
        ready, _ = self.lane.declared(name)
        got = self.lane.get(name, max_messages, ready)
        vhost = self.queues.vhost
        return [
            self._with_limit(delivery_of(g, hidden_until=hidden_until, vhost=vhost)) for g in got
        ]

    def _with_limit(self, delivery: Delivery) -> Delivery:
        """A death of reason ``delivery_limit`` came after its source's delivery limit + 1
        deliveries, which the message no longer says (dead-lettering drops the quorum
        queue's x-delivery-count): ``source_deliveries`` from the source's limit now, where
        the source still has one."""
        if delivery.death_reason != "delivery_limit" or not delivery.died_in:
            return delivery
        source = self.queues.name_of(delivery.died_in)
        if source not in self._limits:
            try:
                self._limits[source] = self.queues.describe(source).max_receive_count
            except RedriveError:  # gone, or the API cannot say: a count, not a verdict
                self._limits[source] = None
        limit = self._limits[source]
        return delivery if limit is None else replace(delivery, source_deliveries=limit + 1)

    def extend(self, queue: str, tags: Mapping[str, str], seconds: int) -> BatchResult:
        # A hold lasts while the channel lives: nothing to renew.
        return BatchResult({entry_id: "" for entry_id in tags}, {})

    def release(self, queue: str, tags: Mapping[str, str]) -> BatchResult:
        return self.link.settle(tags, ack=False)

    def ack(self, queue: str, tags: Mapping[str, str]) -> BatchResult:
        return self.link.settle(tags, ack=True)

    def send(self, queue: str, entries: Sequence[SendEntry]) -> BatchResult:
        if not entries:
            return BatchResult({}, {})
        name = self._name(queue)
        failed: dict[str, str] = {}
        ready: list[tuple[str, bytes, dict[str, Any]]] = []
        received: dict[str, Received] = {}
        ids: dict[str, str] = {}
        for entry in entries:
            got = entry.native if isinstance(entry.native, Got) else None
            try:
                if got is not None:
                    # Unedited: the message as received, never decoded from its envelope.
                    body, properties = resent(got.body, got.properties, entry.headers)
                    if got.received is not None:
                        received[entry.id] = got.received
                else:
                    body, properties = unpacked(entry.body, entry.headers)
            except NotAnEnvelope as exc:
                failed[entry.id] = f"NotAnEnvelope: {exc}"
                continue
            over = too_large(len(body), self._version())
            if over is not None:
                failed[entry.id] = over
                continue
            # The envelope names the copy as sent: persistent, whatever the producer said.
            # A received message already persistent has the envelope its delivery gave.
            same = got is not None and properties.get("delivery_mode") == 2
            properties["delivery_mode"] = 2
            envelope = entry.body if same else envelope_of(body, properties)
            ready.append((entry.id, body, properties))
            ids[entry.id] = message_id_of(properties, envelope, marks_of(properties))
        refused, unconfirmed = self.sending.publish(name, ready, received)
        failed.update(refused)
        for entry_id in unconfirmed:
            failed[entry_id] = "Unconfirmed: no publisher confirm came (the message may be queued)"
        ok = {i: ids[i] for i, _, _ in ready if i not in refused and i not in unconfirmed}
        return BatchResult(ok, failed, frozenset(unconfirmed))

    def restored(
        self, message_id: str, body: str, attributes: Mapping[str, str], headers: Headers
    ) -> Delivery:
        return restored_delivery(message_id, body, attributes, headers)


def delivery_of(got: Got, *, hidden_until: float, vhost: str) -> Delivery:
    """One delivery as the core reads it (see :mod:`.envelope`)."""
    envelope, parsed = envelope_with_value(got.body, got.properties)
    marks = marks_of(got.properties)
    headers = got.properties.get("application_headers") or {}
    deaths = headers.get("x-death")
    latest = (
        deaths[0] if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict) else {}
    )
    first = (
        deaths[-1] if isinstance(deaths, list) and deaths and isinstance(deaths[-1], dict) else {}
    )
    count = headers.get("x-delivery-count")
    died_in = latest.get("queue")
    reason = latest.get("reason")
    return Delivery(
        message_id=message_id_of(got.properties, envelope, marks),
        tag=got.tag,
        body=envelope,
        attributes={
            "exchange": got.exchange,
            "routing_key": got.routing_key,
            "redelivered": "true" if got.redelivered else "false",
        },
        headers=marks,
        receive_count=count if isinstance(count, int) and not isinstance(count, bool) else 0,
        enqueued_at=_epoch(first.get("time")),
        died_in=f"{vhost}/{died_in}" if isinstance(died_in, str) and died_in else None,
        hidden_until=hidden_until,
        death_reason=reason if isinstance(reason, str) and reason else None,
        died_at=_epoch(latest.get("time")),
        parsed=parsed,
        native=got,
    )


def _epoch(value: object) -> float | None:
    if isinstance(value, datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return moment.timestamp()
    return None


def restored_delivery(
    message_id: str, body: str, attributes: Mapping[str, str], headers: Headers
) -> Delivery:
    """A delivery rebuilt from an archive record (no tag: nothing to ack): the exchange and
    routing key it kept tell nothing of the message's metadata."""
    return Delivery(
        message_id=message_id, tag="", body=body, attributes=dict(attributes), headers=dict(headers)
    )
