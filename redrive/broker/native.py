"""Server-side moves of a whole DLQ, whichever broker runs them: SQS's message move tasks
(:mod:`redrive.broker.sqs.native`), RabbitMQ's dynamic shovels
(:mod:`redrive.broker.rabbitmq.shovel`).

The broker moves the messages itself, so nothing can be filtered and redrive's ledger is
bypassed: the CLI offers it only for moving every message back, refusing any selection.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from redrive.broker.base import Broker, DlqTarget, QueueRef, queue_name
from redrive.durations import iso_utc
from redrive.errors import RedriveError

RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
CANCELLING = "CANCELLING"
CANCELLED = "CANCELLED"
FAILED = "FAILED"
TERMINAL = frozenset({COMPLETED, CANCELLED, FAILED})


class MoveTaskRunning(RedriveError):
    """The broker allows one active server-side move per DLQ, and the DLQ already has one."""


class NoRunningMoveTask(RedriveError):
    """Nothing to cancel: no server-side move of the DLQ is running."""


@dataclass(frozen=True, slots=True)
class MoveTask:
    """One server-side move, as the broker lists it."""

    status: str
    """RUNNING, COMPLETED, CANCELLING, CANCELLED or FAILED."""
    moved: int
    to_move: int | None
    """How many the move set out to move, when the broker (or redrive) knows."""
    started: float | None
    """Seconds since the epoch."""
    failure_reason: str | None
    handle: str | None
    """What cancels it: SQS's task handle, the shovel's name."""
    source_arn: str
    """The DLQ's ident."""
    destination_arn: str | None
    """``None``: each message goes back to the queue it was dead-lettered from."""
    rate: int | None
    """Messages per second at most, ``None`` when the broker chooses (or has no limit)."""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def destination(self) -> str | None:
        return queue_name(self.destination_arn) if self.destination_arn else None

    def to_json(self) -> dict[str, Any]:
        return {
            "task_handle": self.handle,
            "status": self.status,
            "moved": self.moved,
            "to_move": self.to_move,
            "started": iso_utc(self.started),
            "failure_reason": self.failure_reason,
            "source_arn": self.source_arn,
            "destination_arn": self.destination_arn,
            "max_messages_per_second": self.rate,
        }


@dataclass(frozen=True, slots=True)
class NativePlan:
    """What ``move --native`` would start: the dry run's answer."""

    dlq: QueueRef
    destination: QueueRef | None
    sources: tuple[str, ...]
    rate: int | None
    approximate_messages: int | None
    running: MoveTask | None
    """An active move that would make the start fail."""
    running_unknown: str | None = None
    """Why the check for an active move could not be made."""
    mechanism: str = "SQS StartMessageMoveTask"
    """What the broker runs, as the dry run names it."""
    server: str = "SQS"
    extra: tuple[tuple[str, Any], ...] = ()
    """Broker-specific facts for the JSON (a shovel's name and definition)."""
    chosen_rate_ceiling: int | None = None
    """With no ``rate`` asked, the most messages a second the broker chooses up to from the
    backlog (SQS: 500); None: it has no limit of its own."""

    @property
    def destination_label(self) -> str:
        return destination_label(self.destination, self.sources)

    def to_json(self) -> dict[str, Any]:
        return {
            "native": True,
            "dry_run": True,
            "dlq": self.dlq.name,
            "dlq_arn": arn(self.dlq),
            "destination": self.destination.name if self.destination else None,
            "destination_arn": arn(self.destination) if self.destination else None,
            "sources": list(self.sources),
            "rate": self.rate,
            "approximate_messages": self.approximate_messages,
            "running_task": self.running.to_json() if self.running else None,
            **dict(self.extra),
        }


def arn(queue: QueueRef) -> str | None:
    """The queue's ARN for the JSON's ``*_arn`` keys: SQS's ident; a RabbitMQ queue has none
    (its ident, ``VHOST/NAME``, read ``//onion-dlq`` on vhost ``/``): null."""
    return queue.ident if queue.ident.startswith("arn:") else None


def destination_label(destination: QueueRef | None, sources: tuple[str, ...]) -> str:
    if destination is not None:
        return destination.name
    where = f" ({', '.join(sources)})" if sources else ""
    return f"each message's original source queue{where}"


def native_mover(broker: Broker) -> NativeMover | None:
    """The broker's own move of a whole DLQ, as its capabilities name it (None: it has
    none)."""
    capabilities = broker.capabilities
    if not capabilities.native_move or not capabilities.native_mover:
        return None
    module, _, factory = capabilities.native_mover.partition(":")
    made: NativeMover = getattr(importlib.import_module(module), factory)(broker)
    return made


class NativeMover(Protocol):
    """A broker's own move of a whole DLQ: what ``move --native`` and ``tasks`` call."""

    server: str
    """Who moves the messages, in messages ("SQS", "RabbitMQ")."""
    noun: str
    """What one move is called ("move task", "shovel")."""

    def check(
        self, target: DlqTarget, *, destination: QueueRef | None, rate: float | None
    ) -> int | None:
        """Refuse what the broker cannot start, before anything is sent; the rate it takes."""
        ...

    def plan(
        self, target: DlqTarget, *, destination: QueueRef | None, rate: float | None
    ) -> NativePlan: ...

    def start(self, target: DlqTarget, *, destination: QueueRef | None, rate: float | None) -> str:
        """Start the move; its handle."""
        ...

    def follow(
        self,
        target: DlqTarget,
        handle: str,
        *,
        poll_seconds: float,
        stop: threading.Event,
        on_progress: Callable[[MoveTask], None],
    ) -> MoveTask:
        """The move as last seen: ended, or still running when ``stop`` was set."""
        ...

    def listed(self, target: DlqTarget) -> list[MoveTask]:
        """The DLQ's moves the broker still knows, newest first."""
        ...

    def cancel(self, target: DlqTarget) -> MoveTask | None:
        """Cancel the running move (what moved stays moved); ``None``: it ended first."""
        ...
