"""The queues of one in-memory broker: messages, holds, receive counts and dead-lettering,
kept in this process only (nothing persists: for tests and examples, never for real work).

A store keeps what SQS keeps of a message (its id, body, what travels with it, how often
it was received, when it was sent) and hands a copy out held for a while, as SQS's
visibility timeout does: a tag names one receive, and only the latest receive's tag acks,
holds or releases the copy. A source queue with a dead-letter queue and a receive limit
moves a message there on the receive after the limit, as SQS's redrive policy does.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from redrive.broker.base import Headers
from redrive.errors import QueueNotFound, UsageProblem

SCHEME: Final = "memory"


@dataclass(slots=True)
class Stored:
    """One message in a queue."""

    message_id: str
    body: str
    headers: Headers
    enqueued_at: float
    group_id: str | None = None
    receive_count: int = 0
    visible_at: float = 0.0
    tag: str = ""
    """The latest receive's tag ("": never received, or released)."""
    died_in: str | None = None


@dataclass(slots=True)
class MemoryQueue:
    name: str
    url: str
    ident: str
    dead_letter_target: str | None = None
    max_receive_count: int | None = None
    messages: dict[str, Stored] = field(default_factory=dict)
    """By message id, in the order they were enqueued."""


class MemoryStore:
    """One named broker's queues. Thread-safe: every worker thread of a run may share it."""

    def __init__(
        self,
        name: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.clock = clock
        self.wall = wall
        self.queues: dict[str, MemoryQueue] = {}
        self.lock = threading.Condition()
        self._ids = itertools.count(1)
        self.lost_confirms: set[str] = set()
        """Send entry ids whose answer a test wants lost (the message is queued, in doubt)."""

    # -- queues ----------------------------------------------------------------------------

    def create_queue(
        self,
        QueueName: str,  # the SQS clients' spelling: tests make queues alike on every backend
        *,
        dead_letter_queue: str | None = None,
        max_receive_count: int | None = None,
    ) -> dict[str, str]:
        """Make a queue (again: the same one); with a DLQ (its name) it dead-letters there."""
        with self.lock:
            target = self.queue(dead_letter_queue).ident if dead_letter_queue else None
            if QueueName not in self.queues:
                self.queues[QueueName] = MemoryQueue(
                    name=QueueName,
                    url=f"{SCHEME}://{self.name}/{QueueName}",
                    ident=f"{SCHEME}:{self.name}:{QueueName}",
                )
            queue = self.queues[QueueName]
            if dead_letter_queue is not None:
                queue.dead_letter_target, queue.max_receive_count = target, max_receive_count
            return {"QueueUrl": queue.url}

    def queue(self, name_or_address: str) -> MemoryQueue:
        """A queue by name, address or ident."""
        name = name_or_address.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
        found = self.queues.get(name)
        if found is None or name_or_address not in (found.name, found.url, found.ident):
            raise QueueNotFound(f"queue {name_or_address} does not exist on {self.name}")
        return found

    def new_id(self) -> str:
        return f"{self.name}-{next(self._ids):08d}"

    # -- messages --------------------------------------------------------------------------

    def enqueue(self, queue: MemoryQueue, message: Stored) -> None:
        queue.messages[message.message_id] = message
        self.lock.notify_all()

    def visible(self, queue: MemoryQueue, now: float) -> list[Stored]:
        return [m for m in queue.messages.values() if m.visible_at <= now]

    def dead_letter(self, queue: MemoryQueue, message: Stored) -> bool:
        """Move a message past its queue's receive limit to the DLQ (True: moved)."""
        limit, target = queue.max_receive_count, queue.dead_letter_target
        if limit is None or target is None or message.receive_count < limit:
            return False
        dlq = self.queue(target)
        del queue.messages[message.message_id]
        message.tag, message.visible_at, message.died_in = "", 0.0, queue.ident
        self.enqueue(dlq, message)
        return True


#: Every in-memory broker of this process, by name.
_STORES: dict[str, MemoryStore] = {}
_STORES_LOCK = threading.Lock()


def memory_store(name: str) -> MemoryStore:
    """The in-memory broker called ``name`` (made on first use)."""
    if not name or "/" in name:
        raise UsageProblem(f"an in-memory broker's URL is {SCHEME}://NAME (got {name!r})")
    with _STORES_LOCK:
        if name not in _STORES:
            _STORES[name] = MemoryStore(name)
        return _STORES[name]


def forget_store(name: str) -> None:
    """Drop a named broker and every message in it."""
    with _STORES_LOCK:
        _STORES.pop(name, None)
