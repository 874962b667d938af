"""The layout's queues on RabbitMQ, and DLQs filled by RabbitMQ's own dead-lettering.

Each family's source queue dead-letters through one direct exchange (the DLX,
:data:`DLX`) with the DLQ's name as routing key; the DLQ is bound to the DLX for that key.
Classic queues by default (declared as Celery declares them: no ``x-queue-type``), quorum on
request (``x-queue-type: quorum``, optionally ``x-delivery-limit``).

The DLQs are filled as production fills them: Celery protocol-2 messages, byte for byte as
Celery 5.7 publishes them on RabbitMQ (:func:`celery_message`; ``tests/test_rabbitmq_layout.py``
compares one with ``send_task``'s), go to the source queue and are rejected there without
requeue, so the broker itself dead-letters them and writes a real ``x-death`` (reason
``rejected``, queue the source queue). Nothing is written into a DLQ directly: 4.x ignores
``x-`` headers that clients send, and a hand-made x-death would test nothing.
"""

from __future__ import annotations

import json
import random
import time
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

import amqp

from redrive.config import DLQ_SUFFIX, Layout, built_in_layout
from redrive.errors import RabbitMQNodeError
from redrive.sandbox.seeding import sample_tasks

DLX: Final = "onion-dlx"
"""The direct exchange the layout's source queues dead-letter into."""

QueueType = Literal["classic", "quorum"]

CELERY_EMBED: Final = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}

ORIGIN: Final = "gen4242@sandbox"
"""The producer Celery names in ``origin`` (``gen<pid>@<host>``)."""

WAIT_SECONDS: Final = 120.0
"""A bound for a hang, not a pace."""


@dataclass(frozen=True)
class RabbitFamily:
    """A family on RabbitMQ: its source queue, its DLQ, and how one dead-letters into the
    other."""

    name: str
    queue: str
    dlq: str
    dlx: str = DLX
    queue_type: QueueType = "classic"
    dlq_type: QueueType = "classic"
    delivery_limit: int | None = None
    """A quorum source queue's ``x-delivery-limit`` (None: none set)."""
    dlq_delivery_limit: int | None = None
    """A quorum DLQ's own ``x-delivery-limit`` (None: none set)."""

    @property
    def routing_key(self) -> str:
        """The dead-letter routing key: the DLQ's name."""
        return self.dlq

    def queue_arguments(self) -> dict[str, Any]:
        """The source queue's arguments (a Celery ``Queue(queue_arguments=...)`` that
        consumes it must declare the same, or the broker refuses with 406)."""
        arguments: dict[str, Any] = {
            "x-dead-letter-exchange": self.dlx,
            "x-dead-letter-routing-key": self.routing_key,
        }
        if self.queue_type == "quorum":
            arguments["x-queue-type"] = "quorum"
            if self.delivery_limit is not None:
                arguments["x-delivery-limit"] = self.delivery_limit
        return arguments

    def dlq_arguments(self) -> dict[str, Any]:
        if self.dlq_type != "quorum":
            return {}
        if self.dlq_delivery_limit is None:
            return {"x-queue-type": "quorum"}
        return {"x-queue-type": "quorum", "x-delivery-limit": self.dlq_delivery_limit}


def rabbit_families(
    layout: Layout | None = None,
    *,
    queue_type: QueueType = "classic",
    dlq_type: QueueType | None = None,
    delivery_limit: int | None = None,
    dlq_delivery_limit: int | None = None,
    dlx: str = DLX,
) -> list[RabbitFamily]:
    """The layout's families (the built-in one by default: checkout → onion-checkout,
    default → onion, progress → onion-progress) as RabbitMQ families; each DLQ is the
    family's ``dlq`` or its queue's name + ``-dlq``. ``dlq_type`` defaults to
    ``queue_type``."""
    layout = layout if layout is not None else built_in_layout({})
    if delivery_limit is not None and queue_type != "quorum":
        raise RabbitMQNodeError("x-delivery-limit is a quorum queue's: use queue_type='quorum'")
    return [
        RabbitFamily(
            name=family.name,
            queue=family.queue,
            dlq=family.dlq or f"{family.queue}{DLQ_SUFFIX}",
            dlx=dlx,
            queue_type=queue_type,
            dlq_type=dlq_type or queue_type,
            delivery_limit=delivery_limit,
            dlq_delivery_limit=dlq_delivery_limit,
        )
        for family in layout.families
    ]


def open_connection(amqp_url: str) -> amqp.Connection:
    """A py-amqp connection to the URL's vhost (``//`` is ``/``, as kombu reads it)."""
    parts = urllib.parse.urlsplit(amqp_url)
    vhost = urllib.parse.unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    connection = amqp.Connection(
        f"{parts.hostname or '127.0.0.1'}:{parts.port or 5672}",
        userid=urllib.parse.unquote(parts.username or "guest"),
        password=urllib.parse.unquote(parts.password or "guest"),
        virtual_host=vhost,
        connect_timeout=30,
    )
    connection.connect()
    return connection


def raw_channel(connection: amqp.Connection) -> amqp.Channel:
    """A channel that leaves bodies as the broker sent them: py-amqp's channels decode each
    body by its ``content_encoding`` by default (``auto_decode``: a str for Celery's utf-8
    JSON), which is neither byte-exact nor free."""
    channel = amqp.Channel(connection, auto_decode=False)
    channel.open()
    return channel


def declare_layout(channel: amqp.Channel, families: Sequence[RabbitFamily]) -> None:
    """Declare each family's DLX, DLQ (bound to the DLX for its key) and source queue;
    durable, as Celery declares its queues."""
    for family in families:
        channel.exchange_declare(family.dlx, "direct", durable=True, auto_delete=False)
        channel.queue_declare(
            family.dlq, durable=True, auto_delete=False, arguments=family.dlq_arguments()
        )
        channel.queue_bind(family.dlq, family.dlx, routing_key=family.routing_key)
        channel.queue_declare(
            family.queue, durable=True, auto_delete=False, arguments=family.queue_arguments()
        )


# -- Celery's messages ---------------------------------------------------------------------------


def celery_message(
    task: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    task_id: str | None = None,
    eta: datetime | None = None,
    expires: datetime | None = None,
    retries: int = 0,
    now: datetime | None = None,
    reply_to: str | None = None,
) -> amqp.Message:
    """A task message as Celery 5.7 publishes it on RabbitMQ (protocol 2): the task's fields
    in headers, ``correlation_id`` = the task id, no ``message_id`` and no timestamp, the
    bare ``[args, kwargs, embed]`` JSON body, persistent; ``expires`` also becomes the AMQP
    ``expiration`` (milliseconds left), as Celery sets it."""
    task_id = task_id or str(uuid.uuid4())
    args, kwargs = list(args), dict(kwargs or {})
    headers: dict[str, Any] = {
        "lang": "py",
        "task": task,
        "id": task_id,
        "shadow": None,
        "eta": None if eta is None else eta.isoformat(),
        "expires": None if expires is None else expires.isoformat(),
        "group": None,
        "group_index": None,
        "retries": retries,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": repr(args),
        "kwargsrepr": repr(kwargs),
        "origin": ORIGIN,
        "ignore_result": None,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
    }
    properties: dict[str, Any] = {
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "application_headers": headers,
        "delivery_mode": 2,
        "priority": 0,
        "correlation_id": task_id,
        "reply_to": reply_to or str(uuid.uuid3(uuid.NAMESPACE_OID, ORIGIN)),
    }
    if expires is not None:
        left = (expires - (now or datetime.now(UTC))).total_seconds()
        properties["expiration"] = str(max(0, int(left * 1000)))
    body = json.dumps([args, kwargs, CELERY_EMBED]).encode()
    return amqp.Message(body, **properties)


def sample_celery_messages(family: str, count: int, *, seed: int = 7) -> list[amqp.Message]:
    """``count`` of the family's tasks (the SQS sandbox's names and arguments) as Celery
    messages; about one in five is a retry (``retries`` 1-3, an eta a few minutes ago)."""
    rng = random.Random(f"redrive-sandbox-rabbitmq:{family}:{seed}")
    now = datetime.now(UTC)
    out = []
    for task, args, kwargs in sample_tasks(family, count, seed=seed):
        retry = rng.random() < 0.2
        out.append(
            celery_message(
                task,
                args,
                kwargs,
                task_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                retries=rng.randint(1, 3) if retry else 0,
                eta=now - timedelta(minutes=rng.randint(1, 30)) if retry else None,
            )
        )
    return out


# -- dead-lettering --------------------------------------------------------------------------------


class Confirms:
    """Which publishes of a channel in confirm mode are still unconfirmed, by delivery tag
    (1, 2, ... in publish order). The broker does not confirm in tag order: an unroutable
    mandatory publish is acked at once (after its basic.return), a persistent routed one
    after the write to disk, often by a ``multiple`` ack covering earlier tags; so a tag
    is settled only by its own ack or a multiple one at or above it, never by a later
    tag's single ack."""

    def __init__(self) -> None:
        self.next_tag = 1
        self.pending: set[int] = set()
        self.acked = 0
        self.nacked = 0

    def published(self) -> int:
        tag = self.next_tag
        self.pending.add(tag)
        self.next_tag += 1
        return tag

    def settle(self, tag: int, multiple: bool, *, ok: bool) -> None:
        done = {t for t in self.pending if t <= tag} if multiple else {tag} & self.pending
        self.pending -= done
        if ok:
            self.acked += len(done)
        else:
            self.nacked += len(done)


def publish_confirmed(channel: amqp.Channel, queue: str, messages: Sequence[amqp.Message]) -> None:
    """Publish to ``queue`` through the default exchange, ``mandatory``, with publisher
    confirms pipelined (all sent, then the acks read); raise if any is nacked or returned
    (a basic.return arrives before the ack of its publish)."""
    channel.confirm_select()
    confirms = Confirms()
    returned = [0]

    def on_return(*_: Any) -> None:
        returned[0] += 1

    channel.events["basic_ack"].add(lambda tag, multiple: confirms.settle(tag, multiple, ok=True))
    channel.events["basic_nack"].add(lambda tag, multiple: confirms.settle(tag, multiple, ok=False))
    channel.events["basic_return"].add(on_return)
    for message in messages:
        channel.basic_publish(message, exchange="", routing_key=queue, mandatory=True)
        confirms.published()
    while confirms.pending:
        channel.connection.drain_events(timeout=WAIT_SECONDS)
    if confirms.nacked or returned[0]:
        raise RabbitMQNodeError(
            f"publishing to {queue}: {confirms.nacked} nacked, {returned[0]} unroutable"
        )


def queue_depth(channel: amqp.Channel, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).message_count)


def dead_letter(
    connection: amqp.Connection, family: RabbitFamily, messages: Sequence[amqp.Message]
) -> int:
    """Put ``messages`` into the family's DLQ through RabbitMQ's dead-lettering: publish
    them to the (empty) source queue, take each and reject it without requeue. Returns the
    DLQ's depth once all have arrived there."""
    channel = raw_channel(connection)
    try:
        before = queue_depth(channel, family.dlq)
        publish_confirmed(channel, family.queue, messages)
        for _ in messages:
            got = channel.basic_get(family.queue, no_ack=False)
            if got is None:
                raise RabbitMQNodeError(f"{family.queue}: a published message is not there")
            channel.basic_reject(got.delivery_tag, requeue=False)
        expected = before + len(messages)
        deadline = time.monotonic() + WAIT_SECONDS
        while (depth := queue_depth(channel, family.dlq)) < expected:
            if time.monotonic() > deadline:
                raise RabbitMQNodeError(
                    f"{family.dlq}: {depth} of {expected} dead-lettered messages arrived"
                )
            time.sleep(0.05)
        return depth
    finally:
        channel.close()


def fill_layout(
    amqp_url: str, families: Sequence[RabbitFamily], count: int, *, seed: int = 7
) -> dict[str, int]:
    """Declare the families and dead-letter ``count`` sample tasks into each DLQ; the DLQs'
    depths by family name."""
    connection = open_connection(amqp_url)
    try:
        channel = raw_channel(connection)
        declare_layout(channel, families)
        channel.close()
        return {
            family.name: dead_letter(
                connection, family, sample_celery_messages(family.name, count, seed=seed)
            )
            for family in families
        }
    finally:
        connection.close()
