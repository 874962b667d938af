"""The layout's queues and DLQs, and the sample Celery tasks dead-lettered into them: each
DLQ holds what SQS leaves there, enqueued at times that tell the runbooks' stories."""

from __future__ import annotations

import collections
import json
import math
import random
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from moto.sqs.models import Message, Queue, sqs_backends

from redrive.broker.base import Header, SendEntry, queue_name
from redrive.broker.sqs.calls import request_entry, split_batches
from redrive.broker.sqs.headers import attributes_of, headers_of
from redrive.config import DLQ_SUFFIX, Family, Layout
from redrive.messages import decode
from redrive.sandbox.encoder import encode
from redrive.sandbox.server import sandbox_session, server_at

# SQS's limits for the attributes create_layout sets.
_MAX_RECEIVE_RANGE: Final = range(1, 1001)


_RETENTION_RANGE: Final = range(60, 14 * 86400 + 1)


#: The most messages ``redrive sandbox`` seeds into each DLQ.
MAX_MESSAGES: Final = 10_000


@dataclass(frozen=True, slots=True)
class Story:
    """Why a group of messages is in a DLQ, told by when they were enqueued."""

    name: str
    newest: timedelta
    """How long before the seeding the newest of them was enqueued."""
    oldest: timedelta
    label: str


# What the runbooks diagnose (runbooks/draining-an-sqs-dead-letter-queue.md, step 2), inside
# the DLQ's 14-day retention with days to spare (a sandbox may run for a while).
STORIES: Final = {
    "blip": Story(
        "blip",
        timedelta(hours=2),
        timedelta(hours=2, minutes=4),
        "deploy blip 2 h ago, within 4 min",
    ),
    "outage": Story(
        "outage",
        timedelta(hours=26),
        timedelta(hours=27),
        "outage yesterday, over 1 h",
    ),
    "poison": Story(
        "poison",
        timedelta(hours=7),
        timedelta(days=5),
        "poison over 5 days",
    ),
    # Checkout and progress tasks published to the default queue before the onion split
    # moved them to queues of their own (redrive.sandbox.celery_app routes them there now),
    # and a task deleted since: in the default DLQ, every message of theirs is this old.
    "split": Story(
        "split",
        timedelta(days=3),
        timedelta(days=3, hours=1),
        "before the onion split, 3 days ago",
    ),
}


# Of a task whose story is not the blip, this share tells its own story; the rest were
# caught by the blip too (a rollout kills whatever runs).
_OWN_STORY_SHARE: Final = 0.5


# Tasks per built-in family, with a weight (how many of every cycle of messages run it) and
# its story: real DLQs are dominated by one or two tasks.
_TASKS: Final[dict[str, tuple[tuple[str, int, str], ...]]] = {
    "checkout": (
        ("apps.webhooks.tasks.save_checkout_ibft", 3, "blip"),
        ("apps.payments.tasks.capture_payment", 2, "outage"),
        ("apps.payments.tasks.refund", 1, "poison"),
    ),
    "default": (
        ("apps.notifications.tasks.send_email", 3, "outage"),
        ("apps.users.tasks.activate_user", 2, "blip"),
        ("apps.reports.tasks.export_csv", 1, "poison"),
        ("apps.webhooks.tasks.save_checkout_ibft", 1, "split"),
        ("apps.engagements.tasks.save_progress_lesson", 1, "split"),
        ("apps.inventory.tasks.resync_stock", 1, "split"),  # the app registers it no more
    ),
    "progress": (
        ("apps.engagements.tasks.save_progress_lesson", 3, "blip"),
        ("apps.engagements.tasks.save_progress_quiz", 2, "outage"),
    ),
}


# Messages in a source queue at once while dead-lettering (see dead_letter): one batch was
# fastest against moto 5.2 (40 a family: 0.9 s at 10, 1.3 s at 50; 200: 4 s at 10, 11 s at 100).
_CHUNK: Final = 10


# Between a message's enqueue and its first receive by a worker.
_FIRST_RECEIVE_DELAY_MS: Final = range(200, 20_000)


_NAMES: Final = ("Ana", "Bilal", "Zoë", "Kenji", "Amara", "Lucía", "Omar", "Priya")


# -- queues ---------------------------------------------------------------------------------


def create_layout(
    client: Any,
    layout: Layout,
    *,
    max_receive_count: int | None = None,
    dlq_retention_seconds: int | None = None,
) -> list[tuple[Family, str, str]]:
    """Create each family's queue and DLQ; returns ``(family, queue_url, dlq_url)`` per family.

    The queue is the family's queue name (the last part of a URL); the DLQ is the family's
    ``dlq`` when the config names one, else ``{queue}-dlq`` (``{base}-dlq.fifo`` for FIFO
    queues). maxReceiveCount and the DLQ's retention come from the family unless given here.
    Running it again changes nothing but those two attributes. A family with a ``region``
    gets its queues in that region, where redrive will look for them.
    """
    created: list[tuple[Family, str, str]] = []
    clients: dict[str, Any] = {}
    try:
        for family in layout.families:
            regional = _regional_client(client, family.region, clients)
            receives = family.max_receive_count if max_receive_count is None else max_receive_count
            retention = (
                family.dlq_retention_seconds
                if dlq_retention_seconds is None
                else dlq_retention_seconds
            )
            queue_url, dlq_url = _create_family(
                regional, family, max_receive_count=receives, dlq_retention_seconds=retention
            )
            created.append((family, queue_url, dlq_url))
    finally:
        for extra in clients.values():
            extra.close()
    return created


def _create_family(
    client: Any, family: Family, *, max_receive_count: int, dlq_retention_seconds: int
) -> tuple[str, str]:
    if max_receive_count not in _MAX_RECEIVE_RANGE:
        raise ValueError(
            f"family {family.name}: maxReceiveCount must be 1 to 1000, not {max_receive_count}"
        )
    if dlq_retention_seconds not in _RETENTION_RANGE:
        raise ValueError(
            f"family {family.name}: DLQ retention must be 60 s to 14 days, "
            f"not {dlq_retention_seconds} s"
        )
    name = queue_name(family.queue)
    fifo = name.endswith(".fifo")
    dlq_name = queue_name(family.dlq) if family.dlq else _dlq_name(name)
    if dlq_name.endswith(".fifo") != fifo:
        raise ValueError(
            f"family {family.name}: {name} and its DLQ {dlq_name} must both be FIFO or both not"
        )
    # Only FifoQueue at creation: CreateQueue fails when an existing queue has other
    # attributes, and setting the rest afterwards makes a rerun converge instead.
    create_attrs = {"FifoQueue": "true"} if fifo else {}
    dlq_url = str(client.create_queue(QueueName=dlq_name, Attributes=create_attrs)["QueueUrl"])
    client.set_queue_attributes(
        QueueUrl=dlq_url, Attributes={"MessageRetentionPeriod": str(dlq_retention_seconds)}
    )
    dlq_arn = client.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    queue_url = str(client.create_queue(QueueName=name, Attributes=create_attrs)["QueueUrl"])
    policy = {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": max_receive_count}
    client.set_queue_attributes(
        QueueUrl=queue_url, Attributes={"RedrivePolicy": json.dumps(policy)}
    )
    return queue_url, dlq_url


def _dlq_name(name: str) -> str:
    if name.endswith(".fifo"):
        return f"{name.removesuffix('.fifo')}{DLQ_SUFFIX}.fifo"
    return f"{name}{DLQ_SUFFIX}"


def _regional_client(client: Any, region: str | None, cache: dict[str, Any]) -> Any:
    """``client``, or one like it in ``region`` (kept in ``cache`` for the caller to close)."""
    if region is None or region == client.meta.region_name:
        return client
    if region not in cache:
        # region_name again: the copied config carries the other client's region, and
        # botocore prefers it to the session's.
        cache[region] = sandbox_session(region).client(
            "sqs",
            region_name=region,
            endpoint_url=client.meta.endpoint_url,
            config=client.meta.config,
        )
    return cache[region]


# -- messages -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SampleMessage:
    """One message of a sample DLQ: what was sent, when, and the story it belongs to."""

    body: str
    attributes: dict[str, Any]
    sent_at: datetime
    """Its enqueue time (SentTimestamp)."""
    story: str
    """A key of :data:`STORIES`."""


def sample_messages(
    family: str,
    count: int,
    *,
    seed: int = 7,
    now: datetime | None = None,
    queue: str | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """``count`` (Body, MessageAttributes) pairs like a real DLQ of ``family`` holds: the
    messages of :func:`sample_dlq` without their enqueue times."""
    return [
        (m.body, m.attributes) for m in sample_dlq(family, count, seed=seed, now=now, queue=queue)
    ]


def sample_dlq(
    family: str,
    count: int,
    *,
    seed: int = 7,
    now: datetime | None = None,
    queue: str | None = None,
) -> list[SampleMessage]:
    """``count`` messages like a real DLQ of ``family`` holds, with their enqueue times.

    Mostly protocol 2, about one in six protocol 1, a few already expired, a few with an
    eta, a couple compressed, one kombu envelope without the outer base64, one or two bodies
    no Celery wrote (plain JSON, plain text: grouped as "(unknown)"), and one with producer
    message attributes. Small counts get fewer kinds. Enqueue times tell :data:`STORIES`:
    most messages, of every task, in the deploy blip; about half of the family's outage task
    in the outage and half of its poison task in the poison story. The tasks, ids,
    arguments and times depend only on the arguments (``now`` defaults to the current
    time); kombu's random delivery_tag and the expiration property (time left, computed by
    ``encode``) do not. ``queue`` is the routing key in each envelope (the family's name by
    default).
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, not {count}")
    rng = random.Random(f"redrive-sandbox:{family}:{seed}")
    moment = now if now is not None else datetime.now(UTC)
    routing_key = queue or family
    tasks = _task_cycle(family, count, rng)

    kinds = _kinds(count, rng)
    with_attributes = next((i for i, kind in enumerate(kinds) if kind == "plain"), None)
    compressions = iter(("gzip", "bzip2") * count)
    stories = _stories(family, tasks, kinds, rng)
    sent = [_enqueue_time(STORIES[story], moment, rng) for story in stories]

    out: list[SampleMessage] = []
    for index, (kind, task) in enumerate(zip(kinds, tasks, strict=True)):
        attributes: dict[str, Any] = {}
        if kind == "text":
            body = f"legacy cron {rng.randint(1000, 9999)}: resync inventory for store {index}"
        elif kind == "json":
            body = json.dumps(
                {"event": "order.created", "order_id": rng.randint(10_000, 99_999), "v": 1}
            )
        else:
            args, kwargs = _arguments(task, rng)
            options = _encode_options(kind, routing_key, moment, sent[index], compressions, rng)
            body = encode(task, args, kwargs, **options)
            if index == with_attributes:
                attributes = _producer_attributes(rng)
        out.append(SampleMessage(body, attributes, sent[index], stories[index]))
    return out


def sample_tasks(
    family: str, count: int, *, seed: int = 7
) -> list[tuple[str, list[Any], dict[str, Any]]]:
    """``count`` (task, args, kwargs) of ``family``'s tasks in its DLQ's proportions, with
    realistic arguments: what a broker without SQS's envelope (RabbitMQ's sandbox) seeds."""
    rng = random.Random(f"redrive-sandbox:{family}:{seed}:tasks")
    out: list[tuple[str, list[Any], dict[str, Any]]] = []
    for task in _task_cycle(family, count, rng):
        args, kwargs = _arguments(task, rng)
        out.append((task, args, kwargs))
    return out


def _kinds(count: int, rng: random.Random) -> list[str]:
    """Which kind of message each slot holds: each kind takes its own slots, chosen at
    random, so a DLQ listing looks mixed; small counts get fewer kinds."""
    kinds: list[str] = []
    for kind, many in (
        ("text", 1 if count >= 10 else 0),
        ("json", 1 if count >= 4 else 0),
        ("compressed", 2 if count >= 20 else 1 if count >= 8 else 0),
        ("raw-envelope", 1 if count >= 16 else 0),
        ("expired", max(1, count // 12) if count >= 6 else 0),
        ("eta", max(1, count // 15) if count >= 8 else 0),
        ("protocol-1", count // 6),
    ):
        kinds.extend([kind] * many)
    kinds = kinds[:count]
    kinds.extend(["plain"] * (count - len(kinds)))
    rng.shuffle(kinds)
    return kinds


def _encode_options(
    kind: str,
    routing_key: str,
    moment: datetime,
    sent: datetime,
    compressions: Iterator[str],
    rng: random.Random,
) -> dict[str, Any]:
    """The encoder's options for one Celery message of ``kind`` sent at ``sent``."""
    options: dict[str, Any] = {
        "task_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        "retries": rng.choice((0, 0, 0, 1, 2, 3)),
        "queue": routing_key,
    }
    if kind == "protocol-1":
        options["protocol"] = 1
    elif kind == "expired":
        # It expired while it sat in the DLQ: after it was sent, before now.
        waited = (moment - sent).total_seconds()
        options["expires"] = sent + timedelta(seconds=rng.uniform(0.1, 0.9) * waited)
    elif kind == "eta":
        # ETAs past and future: both end up in DLQs (a worker held it too long).
        options["eta"] = moment + timedelta(minutes=rng.choice((-1, 1)) * rng.randint(10, 600))
    elif kind == "compressed":
        options["compression"] = next(compressions)
    elif kind == "raw-envelope":
        options["base64_envelope"] = False
    elif rng.random() < 0.2:
        options["expires"] = moment + timedelta(hours=rng.randint(1, 48))
    return options


def _producer_attributes(rng: random.Random) -> dict[str, Any]:
    """Message attributes a producer set (a trace id, a tenant), which a move keeps."""
    trace = Header.text(f"{rng.getrandbits(128):032x}")
    return attributes_of({"trace-id": trace, "tenant-id": Header.number(rng.randint(1, 500))})


def _family_tasks(family: str) -> tuple[tuple[str, int, str], ...]:
    weighted = _TASKS.get(family)
    if weighted is None:
        slug = re.sub(r"\W+", "_", family).strip("_").lower() or "jobs"
        weighted = (
            (f"apps.{slug}.tasks.process", 3, "blip"),
            (f"apps.{slug}.tasks.sync", 1, "outage"),
        )
    return weighted


def _task_cycle(family: str, count: int, rng: random.Random) -> list[str]:
    """``count`` task names in the family's proportions, shuffled."""
    cycle = [name for name, weight, _ in _family_tasks(family) for _ in range(weight)]
    names = (cycle * (count // len(cycle) + 1))[:count]
    rng.shuffle(names)
    return names


def _stories(family: str, tasks: list[str], kinds: list[str], rng: random.Random) -> list[str]:
    """The story of each message: a task with a story of its own tells it with about
    ``_OWN_STORY_SHARE`` of its messages (one of two or more, at least), the rest and every
    body no Celery wrote are the blip's."""
    stories = ["blip"] * len(tasks)
    for task, _, story in _family_tasks(family):
        if story == "blip":
            continue
        mine = [
            i
            for i, (name, kind) in enumerate(zip(tasks, kinds, strict=True))
            if name == task and kind not in ("text", "json")
        ]
        own = max(1 if len(mine) >= 2 else 0, round(len(mine) * _OWN_STORY_SHARE))
        if story == "split":
            own = len(mine)  # published before the split: none of them later
        for index in rng.sample(mine, own):
            stories[index] = story
    return stories


def _enqueue_time(story: Story, now: datetime, rng: random.Random) -> datetime:
    # Whole milliseconds, as SentTimestamp has them.
    span_ms = int((story.oldest - story.newest).total_seconds() * 1000)
    before = story.newest + timedelta(milliseconds=rng.randint(0, span_ms))
    moment = now - before
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def _arguments(task: str, rng: random.Random) -> tuple[list[Any], dict[str, Any]]:
    short = task.rsplit(".", 1)[-1]
    ident = rng.randint(1_000, 999_999)
    name = rng.choice(_NAMES)
    if short == "save_checkout_ibft":
        return [ident], {
            "payload": {
                "reference": f"IBFT-{rng.getrandbits(40):010X}",
                "amount": f"{rng.randint(100, 250_000)}.00",
                "currency": "PKR",
            }
        }
    if short == "capture_payment":
        return [ident], {"amount_cents": rng.randint(100, 500_000), "currency": "USD"}
    if short == "refund":
        return [ident], {"reason": rng.choice(("customer_request", "duplicate", "fraud"))}
    if short == "send_email":
        return [f"{name.lower()}@example.com", rng.choice(("welcome", "receipt", "reset"))], {
            "context": {"name": name}
        }
    if short == "activate_user":
        return [ident], {}
    if short == "export_csv":
        return [ident], {"columns": ["id", "email", "created_at"], "requested_by": name}
    if short == "save_progress_lesson":
        return [ident, f"lesson-{rng.randint(1, 40)}", round(rng.random(), 2)], {}
    if short == "resync_stock":
        return [f"store-{rng.randint(1, 90)}"], {"full": rng.random() < 0.5}
    if short == "save_progress_quiz":
        return [ident, f"quiz-{rng.randint(1, 12)}"], {"score": rng.randint(0, 10), "out_of": 10}
    return [ident], {}


# -- dead-lettering -------------------------------------------------------------------------


def dead_letter(client: Any, queue_url: str, entries: Sequence[tuple[str, dict[str, Any]]]) -> int:
    """Put ``entries`` into the DLQ of ``queue_url`` the way SQS does; returns how many arrived.

    Sends them to the source queue, then receives (VisibilityTimeout 0, never deleting)
    until the queue is empty: a message received maxReceiveCount times is moved to the
    DLQ on the next receive. Every message already in the source queue goes too.
    """
    attrs = client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["RedrivePolicy"])
    raw_policy = attrs.get("Attributes", {}).get("RedrivePolicy")
    if not raw_policy:
        raise ValueError(f"{queue_name(queue_url)} has no RedrivePolicy, so it has no DLQ")
    policy = json.loads(raw_policy)
    max_receives = int(policy["maxReceiveCount"])
    dlq_url = str(
        client.get_queue_url(QueueName=queue_name(policy["deadLetterTargetArn"]))["QueueUrl"]
    )
    before = _depth(client, dlq_url)

    fifo = queue_url.endswith(".fifo")
    send = [
        SendEntry(
            id=str(index),
            body=body,
            headers=headers_of(attributes),
            # kombu's defaults: one group, a random deduplication id (a fixed one would make
            # SQS drop a second seeding within its 5 minute window).
            group_id="default" if fifo else None,
            deduplication_id=uuid.uuid4().hex if fifo else None,
        )
        for index, (body, attributes) in enumerate(entries)
    ]
    # moto checks every message it hands out against the queue's attributes, which it
    # computes over the whole queue: a receive costs O(queue depth) per message. Keeping
    # at most one chunk in the source queue keeps seeding linear in the message count.
    for first in range(0, len(send), _CHUNK):
        chunk = send[first : first + _CHUNK]
        for batch in split_batches(chunk):
            _send(client, queue_url, batch)
        _receive_until_empty(client, queue_url, len(chunk), max_receives, fifo=fifo)
    if not send:
        _receive_until_empty(client, queue_url, 0, max_receives, fifo=fifo)
    return _depth(client, dlq_url) - before


def _send(client: Any, queue_url: str, batch: Sequence[SendEntry]) -> None:
    response = client.send_message_batch(
        QueueUrl=queue_url, Entries=[request_entry(entry) for entry in batch]
    )
    failed = response.get("Failed", [])
    if failed:
        first = failed[0]
        raise RuntimeError(
            f"SendMessageBatch to {queue_name(queue_url)} refused {len(failed)} messages: "
            f"{first.get('Code')}: {first.get('Message')}"
        )


def _receive_until_empty(
    client: Any, queue_url: str, count: int, max_receives: int, *, fifo: bool
) -> None:
    """Receive without deleting until moto has moved every message of the queue to the DLQ."""
    # Each call hands out up to 10 messages; each needs max_receives calls plus one that
    # moves it. A FIFO group can make a call return fewer: allow slack, but stay bounded.
    rounds = (math.ceil(count / 10) + 2) * (max_receives + 1) * (3 if fifo else 1) + 20
    for _ in range(rounds):
        got = client.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=0, WaitTimeSeconds=0
        ).get("Messages", [])
        if not got and _depth(client, queue_url) == 0:
            return


def _depth(client: Any, url: str) -> int:
    attrs = client.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    return sum(int(value) for value in attrs.values())


@dataclass(frozen=True, slots=True)
class SeededFamily:
    family: str
    queue_url: str
    dlq_url: str
    messages: int
    """How many messages this seeding put into the DLQ."""
    by_task: dict[str, int]
    """Task name (``(unknown)`` for bodies Celery did not write) -> how many of them."""
    by_story: dict[str, int] = field(default_factory=dict)
    """Key of :data:`STORIES` -> how many of them, in the order of STORIES."""


def seed(
    client: Any,
    layout: Layout,
    *,
    per_family: int = 40,
    seed: int = 7,
    now: datetime | None = None,
) -> list[SeededFamily]:
    """Create the layout's queues and dead-letter ``per_family`` sample messages into each DLQ.

    ``client`` must be a client of a server this process started with the extensions
    (:func:`start_server`): the messages are dead-lettered in its moto backend, which is
    fast at any depth, and dated as :func:`sample_dlq` says (``now`` defaults to the current
    time), which only the backend can do: SQS dates what it is sent itself. Each message is
    sent to the source queue by moto's SendMessage, given the receive count and first
    receive time that ``maxReceiveCount`` receives give it, and moved to the DLQ by moto's
    own dead-letter step. :func:`dead_letter` does the same through the API, receiving each
    message for real, at moto's pace and with the current time. Seeding again adds as many
    again. Raises ValueError for a client of any other server.
    """
    if per_family < 0:
        raise ValueError(f"per_family must be >= 0, not {per_family}")
    server = server_at(str(client.meta.endpoint_url).rstrip("/"))
    if server is None or not server.extended:
        raise ValueError(
            "seed() needs a client of a sandbox server started in this process with "
            "start_server(extended=True); dead_letter() works with any server"
        )
    moment = now if now is not None else datetime.now(UTC)
    seeded: list[SeededFamily] = []
    for family, queue_url, dlq_url in create_layout(client, layout):
        region = family.region or str(client.meta.region_name)
        entries = sample_dlq(
            family.name, per_family, seed=seed, now=moment, queue=queue_name(queue_url)
        )
        moved = _dead_letter_in_backend(
            queue_url, region, entries, random.Random(f"{seed}:{family.name}")
        )
        if moved != len(entries):
            raise RuntimeError(
                f"sandbox: only {moved} of {len(entries)} messages reached {queue_name(dlq_url)}"
            )
        by_task = collections.Counter(decode(m.body).task for m in entries)
        by_story = collections.Counter(m.story for m in entries)
        seeded.append(
            SeededFamily(
                family=family.name,
                queue_url=queue_url,
                dlq_url=dlq_url,
                messages=moved,
                by_task=dict(sorted(by_task.items(), key=lambda item: (-item[1], item[0]))),
                by_story={story: by_story[story] for story in STORIES if by_story[story]},
            )
        )
    return seeded


def _dead_letter_in_backend(
    queue_url: str, region: str, entries: Sequence[SampleMessage], rng: random.Random
) -> int:
    account = queue_url.rstrip("/").split("/")[-2]
    backend = sqs_backends[account][region]
    source: Queue = backend.get_queue(queue_name(queue_url))
    dlq: Queue | None = source.dead_letter_queue
    if dlq is None or not source.redrive_policy:
        raise ValueError(f"{source.name} has no RedrivePolicy, so it has no DLQ")
    max_receives = int(source.redrive_policy["maxReceiveCount"])
    before = len(dlq._messages)
    for entry in entries:
        message: Message = backend.send_message(
            source.name,
            entry.body,
            message_attributes=json.loads(json.dumps(entry.attributes)),
            # kombu's defaults: one group, a random deduplication id.
            group_id="default" if source.fifo_queue else None,
            deduplication_id=uuid.uuid4().hex if source.fifo_queue else None,
        )
        sent_ms = int(entry.sent_at.timestamp() * 1000)
        message.sent_timestamp = sent_ms  # type: ignore[assignment]
        # What maxReceiveCount receives leave on a message (moto's Message.mark_received) ...
        message.approximate_first_receive_timestamp = sent_ms + rng.choice(_FIRST_RECEIVE_DELAY_MS)
        message.approximate_receive_count = max_receives
        # ... and what moto's receive does with it next (SQSBackend.receive_message).
        source._messages.remove(message)
        dlq.add_message(message)
    return len(dlq._messages) - before
