"""What the engine asks about each message's task: where it goes (the queue its route names
now, or the one a plan recorded), and whether to keep it in the DLQ because no worker
registers it. :class:`TaskKnowledge` is the one object ``MoveOptions.celery`` carries; the
engine calls :meth:`~TaskKnowledge.route` in ``Router.route`` and :func:`skip_reason` in
``Decider._select``'s skip chain (:mod:`redrive.operations.move`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from redrive.broker.base import Broker, QueueRef, queue_name
from redrive.celery.registry import Registry
from redrive.celery.routes import TaskRouter
from redrive.errors import BrokerUnavailable, QueueNotFound, RedriveError
from redrive.messages import UNKNOWN_TASK, TaskInfo

RouteMode = Literal["task", "source"]
ROUTE_MODES: tuple[RouteMode, ...] = ("task", "source")
#: The skip reason of a task the app does not register (``skipped_by_reason.unregistered``).
UNREGISTERED = "unregistered"


@dataclass(frozen=True, slots=True)
class NoTarget:
    """Why messages have no queue to go to (``no-target``), and what would give them one:
    the summary builds its advice from these, so that every way it offers works."""

    reason: str
    candidates: tuple[str, ...] = ()
    """Existing queues ``--to`` could name (the DLQ's source queues)."""
    missing: str | None = None
    """The queue named for them, which does not exist: creating it is a way."""
    by_route: bool = False
    """Their task's route (or a plan's target) named where they go: ``--route source``
    (back to each message's source queue) is a way."""


@dataclass(frozen=True, slots=True)
class Routed:
    """Where a task's route sends a message: ``queue``, or nowhere for ``problem``."""

    queue: QueueRef | None
    problem: NoTarget | None = None


@dataclass
class TaskKnowledge:
    router: TaskRouter | None = None
    registry: Registry | None = None
    route_by_task: bool = False
    include_unregistered: bool = False
    planned: Mapping[str, str] | None = None
    """A plan's MessageId -> target URL: ``apply`` sends each message where it was reviewed."""
    _queues: dict[str, Routed] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def routes_known(self) -> bool:
        return self.router is not None

    def address_for(self, task: str) -> str | None:
        """The SQS queue (name or URL) ``task`` routes to; None for no route (or not a task)."""
        if self.router is None or task == UNKNOWN_TASK:
            return None
        return self.router.queue_for(task)

    def route(self, broker: Broker, task: str, message_id: str) -> Routed | None:
        """Where the message goes instead of its source; None: to its source."""
        if self.planned is not None:
            url = self.planned.get(message_id)
            return self._resolve(broker, url, f"message {message_id}'s target") if url else None
        if not self.route_by_task:
            return None
        try:
            address = self.address_for(task)
        except RedriveError as exc:
            return Routed(None, NoTarget(str(exc), by_route=True))
        if address is None:
            return None
        return self._resolve(broker, address, f"task {task} routes to {queue_name(address)}")

    def _resolve(self, broker: Broker, address: str, why: str) -> Routed:
        with self._lock:
            known = self._queues.get(address)
        if known is not None:
            return known
        try:
            routed = Routed(broker.describe(address))
        except BrokerUnavailable:
            raise  # no queue can be reached: the run stops, as it would for its source
        except RedriveError as exc:
            routed = Routed(
                None,
                NoTarget(
                    f"{why} ({self.router.origin if self.router else 'plan'}), which cannot be "
                    f"used: {exc}",
                    missing=queue_name(address) if isinstance(exc, QueueNotFound) else None,
                    by_route=True,
                ),
            )
        with self._lock:
            self._queues[address] = routed
        return routed


def skip_reason(knowledge: TaskKnowledge | None, info: TaskInfo) -> str | None:
    """``unregistered`` for a task the app does not register (a worker would drop it),
    unless ``--include-unregistered``; None otherwise (and for bodies that are not tasks)."""
    if knowledge is None or knowledge.registry is None or knowledge.include_unregistered:
        return None
    return UNREGISTERED if knowledge.registry.is_unregistered(info.task) else None
