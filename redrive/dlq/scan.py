"""The DLQ scan: see every message of a queue once, and give back what was not consumed.

A broker has no peek: receiving a message hides it from every other receiver for its hold
(SQS's visibility timeout; RabbitMQ's unacknowledged delivery). A scan receives
batches, hands each message to the operation once, keeps the messages it does not consume
hidden until the scan ends (so they are not received again), and then makes them visible
again. Memory stays flat at any depth: delivery tags of held messages are spooled to
temporary files, and the messages already seen are remembered as 8-byte digests until they
are deleted (in a DigestSet: 11 to 22 bytes each, where a set of ints took ~78).

Holds are short and renewed while the run lives, so that a run killed by SIGKILL (which
cannot give anything back) hides its messages for about ``--lease``, not for the length of
a whole scan. A thread of the scan renews each held message shortly before its hold ends,
for :func:`hold_seconds`: ``--lease`` while the run holds few messages, longer when renewing
every held message that often would be a storm of calls on a deep DLQ (but never longer than
twice the run's age). See :func:`hold_seconds` for the bound and its cost.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Container, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from redrive.allocator import bound_arenas
from redrive.broker.base import Broker, Capabilities, Delivery
from redrive.dlq.digests import DigestSet
from redrive.errors import RedriveError

if TYPE_CHECKING:
    from redrive.dlq.receive_log import ReceiveLog


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else default


#: A broker's batch size until one is known (the hold policy's unit of renewal).
DEFAULT_BATCH = 10
#: Long polling for each receive: an empty answer then means the queue really had nothing
#: visible (short polls sample only some SQS servers). Unit tests set it to 0.
RECEIVE_WAIT_SECONDS = _env_int("REDRIVE_RECEIVE_WAIT", 1)
#: ChangeMessageVisibilityBatch calls a second that renewing a scan's holds may cost
#: however many messages it holds (beyond the scan's own pace: see hold_seconds).
RENEW_CALLS_PER_SECOND = 10.0
#: A hold never outlasts this many times the run's age (see hold_seconds).
HOLD_AGE_FACTOR = 2.0
#: The share of its measured capacity the renewing thread may need to keep up.
RENEW_SHARE = 0.5
#: Held delivery tags per spool segment: a segment is renewed as one, when its first hold
#: is about to end.
SEGMENT_HANDLES = 1_000
#: How often the renewing thread looks for holds about to end.
RENEW_POLL_SECONDS = 0.25
#: Messages a scan deleted that it still recognises if SQS delivers them again (about 4 MB).
RECENTLY_DELETED = 50_000
#: How long a scan's end waits for what it released to be back in the queue's ready count
#: (brokers whose release lands later than it returns: Capabilities.release_lands_later).
#: RabbitMQ takes back thousands of requeued deliveries a second: this is for a hang.
LANDING_SECONDS = 60.0
LANDING_POLL_SECONDS = 0.01


def hold_seconds(
    *,
    lease: int,
    age: float,
    held: int,
    renew_capacity: float = math.inf,
    batch_size: int = DEFAULT_BATCH,
    max_hold: int | None = None,
) -> int:
    """How long, from now, a scan hides the messages it holds.

    ``lease``, unless renewing every held message once per lease would cost more than
    :data:`RENEW_CALLS_PER_SECOND` calls a second (more than 100 handles per second of
    lease: 3,000 held at the default 30 s). Then the hold is ``held / 100`` seconds (one
    renewal of each per hold costs those 10 calls a second), but never longer than
    :data:`HOLD_AGE_FACTOR` times the run's ``age``: a run that gathered 100,000 held
    messages in a minute renews them at about half the pace it received them, and once dead
    hides them for about two minutes, not for the 1,000 s the rate alone would allow.

    And never shorter than what the renewing thread can keep up with using half of its
    measured ``renew_capacity`` (handles a second): a hold it cannot renew in time would
    run out under a live run (its messages then come back and are received again).

    A killed run's holds therefore end within ``max(lease, min(2 * age, held / 100))``
    seconds when the renewer keeps up, and renewing costs at most ``max(10, half the run's
    average receives per second)`` calls a second (plus the renewal margin).
    """
    affordable = held / (batch_size * RENEW_CALLS_PER_SECOND)
    sustainable = held / (RENEW_SHARE * renew_capacity)
    hold = max(lease, min(HOLD_AGE_FACTOR * age, affordable), sustainable)
    return int(hold if max_hold is None else min(max_hold, hold))


def renew_ahead(hold: float) -> float:
    """How long before a hold ends it is renewed: room for the renewal calls and a late
    thread, and never more than half the hold (a 1 s lease renews every half second)."""
    return min(hold / 2, max(1.0, hold / 5), 15.0)


@dataclass(slots=True)
class ScanStats:
    received: int = 0
    """Distinct messages handed to the operation."""
    seen_again: int = 0
    """Receives of a message this scan had already seen (its lease ran out, or SQS repeated it)."""
    receives: int = 0
    empty_receives: int = 0
    held: int = 0
    released: int = 0
    release_failed: int = 0
    release_unseen: int = 0
    """Released copies not back in the queue's ready count when the scan's end stopped
    waiting for them (another consumer took them, or the broker was slow to requeue)."""
    renew_calls: int = 0
    """ChangeMessageVisibilityBatch calls that renewed holds."""
    renewed: int = 0
    renew_failed: int = 0
    """Holds SQS would not renew (a handle made stale by a later receive, a message back)."""
    renew_errors: int = 0
    """Renewal calls that failed as a whole (retried; a hold may then run out)."""
    longest_hold: int = 0
    """The longest hold given, in seconds: how long a kill could have hidden a message."""
    redelivered: int = 0
    """Copies SQS delivered again of a message this scan had deleted: deleted once more,
    never handed out twice (SQS delivers at least once, rarely more)."""


def digest(message_id: str) -> int:
    """An 8-byte stand-in for an id in sets that grow with the queue."""
    return int.from_bytes(hashlib.blake2b(message_id.encode(), digest_size=8).digest(), "big")


class _Segment:
    """Up to SEGMENT_HANDLES held delivery tags in a temporary file, and the time by which
    the first of their holds must be renewed."""

    __slots__ = ("file", "handles", "renew_at")

    def __init__(self) -> None:
        # Closed by close(), when the segment is released, renewed or the scan closes.
        self.file = tempfile.TemporaryFile(mode="w+", encoding="ascii", prefix="redrive-")  # noqa: SIM115
        self.handles = 0
        self.renew_at = math.inf

    def add(self, handles: Sequence[str], renew_at: float) -> None:
        self.file.write("".join(h + "\n" for h in handles))
        self.handles += len(handles)
        self.renew_at = min(self.renew_at, renew_at)

    def chunks(self, size: int = DEFAULT_BATCH) -> Iterator[list[str]]:
        """The tags, one batch at a time: a segment is never loaded whole."""
        self.file.flush()
        self.file.seek(0)
        chunk: list[str] = []
        for line in self.file:
            chunk.append(line.rstrip("\n"))
            if len(chunk) == size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    def close(self) -> None:
        self.file.close()


class _Holds:
    """The held delivery tags, in segments. Newly kept ones fill an *open* segment until
    it is full; a renewed segment becomes a segment of its own, so that the handles of one
    segment come due together (one that mixed them would be renewed early, and often).
    Handles SQS would not renew are *retired*: never renewed again, still released at the
    end (a hold SQS will not extend, e.g. past its 12 hours, still runs). Not thread-safe:
    the scan's lock guards it."""

    def __init__(self) -> None:
        self.segments: list[_Segment] = []
        self.count = 0
        """Handles to renew (retired ones are not)."""
        self.retired: list[_Segment] = []
        self._open: _Segment | None = None

    def add(self, handles: Sequence[str], renew_at: float) -> None:
        if not handles:
            return
        if self._open is None or self._open.handles >= SEGMENT_HANDLES:
            self._open = _Segment()
            self.segments.append(self._open)
        self._open.add(handles, renew_at)
        self.count += len(handles)

    def adopt(self, segment: _Segment) -> None:
        """A segment filled elsewhere (renewed handles) joins the holds."""
        if not segment.handles:
            segment.close()
            return
        self.segments.append(segment)
        self.count += segment.handles

    def retire(self, handles: Sequence[str]) -> None:
        if not handles:
            return
        if not self.retired or self.retired[-1].handles >= SEGMENT_HANDLES:
            self.retired.append(_Segment())
        self.retired[-1].add(handles, math.inf)

    def every_segment(self) -> list[_Segment]:
        return [*self.segments, *self.retired]

    def next_renewal(self) -> float:
        return min((s.renew_at for s in self.segments), default=math.inf)

    def take_due(self, now: float) -> _Segment | None:
        """The segment whose renewal is most urgent, if it is due; it leaves the holds."""
        due = min(self.segments, key=lambda s: s.renew_at, default=None)
        if due is None or due.renew_at > now:
            return None
        self.segments.remove(due)
        self.count -= due.handles
        if due is self._open:
            self._open = None
        return due

    def remove(self, segment: _Segment) -> None:
        if segment in self.retired:
            self.retired.remove(segment)
        else:
            self.segments.remove(segment)
            self.count -= segment.handles
            if segment is self._open:
                self._open = None
        segment.close()

    def clear(self) -> list[_Segment]:
        segments = self.every_segment()
        self.segments, self.retired, self.count, self._open = [], [], 0, None
        return segments


@dataclass
class ReceivedBatch:
    """One receive, sorted against what the scan has seen."""

    fresh: list[Delivery]
    """Never seen in this scan: handed to the operation."""
    stale: list[Delivery]
    """Seen before (or over ``--limit``): held again, not handed out."""
    again: list[Delivery]
    """Deleted by this scan before: SQS delivered a copy again, deleted once more."""
    first_seen: list[int]
    """The digests this receive saw first (over-limit ones included)."""


def sort_received(
    messages: Sequence[Delivery],
    digests: Sequence[int],
    *,
    seen: Container[int],
    deleted: Container[int],
    room: int | None,
) -> ReceivedBatch:
    """Sort one receive: a message is again (deleted before), stale (seen before, in an
    earlier receive or earlier in this one) or fresh. Past ``room`` (what ``--limit``
    leaves), fresh ones count as stale: concurrent receivers may overshoot it."""
    batch = ReceivedBatch([], [], [], [])
    first: set[int] = set()
    for message, seen_as in zip(messages, digests, strict=True):
        if seen_as in deleted:
            batch.again.append(message)
        elif seen_as in seen or seen_as in first:
            batch.stale.append(message)
        else:
            first.add(seen_as)
            batch.first_seen.append(seen_as)
            batch.fresh.append(message)
    if room is not None:
        room = max(0, room)
        batch.stale.extend(batch.fresh[room:])
        batch.fresh = batch.fresh[:room]
    return batch


@dataclass
class DlqScan:
    """One pass over a queue, shared by any number of worker threads (each with its own Broker)."""

    url: str
    lease: int
    """Visibility timeout of each receive (how long the operation has to work on a batch),
    and the shortest hold: a killed run's messages come back within about this long."""
    receive_held: bool = False
    """Receive with the hold's length: a read-only scan holds every message it receives."""
    max_messages: int | None = None
    wait_seconds: int | None = None
    stop_after_empty: int = 3
    """Empty receives in a row after which the scan ends whatever SQS's counts say."""
    stop: threading.Event = field(default_factory=threading.Event)
    on_receive: Callable[[int], None] | None = None
    broker_factory: Callable[[], Broker] | None = None
    """Makes the client that renews holds (else the one of the first :meth:`keep`)."""
    receive_log: ReceiveLog | None = None
    """Where redrive's own receives are counted (see redrive.dlq.receive_log)."""
    receive_counts: bool = True
    """Whether the messages handed out carry redrive's own receives so far
    (``Message.redrive_receives``, read from the log); False counts the receives all the same
    but reads nothing back (a run that never shows the counts)."""
    stats: ScanStats = field(default_factory=ScanStats)
    clock: Callable[[], float] = time.monotonic
    limits: Capabilities | None = None
    """The broker's batch size and longest hold (its own, from the first receive)."""
    """When holds end and are renewed; it must be the clock of the clients' ``hidden_until``
    (tests pass one that moves only when told, SQS's own too, so no lease races them)."""

    #: Messages taken from a DLQ are deleted from it once sent or archived.
    deletes = True

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._seen = DigestSet()
        self._deleted = DigestSet()
        self._deleted_order: deque[int] = deque()
        self._holds = _Holds()
        self._in_renewal = 0
        self._consecutive_empty = 0
        self._stale_run = 0
        self._done = False
        self._started = self.clock()
        self._halt = threading.Event()
        self._renewer: threading.Thread | None = None
        self._renew_call_seconds = 0.0
        """A moving average of how long one renewal call takes (0: none made yet)."""
        self._renewing = False

    # -- receiving -----------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self._done or self.stop.is_set()

    def hold(self) -> int:
        """The hold a message kept now gets (see :func:`hold_seconds`)."""
        return hold_seconds(
            lease=self.lease,
            age=self.clock() - self._started,
            held=self._holds.count + self._in_renewal,
            renew_capacity=self._batch / self._renew_call_seconds
            if self._renew_call_seconds
            else math.inf,
            batch_size=self._batch,
            max_hold=self.limits.max_hold_seconds if self.limits is not None else None,
        )

    @property
    def _batch(self) -> int:
        return self.limits.batch_size if self.limits is not None else DEFAULT_BATCH

    def next_batch(self, broker: Broker) -> list[Delivery] | None:
        """New messages (never seen in this scan), or ``None`` when the scan is over.

        Messages seen before are held again without being returned.
        """
        if self.limits is None:
            self.limits = broker.capabilities
        while not self.done:
            want = self._batch_size()
            if want <= 0:
                return None
            visibility = self.hold() if self.receive_held else self.lease
            messages = broker.receive(
                self.url,
                hold=visibility,
                wait_seconds=(
                    RECEIVE_WAIT_SECONDS if self.wait_seconds is None else self.wait_seconds
                ),
                max_messages=want,
            )
            if self._count_receive(empty=not messages):
                # An empty long poll and a queue that counts nothing visible: covered. One
                # attribute call, where a second long poll would cost a second of waiting.
                if not self._done and self._nothing_visible(broker):
                    with self._lock:
                        self._done = True
                continue
            digests = [digest(m.message_id) for m in messages]
            messages = self._with_receive_counts(messages, digests)
            batch, received = self._take(messages, digests)
            if batch.stale:
                self.keep(broker, batch.stale)
            if batch.again:
                self._delete_again(broker, batch.again)
            if batch.fresh:
                if self.on_receive is not None:
                    self.on_receive(received)
                return batch.fresh
        return None

    def _batch_size(self) -> int:
        """How many messages the next receive asks for; at 0 or below the scan is over."""
        with self._lock:
            if self.max_messages is None:
                return self._batch
            want = min(self._batch, self.max_messages - self.stats.received)
            if want <= 0:
                self._done = True
            return want

    def _count_receive(self, *, empty: bool) -> int:
        """Count a receive; the empty receives in a row so far (0 after one with messages)."""
        with self._lock:
            self.stats.receives += 1
            if not empty:
                return 0
            self.stats.empty_receives += 1
            self._consecutive_empty += 1
            if self._consecutive_empty >= self.stop_after_empty:
                self._done = True
            return self._consecutive_empty

    def _with_receive_counts(self, messages: list[Delivery], digests: list[int]) -> list[Delivery]:
        if self.receive_log is None:
            return messages
        # Every receive raised the message's receive count, repeats too.
        deliveries = max((m.receive_count for m in messages), default=0)
        if not self.receive_counts:
            self.receive_log.count_digests(digests)
            self.receive_log.note_queue(self.url, deliveries, 0)
            return messages
        counts = self.receive_log.record_digests(digests)
        self.receive_log.note_queue(self.url, deliveries, max(counts, default=0))
        return [replace(m, redrive_receives=n) for m, n in zip(messages, counts, strict=True)]

    def _take(self, messages: list[Delivery], digests: list[int]) -> tuple[ReceivedBatch, int]:
        """Sort a receive against what the scan saw, and count it: the batch, and the
        messages received so far."""
        with self._lock:
            self._consecutive_empty = 0
            room = None if self.max_messages is None else self.max_messages - self.stats.received
            batch = sort_received(
                messages, digests, seen=self._seen, deleted=self._deleted, room=room
            )
            self._seen.update(batch.first_seen)
            self.stats.received += len(batch.fresh)
            self.stats.seen_again += len(batch.stale)
            self.stats.redelivered += len(batch.again)
            # Seen messages come back when their lease ran out (a slow consumer), and SQS
            # may return them before the unseen ones: a few stale receives in a row do not
            # mean the queue is covered. Each stale receive hides what it got again, so
            # once every seen message came back with nothing new among them, it is.
            self._stale_run = 0 if batch.fresh else self._stale_run + len(batch.stale)
            if self._stale_run > len(self._seen):
                self._done = True
            return batch, self.stats.received

    def _nothing_visible(self, broker: Broker) -> bool:
        return broker.counts(self.url).ready == 0

    def stop_receiving(self) -> None:
        """End the scan after the batches in progress (e.g. ``--limit`` reached)."""
        with self._lock:
            self._done = True

    # -- holding -------------------------------------------------------------------------

    def keep(self, broker: Broker, messages: Sequence[Delivery]) -> None:
        """Keep messages hidden until the scan ends; they are released by :meth:`release_all`.

        No call here: each message is still hidden by its receive, and the renewing thread
        extends its hold shortly before that runs out.
        """
        if not messages:
            return
        now = self.clock()
        ends = min(m.hidden_until for m in messages)
        renew_at = ends - renew_ahead(max(self.lease, ends - now))
        start = False
        with self._lock:
            self._holds.add([m.tag for m in messages], renew_at)
            self.stats.held += len(messages)
            if not self._renewing and not self._halt.is_set():
                self._renewing = start = True
        if start:
            self._start_renewing(broker)

    def _start_renewing(self, broker: Broker) -> None:
        thread = threading.Thread(
            target=self._renew_while_held, args=(broker,), name="redrive-renew", daemon=True
        )
        with self._lock:
            self._renewer = thread
        thread.start()

    def _renew_while_held(self, keeper: Broker) -> None:
        # A client of its own, made when a hold first needs renewing (~30 ms of CPU that a
        # scan ending within its lease never pays); else the keeper's (clients are
        # thread-safe).
        broker: Broker | None = None
        while not self._halt.is_set():
            with self._lock:
                due = self._holds.next_renewal() <= self.clock()
            if broker is None and due:
                try:
                    broker = self.broker_factory() if self.broker_factory is not None else keeper
                except Exception:
                    with self._lock:
                        self.stats.renew_errors += 1
            with self._lock:
                segment = self._holds.take_due(self.clock()) if broker is not None else None
                if segment is not None:
                    self._in_renewal = segment.handles
            if segment is None:
                self._halt.wait(RENEW_POLL_SECONDS)
                continue
            assert broker is not None
            try:
                self._renew(broker, segment)
            finally:
                with self._lock:
                    self._in_renewal = 0
                segment.close()

    def _renew(self, broker: Broker, segment: _Segment) -> None:
        """Renew one segment's holds; what is left undone (halted, or a call failed) goes
        back to the holds, so release_all still gives it back."""
        hold = self.hold()
        with self._lock:
            self.stats.longest_hold = max(self.stats.longest_hold, hold)
        chunks = segment.chunks(self._batch)
        retry_at: float | None = None
        renewed_segment = _Segment()
        try:
            for chunk in chunks:
                if self._halt.is_set():
                    self._put_back(chunk, self.clock())
                    break
                called_at = self.clock()
                try:
                    result = broker.extend(self.url, {str(i): h for i, h in enumerate(chunk)}, hold)
                except Exception:
                    # Throttled or unreachable after the client's retries: try again soon;
                    # if SQS stays away, these holds run out and the messages come back.
                    retry_at = self.clock() + 1.0
                    with self._lock:
                        self.stats.renew_errors += 1
                    self._put_back(chunk, retry_at)
                    break
                took = self.clock() - called_at
                average = self._renew_call_seconds
                self._renew_call_seconds = took if not average else 0.9 * average + 0.1 * took
                renewed = [chunk[int(i)] for i in result.ok]
                refused = [chunk[int(i)] for i in result.failed]
                renewed_segment.add(renewed, called_at + hold - renew_ahead(hold))
                with self._lock:
                    # Stale (a later receive's handle is held too), visible again, or past
                    # SQS's 12 hours: not renewed again, but released at the end all the same.
                    self._holds.retire(refused)
                    self.stats.renew_calls += 1
                    self.stats.renewed += len(renewed)
                    self.stats.renew_failed += len(refused)
        finally:
            # Whatever was not renewed stays held (an error, a halt, or a bug above).
            for rest in chunks:
                self._put_back(rest, retry_at or self.clock())
            with self._lock:
                self._holds.adopt(renewed_segment)

    def _put_back(self, handles: Sequence[str], renew_at: float) -> None:
        with self._lock:
            self._holds.add(handles, renew_at)

    def _stop_renewing(self) -> None:
        self._halt.set()
        with self._lock:
            thread = self._renewer
        if thread is not None and thread is not threading.current_thread():
            # At most the call in flight; then every hold is back in self._holds.
            thread.join(timeout=60)

    def _delete_again(self, broker: Broker, messages: Sequence[Delivery]) -> None:
        """A copy of a message this scan deleted once it was sent or archived: the same
        message, so it goes the same way (an archive record written twice, or a purge
        counting one message twice, would be wrong)."""
        result = broker.ack(self.url, {str(i): m.tag for i, m in enumerate(messages)})
        # One that would not go stays held, and visible again when the scan ends.
        self.keep(broker, [m for i, m in enumerate(messages) if str(i) not in result.ok])

    def forget(self, messages: Sequence[Delivery]) -> None:
        """Messages deleted from the queue: they need not be remembered as held. What is
        remembered is then what the scan holds or works on, which SQS caps (about 120,000
        messages in flight per queue), and the last RECENTLY_DELETED deleted: memory stays
        flat however many messages a move or purge goes through. A copy of one of those SQS
        delivers again (it may: at least once) is deleted again, never handed out twice; an
        older one is handed out again, and the ledger knows it for what it is."""
        with self._lock:
            for message in messages:
                seen = digest(message.message_id)
                self._seen.discard(seen)
                if seen not in self._deleted:
                    self._deleted.add(seen)
                    self._deleted_order.append(seen)
            while len(self._deleted_order) > RECENTLY_DELETED:
                self._deleted.discard(self._deleted_order.popleft())

    # -- giving back ---------------------------------------------------------------------

    def release_now(self, broker: Broker, messages: Sequence[Delivery]) -> int:
        """Make messages visible at once (they may be received again by this scan)."""
        handles = {str(i): m.tag for i, m in enumerate(messages)}
        result = broker.release(self.url, handles)
        return len(result.ok)

    def extend(self, broker: Broker, messages: Sequence[Delivery], seconds: int) -> None:
        handles = {str(i): m.tag for i, m in enumerate(messages)}
        broker.extend(self.url, handles, seconds)

    def release_all(
        self, broker: Broker, *, on_progress: Callable[[int], None] | None = None
    ) -> None:
        """Make every held message visible again. Safe to call more than once."""
        self._stop_renewing()
        with self._lock:
            self._done = True
            segments = self._holds.every_segment()
        ready = self._ready(broker) if segments else None
        released = self.stats.released
        for segment in segments:
            # A segment leaves the holds once released whole: if a call fails, a second
            # release_all gives back what is left.
            for chunk in segment.chunks(self._batch):
                self._release(broker, chunk, on_progress)
            with self._lock:
                self._holds.remove(segment)
        if ready is not None:
            self._wait_landed(broker, ready + self.stats.released - released)
        if self.receive_log is not None:
            self.receive_log.flush()

    def _ready(self, broker: Broker) -> int | None:
        """The queue's ready count while the scan still holds everything, where a release
        lands later than it returns (None: nothing to wait for, or no count to be had)."""
        if not broker.capabilities.release_lands_later:
            return None
        try:
            return broker.counts(self.url).ready
        except RedriveError:
            return None

    def _wait_landed(self, broker: Broker, expected: int) -> None:
        """Wait, bounded, until the queue's ready count is back to ``expected``: what it was
        before the release, plus what was released. Other consumers of the queue may keep it
        lower: then the bound ends the wait and the shortfall is counted, not an error."""
        deadline = time.monotonic() + LANDING_SECONDS
        ready = expected
        with contextlib.suppress(RedriveError):
            while (ready := broker.counts(self.url).ready) < expected:
                if time.monotonic() > deadline:
                    break
                time.sleep(LANDING_POLL_SECONDS)
        self.stats.release_unseen = max(0, expected - ready)

    def _release(
        self, broker: Broker, handles: list[str], on_progress: Callable[[int], None] | None
    ) -> None:
        result = broker.release(self.url, {str(i): h for i, h in enumerate(handles)})
        # A failure here is a handle made stale by a later receive of the same message: the
        # newer handle is held too and releases it.
        self.stats.released += len(result.ok)
        self.stats.release_failed += len(result.failed)
        if on_progress is not None:
            on_progress(self.stats.released)

    def close(self) -> None:
        """Stop renewing and drop the spool, releasing nothing (after release_all, or when
        the run dies: then every hold runs out within its length)."""
        self._stop_renewing()
        with self._lock:
            segments = self._holds.clear()
        for segment in segments:
            with contextlib.suppress(OSError):
                segment.close()


def wait_until(deadline: float, stop: threading.Event) -> None:
    while not stop.is_set() and time.monotonic() < deadline:
        stop.wait(min(0.5, max(0.0, deadline - time.monotonic())))


def shared_by_workers(broker: Broker) -> bool:
    """Whether one ``broker`` may serve every worker thread of a run, instead of one each:
    SQS's lean path (issue 25), whose calls go through one thread-safe transport with a pool
    of keep-alive connections. Each SQS broker holds two botocore clients (about 1.1 MB of
    RSS apiece), so 16 workers on one broker spare about 17 MB; botocore's own path keeps a
    broker per worker, as its clients' connection pools are sized for one."""
    return getattr(broker, "lean", None) is not None


def run_pipelines(
    work: Callable[[Broker], None],
    first: Broker,
    broker_factory: Callable[[], Broker],
    workers: int,
    stop: threading.Event,
) -> None:
    """Run ``work`` in ``workers`` threads, each with a broker from ``broker_factory`` (its
    own, or one they share: :func:`shared_by_workers`).

    The first error stops the others (through ``stop``) and is re-raised.
    """

    # In the order they happened: what the other workers raise once stopped is a consequence,
    # the first error is the cause.
    failures: list[BaseException] = []
    failures_lock = threading.Lock()

    def guarded(broker: Broker) -> None:
        try:
            work(broker)
        except BaseException as exc:
            with failures_lock:
                failures.append(exc)
            stop.set()
            raise

    if workers <= 1:
        guarded(first)
        return
    # Before the workers' threads allocate: they share two malloc arenas, not one each.
    bound_arenas()
    clients = [first, *(broker_factory() for _ in range(workers - 1))]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="redrive") as pool:
        for client in clients:
            pool.submit(guarded, client)
    if failures:
        raise failures[0]
