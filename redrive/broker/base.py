"""The broker seam: what every operation needs of a queue, in words no broker owns.

As kombu's transports do, each broker (SQS today) implements one small interface, and
everything above it (the scan, move, purge, replay, inspect, status, check) speaks only this
one. A broker's own handle for a received copy (SQS's receipt handle) is an opaque ``tag``
up here; its own names for queues are opaque addresses (``QueueRef.url``) and ids
(``QueueRef.ident``).

A message is neutral up here, as kombu's are: its body, its :class:`Header` values (name ->
typed value) and the broker's own metadata (:class:`Delivery`'s receive count, death and
enqueue time). Each backend translates its own form (SQS's MessageAttributes, AMQP's
properties and headers) to and from these, byte for byte on a resend.

What a new broker implements: :class:`Broker` (and says what it can in
:class:`Capabilities`, and opens from its row of :data:`redrive.broker.BACKENDS`); the
contract every backend passes is ``tests/test_broker_contract.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

if TYPE_CHECKING:
    from redrive.config import Family, Layout

HeaderKind = Literal["text", "number", "bytes"]
#: How a header's kind is named when a message's size is counted (SQS's measure: the
#: strictest of the brokers, so a copy any of them takes is measured alike).
_KIND_NAMES: Final = {"text": "String", "number": "Number", "bytes": "Binary"}


@dataclass(frozen=True, slots=True)
class Header:
    """One typed value that travels beside a message's body (kombu's message headers): text,
    a number (kept as written: ``0042`` stays ``0042``) or bytes. ``label`` is the
    producer's own name for the value's type where a broker keeps one (SQS's custom types:
    ``Number.int`` is a number labelled ``int``), carried again on every copy."""

    kind: HeaderKind
    value: str | bytes
    label: str = ""
    original: Any = field(default=None, compare=False, repr=False)
    """Opaque: the broker's own form of the value as received (SQS: the MessageAttribute,
    with its field order and the empty list fields a receive gives), which a file format of
    that same form (archives) writes as it came; None: made here."""

    @classmethod
    def text(cls, value: str, label: str = "") -> Header:
        return cls("text", value, label)

    @classmethod
    def number(cls, value: int | str, label: str = "") -> Header:
        return cls("number", str(value), label)

    @classmethod
    def data(cls, value: bytes, label: str = "") -> Header:
        return cls("bytes", bytes(value), label)

    @property
    def as_text(self) -> str | None:
        """The value as text (a number as written); None for bytes."""
        return None if isinstance(self.value, bytes) else self.value

    def size(self, name: str) -> int:
        """Bytes the header counts against a message's size: its name, its type's name
        and its value."""
        kind = _KIND_NAMES[self.kind] + (f".{self.label}" if self.label else "")
        value = self.value if isinstance(self.value, bytes) else self.value.encode("utf-8")
        return len(name.encode("utf-8")) + len(kind.encode()) + len(value)


Headers = Mapping[str, Header]

Outcome = Literal["sent", "refused", "unconfirmed"]
"""One send entry's fate: the broker took it; it refused it (not sent); or the answer that
would tell was lost (possibly sent: in doubt, never counted as sent, never resent blindly)."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One received copy of a message, as the broker gave it."""

    message_id: str
    """The broker's id of the message (the same for every copy of it)."""
    tag: str
    """Opaque: what acknowledges, holds or releases this copy (and only this copy)."""
    body: str
    attributes: Mapping[str, str]
    """The broker's own facts about the message, exactly as it keeps them."""
    headers: Headers
    """What travels with the message besides its body (kept byte-for-byte on every copy
    redrive sends)."""
    receive_count: int = 0
    """How often the broker delivered the message (0: the broker keeps no count)."""
    enqueued_at: float | None = None
    """When the message was first enqueued (epoch seconds), if the broker says."""
    died_in: str | None = None
    """The ident (``QueueRef.ident``) of the queue it was dead-lettered from, if known."""
    group_id: str | None = None
    """Its FIFO group, where the broker keeps groups."""
    hidden_until: float = field(default=0.0, compare=False)
    """``time.monotonic()`` by which the broker may hand this copy out again, as far as the
    receive's own hold goes (counted from before the request: never later than the broker's)."""
    redrive_receives: int = field(default=0, compare=False)
    """How many times redrive received this message, this receive included (0: unknown)."""
    death_reason: str | None = None
    """Why it was last dead-lettered, in the broker's words (RabbitMQ's x-death reasons:
    ``rejected``, ``expired``, ``delivery_limit``, ``maxlen``), where the broker says
    (None: it does not, as SQS)."""
    died_at: float | None = None
    """When it was last dead-lettered (epoch seconds), where the broker says."""
    source_deliveries: int = 0
    """How often its source queue delivered it before dead-lettering it, where the broker
    can tell though it keeps no count in the DLQ (RabbitMQ: a death of reason
    ``delivery_limit`` came after the source's delivery limit + 1 deliveries); 0: not known."""
    parsed: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    """``body``'s JSON object, when the broker made ``body`` by encoding one (RabbitMQ's
    envelope): :func:`redrive.messages.decode` then need not parse it again. Never edited."""
    native: Any = field(default=None, compare=False, repr=False)
    """Opaque: the broker's own form of the message, where ``body`` is an encoding of it
    (RabbitMQ's raw AMQP body and properties, of which ``body`` is kombu's envelope): a
    copy sent unedited goes from this, not from decoding ``body`` again (None: ``body`` is
    the message as the broker keeps it, or the delivery was rebuilt from an archive)."""


def consumer_receives(message: Delivery) -> int:
    """How often consumers other than redrive received the message: the broker's count
    without redrive's own receives, or the deliveries its source made before it died,
    whichever says more (a classic RabbitMQ DLQ counts none: x-delivery-count is the
    quorum source's, and dead-lettering drops it)."""
    return max(0, message.receive_count - message.redrive_receives, message.source_deliveries)


@dataclass(frozen=True, slots=True)
class SendEntry:
    """One message to send: its body and what travels with it, kept as received."""

    id: str
    body: str
    headers: Headers
    group_id: str | None = None
    deduplication_id: str | None = None
    native: Any = field(default=None, compare=False, repr=False)
    """The received copy's ``Delivery.native`` when ``body`` is that copy's own, unedited
    (the broker may send from it); None otherwise."""

    # Measured once: a batch split and the engine's size checks ask several times per entry.
    _size: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_size", self._measure())

    def size(self) -> int:
        """Bytes this entry counts against a message's and a batch's size limit."""
        return self._size

    def _measure(self) -> int:
        total = len(self.body.encode("utf-8"))
        for name, header in self.headers.items():
            total += header.size(name)
        return total


@dataclass(frozen=True, slots=True)
class BatchResult:
    """The per-entry answer to a batched send, acknowledgement or hold change."""

    ok: dict[str, str]
    """Entry id -> the broker's id of the sent message (sends) or ``""`` (the others)."""
    failed: dict[str, str]
    """Entry id -> ``Code: Message`` for every entry not confirmed (including unconfirmed)."""
    unconfirmed: frozenset[str] = frozenset()
    """Entries the answer named in neither list: for a send, possibly sent (in doubt, never
    resent blindly); for an acknowledgement or a hold change, simply not done."""

    def outcome(self, entry_id: str) -> Outcome:
        if entry_id in self.ok:
            return "sent"
        return "unconfirmed" if entry_id in self.unconfirmed else "refused"


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """What a broker counts for a queue, without touching a message."""

    ready: int
    """Waiting to be received."""
    held: int
    """Received and held (in flight)."""
    delayed: int = 0
    """Not yet receivable (a delay)."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a broker can do; the engine decides by these, never by the broker's name."""

    spoken_name: str
    """What people call the broker, in messages to them ("SQS", "RabbitMQ")."""
    key_namespace: str
    """How an idempotency key names a message that is not a Celery task (``NS:<id>:g<n>``);
    a ledger's keys depend on it, so it never changes for a broker."""
    durable_holds: bool
    """A hold outlives the process (a killed run's holds run out by themselves)."""
    receive_count: bool
    """The broker counts deliveries per message."""
    fifo_groups: bool
    """Queues may keep message groups in order (a send names its group)."""
    batch_size: int
    """Entries per send, acknowledgement or hold change."""
    batch_bytes: int
    """Bytes per batched send (bodies and what travels with them)."""
    message_size_limits: tuple[int, ...]
    """Sizes a message may not cross (the smallest first)."""
    max_hold_seconds: int
    """The longest a received copy may be held."""
    native_move: bool
    """The broker moves a whole DLQ back by itself (:attr:`native_mover` does it)."""
    dead_letter_setting: str
    """What the broker calls a queue's link to its DLQ (in messages to people)."""
    receive_limit_setting: str
    """What it calls the deliveries after which a message is dead-lettered."""
    max_message_attributes: int
    """Headers a message may carry (redrive's own marks go only where there is room)."""
    archived_attributes: tuple[str, ...]
    """The broker's own facts (``Delivery.attributes``) an archive keeps; the rest is noise
    or identifies callers, so it stays out of long-lived archives."""
    declared_by_consumers: bool = False
    """Queues and their dead-lettering are what their consumers declare (AMQP): a Celery
    worker's queue declarations decide whether a queue has a DLQ at all."""
    receive_limit_way_out: str = ""
    """How to raise or remove a queue's receive limit, for people (``{name}``: the queue's
    name, ``{scope}``: its ident without the name, e.g. a vhost)."""
    release_lands_later: bool = False
    """A release returns before the copies are back in the queue's ready count (AMQP's
    reject and nack have no reply; RabbitMQ's releases even wait to go as one until the
    broker's next call or count): a scan's end counts until they are back, so that the
    command after it (a move right after an inspect) sees every message."""
    native_mover: str = ""
    """``module:factory`` that makes the broker's own mover of a whole DLQ from the broker
    (:func:`redrive.broker.native.native_mover`; imported only when asked for)."""
    shared_by_threads: bool = False
    """One broker may serve every worker thread of a run, instead of one each (SQS's lean
    path: one thread-safe transport with a pool of keep-alive connections)."""


@dataclass(frozen=True, slots=True)
class QueueRef:
    url: str
    """The broker's address of the queue (opaque above the broker)."""
    name: str
    ident: str
    """The broker's id of the queue (what ``Delivery.died_in`` names; SQS: its ARN)."""
    fifo: bool
    dead_letter_target: str | None = None
    """The ident of the DLQ this queue dead-letters into, if it has one."""
    max_receive_count: int | None = None
    """Deliveries after which the broker dead-letters a message, if it says."""
    retention_seconds: int | None = None
    receive_limit_origin: str = ""
    """Where ``max_receive_count`` comes from, as words that follow the number in a sentence
    (`` from policy P``; ``""``: not said)."""


@dataclass(frozen=True, slots=True)
class DlqTarget:
    """A DLQ to work on and the queue(s) that dead-letter into it."""

    label: str
    """The family name, or the DLQ's name when the target was a queue."""
    family: Family | None
    dlq: QueueRef
    sources: tuple[QueueRef, ...]

    def source_for(self, ident: str) -> QueueRef | None:
        for source in self.sources:
            if source.ident == ident:
                return source
        return None

    @property
    def single_source(self) -> QueueRef | None:
        return self.sources[0] if len(self.sources) == 1 else None

    @property
    def region(self) -> str | None:
        """The DLQ's own region (a family may name one); None: the default."""
        return self.family.region if self.family is not None else None


class Broker(Protocol):
    """A broker's queues, as every operation uses them. Failures per entry are returned,
    never dropped; a call that fails as a whole raises a :class:`redrive.errors.RedriveError`
    (:class:`redrive.errors.SendInDoubt` for a send whose fate is unknown)."""

    capabilities: Capabilities
    throttled: int
    """Sends the broker refused as too many (and that were retried)."""

    def describe(self, name_or_address: str) -> QueueRef:
        """A queue by name, address or ident; :class:`redrive.errors.QueueNotFound` if none."""
        ...

    def resolve(
        self, layout: Layout, target: str, broker_for: Callable[[str | None], Broker]
    ) -> DlqTarget:
        """A TARGET (family, source queue or DLQ) as a DLQ and its source queues;
        ``broker_for(region)`` gives the broker of a family's region (None: this one's)."""
        ...

    def resolve_family(self, family: Family) -> DlqTarget: ...

    def dlq_of(self, source: QueueRef) -> QueueRef:
        """The DLQ a source queue dead-letters into (:class:`redrive.errors.RedriveError`
        when it has none, or it is gone)."""
        ...

    def queues_named(self, prefix: str) -> list[str]:
        """The addresses of every queue whose name starts with ``prefix``."""
        ...

    def counts(self, queue: str) -> QueueCounts: ...

    def exact_ready(self, queue: str) -> int | None:
        """How many messages wait in the queue, counted exactly and at once (a RabbitMQ
        passive declare); None where the broker only estimates (SQS's approximate counts
        lag its receives and deletes)."""
        ...

    def receive(
        self, queue: str, *, hold: int, wait_seconds: int = 1, max_messages: int = 10
    ) -> list[Delivery]:
        """Up to ``max_messages`` copies, each held from others for ``hold`` seconds."""
        ...

    def extend(self, queue: str, tags: Mapping[str, str], seconds: int) -> BatchResult:
        """Hold copies (entry id -> tag) for ``seconds`` more from now."""
        ...

    def release(self, queue: str, tags: Mapping[str, str]) -> BatchResult:
        """Give copies back: they may be received again (at once, or where
        ``capabilities.release_lands_later``, by the broker's next call or count)."""
        ...

    def send(self, queue: str, entries: Sequence[SendEntry]) -> BatchResult:
        """Send one batch (at most ``capabilities.batch_size`` entries)."""
        ...

    def ack(self, queue: str, tags: Mapping[str, str]) -> BatchResult:
        """Remove copies from their queue for good."""
        ...

    def purge(self, queue: str) -> None:
        """Empty a queue at once (every message, unread)."""
        ...

    def restored(
        self, message_id: str, body: str, attributes: Mapping[str, str], headers: Headers
    ) -> Delivery:
        """A delivery rebuilt from what an archive kept of it (no tag: nothing to ack)."""
        ...


def split_batches(entries: Sequence[SendEntry], limits: Capabilities) -> Iterator[list[SendEntry]]:
    """Groups of at most ``batch_size`` entries whose payload stays within ``batch_bytes``."""
    batch: list[SendEntry] = []
    size = 0
    for entry in entries:
        entry_size = entry.size()
        if batch and (len(batch) == limits.batch_size or size + entry_size > limits.batch_bytes):
            yield batch
            batch, size = [], 0
        batch.append(entry)
        size += entry_size
    if batch:
        yield batch


def queue_name(address_or_ident: str) -> str:
    """A queue's name from its address or ident (the last part of either)."""
    return address_or_ident.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
