"""The DLQ scan: see every message of a queue once, and give back what was not consumed.

SQS has no peek: receiving a message hides it for its visibility timeout. A scan receives
batches, hands each message to the operation once, keeps the messages it does not consume
hidden until the scan ends (so they are not received again), and then makes them visible
again. Memory stays flat at any depth: receipt handles of held messages are spooled to a
temporary file, and the messages already seen are remembered as 8-byte digests until they
are deleted.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from redrive.sqs import MAX_BATCH_ENTRIES, Message, Sqs


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else default


#: SQS's longest visibility timeout (12 hours).
MAX_VISIBILITY = 43_200
#: Long polling for each receive: an empty answer then means the queue really had nothing
#: visible (short polls sample only some SQS servers). Unit tests set it to 0.
RECEIVE_WAIT_SECONDS = _env_int("REDRIVE_RECEIVE_WAIT", 1)


def hold_for_depth(depth: int, *, floor: int = 120) -> int:
    """A visibility timeout long enough to keep messages hidden for a whole scan of ``depth``.

    Assumes a conservative 50 messages a second; if a scan is slower, held messages come
    back early and are recognised as already seen, so counts stay exact either way.
    """
    return max(floor, min(MAX_VISIBILITY, floor + depth // 50))


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


def digest(message_id: str) -> int:
    """An 8-byte stand-in for an id in sets that grow with the queue."""
    return int.from_bytes(hashlib.blake2b(message_id.encode(), digest_size=8).digest(), "big")


@dataclass
class DlqScan:
    """One pass over a queue, shared by any number of worker threads (each with its own Sqs)."""

    url: str
    lease: int
    """Visibility timeout of each receive: how long the operation has to work on a batch."""
    hold: int
    """Visibility timeout of messages kept hidden until the scan ends (``>= lease``)."""
    max_messages: int | None = None
    wait_seconds: int | None = None
    stop_after_empty: int = 3
    """Empty receives in a row after which the scan ends whatever SQS's counts say."""
    stop: threading.Event = field(default_factory=threading.Event)
    on_receive: Callable[[int], None] | None = None
    stats: ScanStats = field(default_factory=ScanStats)

    #: Messages taken from a DLQ are deleted from it once sent or archived.
    deletes = True

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[int] = set()
        # Closed by close(); it lives as long as the scan.
        self._spool = tempfile.TemporaryFile(mode="w+", encoding="ascii", prefix="redrive-")  # noqa: SIM115
        self._consecutive_empty = 0
        self._stale_run = 0
        self._done = False

    # -- receiving -----------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self._done or self.stop.is_set()

    def next_batch(self, sqs: Sqs) -> list[Message] | None:
        """New messages (never seen in this scan), or ``None`` when the scan is over.

        Messages seen before are held again without being returned.
        """
        while not self.done:
            with self._lock:
                want = MAX_BATCH_ENTRIES
                if self.max_messages is not None:
                    want = min(want, self.max_messages - self.stats.received)
                    if want <= 0:
                        self._done = True
                        return None
            messages = sqs.receive(
                self.url,
                visibility_timeout=self.lease,
                wait_seconds=(
                    RECEIVE_WAIT_SECONDS if self.wait_seconds is None else self.wait_seconds
                ),
                max_messages=want,
            )
            fresh: list[Message] = []
            stale: list[Message] = []
            with self._lock:
                self.stats.receives += 1
                if not messages:
                    self.stats.empty_receives += 1
                    self._consecutive_empty += 1
                    if self._consecutive_empty >= self.stop_after_empty:
                        self._done = True
                    empty = self._consecutive_empty
                else:
                    empty = 0
            if empty:
                # An empty long poll and a queue that counts nothing visible: covered. One
                # attribute call, where a second long poll would cost a second of waiting.
                if not self._done and self._nothing_visible(sqs):
                    with self._lock:
                        self._done = True
                continue
            with self._lock:
                self._consecutive_empty = 0
                for message in messages:
                    seen = digest(message.message_id)
                    if seen in self._seen:
                        stale.append(message)
                    else:
                        self._seen.add(seen)
                        fresh.append(message)
                if self.max_messages is not None:
                    # Concurrent receivers may overshoot --limit; what is over it goes back.
                    room = max(0, self.max_messages - self.stats.received)
                    stale.extend(fresh[room:])
                    fresh = fresh[:room]
                self.stats.received += len(fresh)
                self.stats.seen_again += len(stale)
                # Seen messages come back when their lease ran out (a slow consumer), and SQS
                # may return them before the unseen ones: a few stale receives in a row do not
                # mean the queue is covered. Each stale receive hides what it got again, so
                # once every seen message came back with nothing new among them, it is.
                self._stale_run = 0 if fresh else self._stale_run + len(stale)
                if self._stale_run > len(self._seen):
                    self._done = True
                received = self.stats.received
            if stale:
                self.keep(sqs, stale)
            if fresh:
                if self.on_receive is not None:
                    self.on_receive(received)
                return fresh
        return None

    def _nothing_visible(self, sqs: Sqs) -> bool:
        counts = sqs.attributes(self.url, ["ApproximateNumberOfMessages"])
        return counts.get("ApproximateNumberOfMessages", "0") == "0"

    def stop_receiving(self) -> None:
        """End the scan after the batches in progress (e.g. ``--limit`` reached)."""
        with self._lock:
            self._done = True

    # -- giving back ---------------------------------------------------------------------

    def keep(self, sqs: Sqs, messages: Sequence[Message]) -> None:
        """Keep messages hidden until the scan ends; they are released by :meth:`release_all`."""
        if not messages:
            return
        if self.hold > self.lease:
            handles = {str(i): m.receipt_handle for i, m in enumerate(messages)}
            sqs.change_visibility_batch(self.url, handles, self.hold)
        with self._lock:
            for message in messages:
                self._spool.write(message.receipt_handle + "\n")
            self.stats.held += len(messages)

    def forget(self, messages: Sequence[Message]) -> None:
        """Messages deleted from the queue: they cannot come back, so they need not be
        remembered. What is remembered is then what the scan holds or works on, which SQS
        caps (about 120,000 messages in flight per queue): memory stays flat however many
        messages a move or purge goes through. A deleted message SQS delivers once more (it
        may, rarely) is then handed out again, and the ledger knows it for what it is."""
        with self._lock:
            for message in messages:
                self._seen.discard(digest(message.message_id))

    def release_now(self, sqs: Sqs, messages: Sequence[Message]) -> int:
        """Make messages visible at once (they may be received again by this scan)."""
        handles = {str(i): m.receipt_handle for i, m in enumerate(messages)}
        result = sqs.change_visibility_batch(self.url, handles, 0)
        return len(result.ok)

    def extend(self, sqs: Sqs, messages: Sequence[Message], seconds: int) -> None:
        handles = {str(i): m.receipt_handle for i, m in enumerate(messages)}
        sqs.change_visibility_batch(self.url, handles, seconds)

    def release_all(self, sqs: Sqs, *, on_progress: Callable[[int], None] | None = None) -> None:
        """Make every held message visible again. Safe to call more than once."""
        with self._lock:
            self._done = True
            self._spool.flush()
            self._spool.seek(0)
            chunk: list[str] = []
            for line in self._spool:
                chunk.append(line.rstrip("\n"))
                if len(chunk) == MAX_BATCH_ENTRIES:
                    self._release(sqs, chunk, on_progress)
                    chunk = []
            if chunk:
                self._release(sqs, chunk, on_progress)
            self._spool.seek(0)
            self._spool.truncate()

    def _release(
        self, sqs: Sqs, handles: list[str], on_progress: Callable[[int], None] | None
    ) -> None:
        result = sqs.change_visibility_batch(
            self.url, {str(i): h for i, h in enumerate(handles)}, 0
        )
        # A failure here is a handle made stale by a later receive of the same message: the
        # newer handle is in the spool too and releases it.
        self.stats.released += len(result.ok)
        self.stats.release_failed += len(result.failed)
        if on_progress is not None:
            on_progress(self.stats.released)

    def close(self) -> None:
        self._spool.close()


def wait_until(deadline: float, stop: threading.Event) -> None:
    while not stop.is_set() and time.monotonic() < deadline:
        stop.wait(min(0.5, max(0.0, deadline - time.monotonic())))


def run_pipelines(
    work: Callable[[Sqs], None],
    first: Sqs,
    sqs_factory: Callable[[], Sqs],
    workers: int,
    stop: threading.Event,
) -> None:
    """Run ``work`` in ``workers`` threads, each with its own client.

    The first error stops the others (through ``stop``) and is re-raised.
    """

    # In the order they happened: what the other workers raise once stopped is a consequence,
    # the first error is the cause.
    failures: list[BaseException] = []
    failures_lock = threading.Lock()

    def guarded(sqs: Sqs) -> None:
        try:
            work(sqs)
        except BaseException as exc:
            with failures_lock:
                failures.append(exc)
            stop.set()
            raise

    if workers <= 1:
        guarded(first)
        return
    clients = [first, *(sqs_factory() for _ in range(workers - 1))]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="redrive") as pool:
        for client in clients:
            pool.submit(guarded, client)
    if failures:
        raise failures[0]
