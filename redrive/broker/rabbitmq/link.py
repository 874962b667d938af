"""The process's AMQP connections to one broker URL (py-amqp): :class:`Lane` s, two per broker.

AMQP channels are not thread-safe and a delivery tag belongs to the channel it came on.
Every ``--workers`` thread has a broker of its own, so each broker takes a lane for its
receives (and a second for its publishes: a lane's calls wait under its lock, and a
worker's next receive and this batch's confirms then wait at once): a connection
of its own with a ``work`` channel (gets, acks, publishes with confirms) and a ``probe``
channel (passive declares, purges: a missing queue closes the channel it was asked on, and
must never close the one holding the scan's deliveries), behind the lane's own lock. Workers
then never wait on each other's round trips (one shared channel serialised every receive,
publish and ack of a run: bench/README.md). A broker's lane goes back to the link's idle
lanes when the broker is gone, for the next broker (connections stay as many as brokers
alive at once), and its held deliveries stay held.

A copy's tag is ``<lane>.<channel generation>:<delivery tag>``, and whichever broker or
thread acks, holds or releases it, that goes to the lane and channel it came on (a scan
gives back at its end, from one thread, what every worker holds). Once that channel is gone,
its deliveries are back in their queue, and acknowledging or releasing one of them fails for
that entry (never raises, never pretends). The tags still unacked on each channel are
tracked, because an unknown tag would close the channel (and with it every hold), and
because an ack or release of a batch that is exactly the channel's lowest unacked tags can
be one ``multiple`` ack or nack.

A release is not sent at once: released tags wait until the lane next does anything else,
or until the link is told to send them (every count does), and then go as one ``multiple``
nack for all of them below the lowest tag still held (those above it one by one). RabbitMQ's
cost per nack grows with what the queue holds: a scan's end that gave 100,000 held copies
back in batches of 100 took RabbitMQ 3.10 70 s to take back (1,000 nacks), where one nack
of them all took 2 s (bench/README.md), and a scan's holds come back in any order of
batches. Waiting is safe: the copies stay unacked on the broker until the nack goes, a
channel or connection that closes first gives them back all the same, and a ``multiple``
ack never goes before it (it would take them).
"""

from __future__ import annotations

import atexit
import contextlib
import re
import ssl
import threading
import time
import urllib.parse
from array import array
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

import amqp
import amqp.exceptions
from amqp import spec

from redrive.broker.base import BatchResult
from redrive.broker.rabbitmq.frames import Connection, Outgoing, publisher
from redrive.broker.rabbitmq.held import HeldTags
from redrive.broker.rabbitmq.properties import Received
from redrive.errors import BrokerUnavailable, HoldsTimedOut, QueueNotFound

#: How long a batch's publisher confirms may take before its unconfirmed entries are in doubt.
CONFIRM_TIMEOUT: Final = 30.0
#: How long a receive waits for the deliveries a consumer window was promised.
DELIVERY_TIMEOUT: Final = 2.0
#: How long a receive waits for its next delivery before it asks whether any are still
#: ready (a count, not a verdict: a slow broker only costs a passive declare).
READY_CHECK: Final = 0.05
CONNECT_TIMEOUT: Final = 10.0
#: Connection failures: the lane's connection is dropped and made again on its next call.
LINK_ERRORS: Final = (
    OSError,
    amqp.exceptions.ConnectionError,
    amqp.exceptions.IrrecoverableConnectionError,
)
GONE: Final = "StaleTag: the channel it was received on is gone"


@dataclass(frozen=True, slots=True)
class AmqpAddress:
    host: str
    port: int
    user: str
    password: str
    vhost: str
    tls: bool

    @classmethod
    def parse(cls, url: str) -> AmqpAddress:
        """``amqp://``, ``amqps://`` or ``pyamqp://`` (Celery's forms); ``//`` is vhost ``/``."""
        parts = urllib.parse.urlsplit(url)
        tls = parts.scheme.lower() == "amqps"
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        return cls(
            host=parts.hostname or "localhost",
            port=parts.port or (5671 if tls else 5672),
            user=urllib.parse.unquote(parts.username or "guest"),
            password=urllib.parse.unquote(parts.password or "guest"),
            vhost=urllib.parse.unquote(path) if path else "/",
            tls=tls,
        )


@dataclass(frozen=True, slots=True)
class Tag:
    """A copy's tag, read: the lane, the channel's generation on it, the delivery tag."""

    lane: int
    generation: int
    delivery: int

    @classmethod
    def parse(cls, tag: str) -> Tag | None:
        channel, _, number = tag.partition(":")
        lane, _, generation = channel.partition(".")
        if not (lane.isdigit() and generation.isdigit() and number.isdigit()):
            return None
        return cls(int(lane), int(generation), int(number))


@dataclass(slots=True)
class Got:
    """One delivery as py-amqp gave it."""

    tag: str
    body: bytes
    properties: dict[str, Any]
    exchange: str
    routing_key: str
    redelivered: bool
    received: Received | None = None
    """Its headers as they were in the frame (a resend copies the unchanged ones)."""


@dataclass(slots=True)
class _Publish:
    entry_id: str
    content: tuple[str, bytes]
    state: str = "pending"  # pending, ack, nack
    returned: str | None = None


@dataclass(slots=True)
class _Confirms:
    by_seq: dict[int, _Publish] = field(default_factory=dict)
    by_content: dict[tuple[str, bytes], list[_Publish]] = field(default_factory=dict)
    pending: int = 0

    def settle(self, tag: int, multiple: bool, state: str) -> None:
        seqs = [s for s in self.by_seq if s <= tag] if multiple else [tag]
        for seq in seqs:
            publish = self.by_seq.get(seq)
            if publish is not None and publish.state == "pending":
                publish.state = state
                self.pending -= 1

    def returned(self, routing_key: str, body: bytes, why: str) -> None:
        for publish in self.by_content.get((routing_key, body), []):
            if publish.returned is None:
                publish.returned = why
                return


class Lane:
    """One connection of the link and its channels (see the module's docstring); its calls
    are thread-safe (one at a time, under its lock)."""

    def __init__(self, address: AmqpAddress, masked: str, number: int) -> None:
        self.address = address
        self.masked = masked
        self.number = number
        self.lock = threading.RLock()
        self.generation = 0
        self._connection: amqp.Connection | None = None
        self._work: amqp.Channel | None = None
        self._probe: amqp.Channel | None = None
        self._unacked = HeldTags()
        """Delivery tags unacked on the work channel and their queues (a byte each: a scan
        holds every delivery until its end)."""
        self._seq = 0
        self._confirms: _Confirms | None = None
        self._released = array("Q")
        """Delivery tags released and not yet given back to the broker (see the module); 8
        bytes each, not a list's ~40: a scan's end releases everything it held."""

    # -- the connection ------------------------------------------------------------------

    def _connect(self) -> amqp.Connection:
        if self._connection is not None:
            return self._connection
        a = self.address
        connection = Connection(
            f"{a.host}:{a.port}",
            userid=a.user,
            password=a.password,
            virtual_host=a.vhost,
            connect_timeout=CONNECT_TIMEOUT,
            ssl=ssl.create_default_context() if a.tls else False,
        )
        try:
            connection.connect()
        except (*LINK_ERRORS, amqp.exceptions.AMQPError) as exc:
            raise BrokerUnavailable(connect_failed(exc, a, self.masked)) from None
        self._connection = connection
        self.generation += 1
        return connection

    def _drop(self, *, close: bool = False) -> None:
        """Forget the connection (its deliveries are back in their queues)."""
        connection, self._connection = self._connection, None
        self._work = self._probe = None
        self._unacked.clear()
        self._confirms = None
        self._released = array("Q")
        if connection is not None:
            # Already broken, or closing: the broker cleans up whatever is left.
            with contextlib.suppress(Exception):
                connection.close() if close else connection.collect()

    def close(self) -> None:
        with self.lock:
            self._drop(close=True)

    def work(self) -> amqp.Channel:
        if self._work is None or not self._work.is_open:
            connection = self._connect()
            if self._work is not None:  # the channel closed: its deliveries went back
                self._unacked.clear()
                self._released = array("Q")
                self.generation += 1
            channel = amqp.Channel(connection, auto_decode=False)
            channel.open()
            channel.confirm_select()
            channel.events["basic_ack"].add(self._on_ack)
            channel.events["basic_nack"].add(self._on_nack)
            channel.events["basic_return"].add(self._on_return)
            self._work, self._seq = channel, 0
        return self._work

    def probe(self) -> amqp.Channel:
        if self._probe is None or not self._probe.is_open:
            channel = amqp.Channel(self._connect(), auto_decode=False)
            channel.open()
            self._probe = channel
        return self._probe

    def _timed_out(self, exc: amqp.exceptions.PreconditionFailed) -> NoReturn:
        """Re-raise a closed channel's error: as :class:`HoldsTimedOut` when a hold
        outlived consumer_timeout (the connection is dropped: its holds are back)."""
        timed_out = holds_timed_out(exc, self.masked)
        if timed_out is None:
            raise exc
        self._drop()
        raise timed_out from None

    @contextmanager
    def calling(self, what: str) -> Iterator[None]:
        """Under the lock, after any release held back; a lost connection becomes one
        error naming the broker."""
        with self.lock:
            try:
                self._send_release()
                yield
            except LINK_ERRORS as exc:
                self._drop()
                raise BrokerUnavailable(
                    f"RabbitMQ at {self.masked}: {what} failed, the connection was lost: "
                    f"{_why(exc)}"
                ) from None
            except amqp.exceptions.PreconditionFailed as exc:
                self._timed_out(exc)

    def _send_release(self) -> None:
        """Give back the released tags, if any (see the module's docstring)."""
        released, self._released = self._released, array("Q")
        channel = self._work
        if not released or channel is None or not channel.is_open:
            return
        upto, one_by_one = nack_plan(released, self._unacked.lowest())
        if upto:
            # py-amqp has no basic_nack: the frame itself (delivery tag, multiple, requeue).
            channel.send_method(spec.Basic.Nack, "Lbb", (upto, True, True))
        for delivery in one_by_one:
            channel.basic_reject(delivery, requeue=True)

    def send_release(self) -> None:
        """Give back at once what a release held back (a lost connection gave it back)."""
        with self.lock:
            try:
                self._send_release()
            except LINK_ERRORS:
                self._drop()

    # -- queues --------------------------------------------------------------------------

    def declared(self, queue: str) -> tuple[int, int]:
        """(ready messages, consumers) of a queue, by a passive declare."""
        with self.calling(f"queue.declare {queue}"):
            try:
                _, ready, consumers = self.probe().queue_declare(queue, passive=True)
            except amqp.exceptions.NotFound:
                self._probe = None
                raise QueueNotFound(f"queue {queue} does not exist") from None
            return int(ready), int(consumers)

    def _ready(self, queue: str) -> int:
        """Ready messages of ``queue`` (0 once it is gone)."""
        try:
            return self.declared(queue)[0]
        except QueueNotFound:
            return 0

    def held(self, queue: str) -> int:
        with self.lock:
            return self._unacked.held(queue)

    def purge(self, queue: str) -> None:
        with self.calling(f"queue.purge {queue}"):
            try:
                self.probe().queue_purge(queue)
            except amqp.exceptions.NotFound:
                self._probe = None
                raise QueueNotFound(f"queue {queue} does not exist") from None

    # -- receiving -----------------------------------------------------------------------

    def get(self, queue: str, count: int, ready: int) -> list[Got]:
        """Up to ``count`` deliveries, held (unacked) while the channel lives.

        A consumer with a prefetch of the window, cancelled once the window is full: one
        round trip per batch, where ``basic.get`` costs one per message. Each receive is a
        new consumer, so the deliveries it keeps unacked never count against the next one's
        prefetch (a scan holds everything it saw until it ends)."""
        want = min(count, ready)
        with self.calling(f"basic.consume {queue}"):
            channel = self.work()
            if want <= 0:
                # A quorum queue's count lags a requeue: one basic.get tells for sure.
                if count <= 0:
                    return []
                try:
                    message = channel.basic_get(queue, no_ack=False)
                except amqp.exceptions.NotFound:
                    raise QueueNotFound(f"queue {queue} does not exist") from None
                return [self._got(message, queue)] if message is not None else []
            got: list[Got] = []

            def on_message(message: amqp.Message) -> None:
                got.append(self._got(message, queue))

            try:
                channel.basic_qos(0, want, False)
                tag = channel.basic_consume(queue, callback=on_message)
            except amqp.exceptions.NotFound:
                raise QueueNotFound(f"queue {queue} does not exist") from None
            deadline = time.monotonic() + DELIVERY_TIMEOUT
            assert self._connection is not None
            while len(got) < want and (left := deadline - time.monotonic()) > 0:
                try:
                    self._connection.drain_events(timeout=max(0.01, min(left, READY_CHECK)))
                except TimeoutError:
                    # Another consumer (a second worker or process) may have taken the
                    # rest of what the count promised: none ready, nothing more will come.
                    if left <= READY_CHECK or self._ready(queue) == 0:
                        break
            # Deliveries that arrive before cancel-ok are ours too (the callback stays).
            channel.basic_cancel(tag)
            return got

    def _got(self, message: amqp.Message, queue: str) -> Got:
        info = message.delivery_info
        delivery_tag = int(info["delivery_tag"])
        # First of all: a multiple ack must never take a delivery this lane did not record.
        self._unacked.add(delivery_tag, queue)
        body = message.body
        return Got(
            tag=f"{self.number}.{self.generation}:{delivery_tag}",
            body=bytes(body) if not isinstance(body, str) else body.encode("utf-8"),
            properties=dict(message.properties),
            exchange=str(info.get("exchange", "")),
            routing_key=str(info.get("routing_key", "")),
            redelivered=bool(info.get("redelivered")),
            received=getattr(message, "received", None),
        )

    def settle(self, tags: Mapping[str, Tag], *, ack: bool) -> BatchResult:
        """Ack (or release: reject with requeue) copies of this lane; a tag of a channel
        that is gone, or already settled, fails for its entry."""
        ok: dict[str, str] = {}
        failed: dict[str, str] = {}
        with self.lock:
            try:
                channel = self._work if self._work is not None and self._work.is_open else None
                # In delivery order: a classic queue then puts each back where it was.
                held: list[tuple[str, int]] = []
                taken: set[int] = set()
                for entry_id, tag in sorted(tags.items(), key=lambda item: item[1].delivery):
                    if channel is None or tag.generation != self.generation:
                        failed[entry_id] = GONE
                    elif tag.delivery not in self._unacked or tag.delivery in taken:
                        failed[entry_id] = "StaleTag: not held on this channel"
                    else:
                        held.append((entry_id, tag.delivery))
                        taken.add(tag.delivery)
                if channel is not None and held:
                    self._settle_held(channel, held, ok, ack=ack)
            except LINK_ERRORS as exc:
                self._drop()
                for entry_id in tags:
                    if entry_id not in ok:
                        failed.setdefault(entry_id, f"ConnectionLost: {_why(exc)}")
        return BatchResult(ok, failed)

    def _settle_held(
        self, channel: amqp.Channel, held: list[tuple[str, int]], ok: dict[str, str], *, ack: bool
    ) -> None:
        """Settle deliveries known unacked here, in delivery order. A batch whose first
        deliveries are exactly the channel's lowest unacked ones settles those with one
        ``multiple`` ack (it takes every unacked tag up to the last: only theirs, once the
        released tags are given back), the rest one by one. Released tags wait to be given
        back together (see the module's docstring)."""
        if not ack:
            for entry_id, delivery in held:
                self._unacked.remove(delivery)
                self._released.append(delivery)
                ok[entry_id] = ""
            return
        self._send_release()
        first = self._unacked.lowest_run([delivery for _, delivery in held])
        if first > 1:
            channel.basic_ack(held[first - 1][1], multiple=True)
        for _, delivery in held[first if first > 1 else 0 :]:
            channel.basic_ack(delivery)
        for entry_id, delivery in held:
            self._unacked.remove(delivery)
            ok[entry_id] = ""

    # -- publishing ----------------------------------------------------------------------

    def publish(
        self,
        queue: str,
        messages: Sequence[tuple[str, bytes, dict[str, Any]]],
        received: Mapping[str, Received] | None = None,
    ) -> tuple[dict[str, str], set[str]]:
        """Publish a batch (entry id, body, properties) to ``queue`` through the default
        exchange, mandatory, then collect the confirms: (entry id -> why it is not sent, for
        the refused ones; the unconfirmed entry ids). The rest were confirmed and routed.
        ``received``: the headers an entry was received as, when it is sent as received
        (its unchanged header values are then written as they came)."""
        refused: dict[str, str] = {}
        unconfirmed: set[str] = set()
        with self.lock:
            confirms = _Confirms()
            published: list[_Publish] = []
            try:
                channel = self.work()
                self._confirms = confirms
                # Every lane's connection writes through a CorkedWriter (frames.Connection).
                with channel.connection.frame_writer.corked():
                    self._publish_all(channel, queue, messages, received or {}, confirms, published)
                self._wait_for_confirms(confirms)
            except LINK_ERRORS:
                self._drop()
            except BrokerUnavailable:
                if published:  # never: work() connects before the first publish
                    raise
                # The reconnect failed: nothing of the batch was written, so none of it is
                # in doubt (each is refused as not published, below; its claim released).
                # Raised, it would have held the whole batch in doubt, a second batch per
                # worker after the one the lost connection left unconfirmed.
            except amqp.exceptions.PreconditionFailed as exc:
                if not _refused_as_too_large(exc, published):
                    # The whole batch stays in doubt (its claims kept): see move/send.py.
                    self._timed_out(exc)
            finally:
                self._confirms = None
            for entry_id, _, _ in messages[len(published) :]:
                refused[entry_id] = "NotPublished: the connection was lost first"
        for publish in published:
            if publish.returned is not None:
                refused[publish.entry_id] = publish.returned
            elif publish.state == "nack":
                refused[publish.entry_id] = "Nacked: the broker refused the message"
            elif publish.state == "pending":
                unconfirmed.add(publish.entry_id)
        return refused, unconfirmed

    def _publish_all(
        self,
        channel: amqp.Channel,
        queue: str,
        messages: Sequence[tuple[str, bytes, dict[str, Any]]],
        received: Mapping[str, Received],
        confirms: _Confirms,
        published: list[_Publish],
    ) -> None:
        """Publish each message, recorded for its confirm before it goes."""
        send = publisher(channel, queue)
        for entry_id, body, properties in messages:
            publish = _Publish(entry_id, (queue, body))
            message = Outgoing(body, received.get(entry_id), **properties)
            self._seq += 1
            confirms.by_seq[self._seq] = publish
            confirms.by_content.setdefault(publish.content, []).append(publish)
            confirms.pending += 1
            published.append(publish)
            send(message)

    def _wait_for_confirms(self, confirms: _Confirms) -> None:
        assert self._connection is not None
        deadline = time.monotonic() + CONFIRM_TIMEOUT
        while confirms.pending > 0 and time.monotonic() < deadline:
            try:
                self._connection.drain_events(timeout=max(0.01, deadline - time.monotonic()))
            except TimeoutError:
                continue

    def _on_ack(self, tag: int, multiple: bool) -> None:
        if self._confirms is not None:
            self._confirms.settle(tag, multiple, "ack")

    def _on_nack(self, tag: int, multiple: bool) -> None:
        if self._confirms is not None:
            self._confirms.settle(tag, multiple, "nack")

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        if self._confirms is not None:
            body = message.body if isinstance(message.body, bytes) else bytes(message.body)
            why = getattr(exc, "reply_text", "") or str(exc)
            self._confirms.returned(routing_key, body, f"Returned: {why}")


_TOO_LARGE: Final = re.compile(r"message size (\d+) is larger than configured max size (\d+)")


def _refused_as_too_large(exc: amqp.exceptions.PreconditionFailed, batch: list[_Publish]) -> bool:
    """A body over the broker's max_message_size closes the channel at its publish (406):
    that one is refused, and so is every later one (a closing channel's methods are
    discarded, AMQP 0-9-1), while earlier unconfirmed ones stay in doubt. False: another
    precondition, or no body of the size said is pending."""
    found = _TOO_LARGE.search(str(getattr(exc, "reply_text", "") or exc))
    if found is None:
        return False
    size, limit = int(found.group(1)), int(found.group(2))
    pending = [p.state == "pending" and p.returned is None for p in batch]
    at = next((i for i, p in enumerate(batch) if pending[i] and len(p.content[1]) == size), None)
    if at is None:
        return False
    batch[at].returned = (
        f"TooLarge: RabbitMQ refused its body of {size:,} bytes, over its largest message of "
        f"{limit:,} bytes (max_message_size); not sent, it stays in the DLQ"
    )
    for publish in batch[at + 1 :]:
        if publish.state == "pending" and publish.returned is None:
            publish.returned = "NotPublished: the channel closed at a message over max_message_size"
    return True


class Link:
    """The lanes of one URL (see the module's docstring); thread-safe."""

    def __init__(self, url: str, masked: str) -> None:
        self.address = AmqpAddress.parse(url)
        self.masked = masked
        self._lock = threading.Lock()
        self._lanes: dict[int, Lane] = {}
        self._idle: list[Lane] = []

    def lane(self) -> Lane:
        """A lane for one broker: an idle one, else a new one (connected on its first call)."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
            lane = Lane(self.address, self.masked, len(self._lanes))
            self._lanes[lane.number] = lane
            return lane

    def give_back(self, lane: Lane) -> None:
        """A broker is gone: its lane (and what it holds) waits for the next broker."""
        with self._lock:
            if lane.number in self._lanes and lane not in self._idle:
                self._idle.append(lane)

    def lanes(self) -> list[Lane]:
        with self._lock:
            return list(self._lanes.values())

    def held(self, queue: str) -> int:
        """Deliveries of ``queue`` this process holds, on every lane."""
        return sum(lane.held(queue) for lane in self.lanes())

    def send_releases(self) -> None:
        """Give back at once what every lane's releases held back."""
        for lane in self.lanes():
            lane.send_release()

    def settle(self, tags: Mapping[str, str], *, ack: bool) -> BatchResult:
        """Ack (or release) copies, each on the lane and channel it came on; a tag that
        names none fails for its entry."""
        by_lane: dict[int, dict[str, Tag]] = {}
        failed: dict[str, str] = {}
        with self._lock:
            lanes = dict(self._lanes)
        for entry_id, text in tags.items():
            tag = Tag.parse(text)
            if tag is None or tag.lane not in lanes:
                failed[entry_id] = GONE
            else:
                by_lane.setdefault(tag.lane, {})[entry_id] = tag
        ok: dict[str, str] = {}
        for number, entries in by_lane.items():
            result = lanes[number].settle(entries, ack=ack)
            ok.update(result.ok)
            failed.update(result.failed)
        return BatchResult(ok, failed)

    def close(self) -> None:
        """Close every lane (what they hold goes back to its queue); each connects again on
        its next call."""
        for lane in self.lanes():
            lane.close()


def nack_plan(released: Sequence[int], lowest_held: int | None) -> tuple[int, list[int]]:
    """How to give back released delivery tags of one channel: the tag of one ``multiple``
    nack for every one below the lowest tag the channel still holds (0: none), and the
    ones above it, in order, to reject one by one (a multiple nack would take the held one)."""
    if lowest_held is None:
        return max(released, default=0), []
    below = [tag for tag in released if tag < lowest_held]
    return max(below, default=0), sorted(tag for tag in released if tag > lowest_held)


def holds_timed_out(exc: amqp.exceptions.AMQPError, masked: str) -> HoldsTimedOut | None:
    """The one line for a channel the broker closed because a delivery on it was held past
    ``consumer_timeout`` (406 PRECONDITION_FAILED "delivery acknowledgement on channel N
    timed out"); None for any other error."""
    text = str(getattr(exc, "reply_text", "") or "")
    if exc.reply_code != 406 or "delivery acknowledgement" not in text or "timed out" not in text:
        return None
    said = text.removeprefix("PRECONDITION_FAILED - ").split(". ", 1)[0]
    return HoldsTimedOut(
        f"RabbitMQ at {masked} closed the channel holding redrive's copies ({said}): a copy "
        "was held longer than the broker's consumer_timeout. Every copy held there is back "
        "in its queue and nothing sent is lost (the ledger knows what was); run again with "
        "--limit to hold fewer at once, or raise consumer_timeout on the broker"
    )


def connect_failed(exc: BaseException, address: AmqpAddress, masked: str) -> str:
    """Why a connection could not be made, as what to fix: a refused login, a vhost that is
    not there, a port that does not speak TLS; else the error's own words."""
    if isinstance(exc, amqp.exceptions.AccessRefused):
        return (
            f"RabbitMQ at {masked} refused user {address.user!r}: wrong user or password "
            "(ACCESS_REFUSED); check USER:PASS in the broker URL (--broker, REDRIVE_BROKER or "
            "[broker] url)"
        )
    if isinstance(exc, amqp.exceptions.NotAllowed) and "vhost" in str(exc):
        return (
            f"vhost {address.vhost!r} does not exist on RabbitMQ at {masked} (or user "
            f"{address.user!r} may not use it): check the vhost, the broker URL's path "
            "(amqp://USER:PASS@HOST:5672/VHOST; `//` is the default vhost '/')"
        )
    if isinstance(exc, ssl.SSLError) and exc.reason == "WRONG_VERSION_NUMBER":
        return (
            f"RabbitMQ at {masked}: port {address.port} does not speak TLS: use amqp:// for "
            "it, or amqps:// with the broker's TLS port (5671 by default)"
        )
    return f"RabbitMQ at {masked} cannot be reached: {_why(exc)}"


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


_LINKS: dict[str, Link] = {}
_LINKS_LOCK = threading.Lock()


def link_for(url: str, masked: str) -> Link:
    """The process's link to ``url`` (made on first use; its lanes connect on first call)."""
    with _LINKS_LOCK:
        link = _LINKS.get(url)
        if link is None:
            link = _LINKS[url] = Link(url, masked)
        return link


def close_links() -> None:
    """Close every link (at exit: what is still held goes back to its queue)."""
    with _LINKS_LOCK:
        links = list(_LINKS.values())
        _LINKS.clear()
    for link in links:
        link.close()


atexit.register(close_links)
