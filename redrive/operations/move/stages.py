"""A worker's two stages: receiving and deciding the next batch (in a thread of its own,
:class:`Prefetch`) while this one is claimed, sent and deleted, once that overlap pays
(:func:`overlap_pays`)."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from redrive.operations.move.candidate import DecidedBatch

#: A worker's first stage (receive and decide) waiting at least this long per batch, off the
#: CPU, is worth overlapping with the second (claim, send, delete): see overlap_pays.
OVERLAP_MIN_WAIT = 0.001
#: Batches of one stage whose waits overlap_pays looks at (their median).
OVERLAP_SAMPLE = 5


def overlap_pays(waits: Sequence[float]) -> bool:
    """Whether a worker should receive and decide its next batch in a second thread, given
    how long its first stage was blocked in its last batches, in seconds: neither on a CPU
    nor waiting for one (:class:`redrive.operations.waiting.BlockedClock`; a busy machine's
    queue for a CPU is no wait a second thread could use). Yes once the median of the last
    :data:`OVERLAP_SAMPLE` is at least :data:`OVERLAP_MIN_WAIT`.

    Against a network each receive waits a round trip (milliseconds): overlapping it with
    the send and delete of the batch before is what makes a worker faster than the loop
    that does one after the other. Against an endpoint that answers in a fraction of a
    millisecond (loopback) there is no waiting to hide, and the two threads only cost CPU:
    about 60 µs a message in handing the GIL to each other (``bench/move.py``)."""
    recent = sorted(list(waits)[-OVERLAP_SAMPLE:])
    return len(recent) == OVERLAP_SAMPLE and recent[len(recent) // 2] >= OVERLAP_MIN_WAIT


@dataclass(frozen=True, slots=True)
class _Raised:
    error: BaseException


class Prefetch:
    """The first stage of a worker: ``produce`` runs in a thread of its own, at most one
    result ahead of the consumer. ``None`` ends the stream; what ``produce`` raises is
    raised by :meth:`get`."""

    def __init__(self, produce: Callable[[], DecidedBatch | None]) -> None:
        self._produce = produce
        self._queue: queue.Queue[DecidedBatch | _Raised | None] = queue.Queue(maxsize=1)
        # Taken before producing, given back by get(): one batch decided ahead, never two
        # (an interrupt then finishes at most that one more).
        self._slot = threading.Semaphore(1)
        self._halt = threading.Event()
        self._late: list[DecidedBatch] = []
        self._thread = threading.Thread(target=self._run, name="redrive-receive", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._halt.is_set():
                if not self._slot.acquire(timeout=0.1):
                    continue
                item = self._produce()
                self._put(item)
                if item is None:
                    return
        except BaseException as exc:
            self._put(_Raised(exc))

    def _put(self, item: DecidedBatch | _Raised | None) -> None:
        while not self._halt.is_set():
            with contextlib.suppress(queue.Full):
                self._queue.put(item, timeout=0.1)
                return
        if isinstance(item, DecidedBatch):
            # Decided as the stage closed: still one that nobody took (close() says so).
            self._late.append(item)

    def get(self) -> DecidedBatch | None:
        item = self._queue.get()
        self._slot.release()
        if isinstance(item, _Raised):
            raise item.error
        return item

    def close(self) -> list[DecidedBatch]:
        """Stop the thread; return what it decided that nobody took."""
        self._halt.set()
        left: list[DecidedBatch] = []
        while self._thread.is_alive() or not self._queue.empty():
            with contextlib.suppress(queue.Empty):
                item = self._queue.get(timeout=0.1)
                if isinstance(item, DecidedBatch):
                    left.append(item)
        left.extend(self._late)
        self._late.clear()
        return left
