"""Where each message goes: ``--to``, the queue its task routes to now (redrive.celery), or the
source queue it died in; and why, when there is no single one."""

from __future__ import annotations

import threading

from redrive.broker.base import Broker, Delivery, DlqTarget, QueueRef, queue_name
from redrive.celery.knowledge import NoTarget
from redrive.errors import QueueNotFound, RedriveError
from redrive.messages import UNKNOWN_TASK
from redrive.operations.move.options import MoveOptions
from redrive.operations.move.result import MoveTally


class Router:
    """A run's routes: the target of each message, with the routes per source queue (by the
    ident a message names) found once per run. Thread-safe."""

    def __init__(
        self, target: DlqTarget, options: MoveOptions, tally: MoveTally, *, archived: bool
    ) -> None:
        """``archived``: the messages come from an archive (no queue dead-letters into it)."""
        self.target = target
        self.options = options
        self._tally = tally
        self._archived = archived
        self._lock = threading.Lock()
        self._routes: dict[str, QueueRef | None] = {}

    def route(self, broker: Broker, message: Delivery, task: str | None = None) -> QueueRef | None:
        if self.options.to is not None:
            return self.options.to
        # redrive.celery: the queue the task routes to now (or a plan's target), if known.
        if self.options.celery is not None and task is not None:
            routed = self.options.celery.route(broker, task, message.message_id)
            if routed is not None:
                if routed.queue is None and routed.problem is not None:
                    self._tally.no_target(routed.problem)
                return routed.queue
        died_in = message.died_in
        if not died_in:
            return self._single_source(task)
        with self._lock:
            if died_in in self._routes:
                return self._routes[died_in]
        route = self.target.source_for(died_in)
        if route is None:
            route = self._described(broker, died_in)
        with self._lock:
            self._routes[died_in] = route
        return route

    def source_name(self, message: Delivery) -> str | None:
        return source_name(self.target, self.options.to, message)

    def _single_source(self, task: str | None) -> QueueRef | None:
        """A message that does not say where it died goes to the DLQ's one source, if any."""
        if self.target.single_source is None:
            self._tally.no_target(
                why_no_archived_source(task)
                if self._archived
                else why_no_single_source(self.target)
            )
        return self.target.single_source

    def _described(self, broker: Broker, died_in: str) -> QueueRef | None:
        """The queue a message died in that is not one of the target's sources, as the
        broker describes it (None, and why, when it cannot be used)."""
        name = queue_name(died_in)
        try:
            return broker.describe(died_in)
        except RedriveError as exc:
            self._tally.no_target(
                NoTarget(
                    f"the source queue the broker names ({name}, the queue the message "
                    f"died in) cannot be used: {exc}",
                    missing=name if isinstance(exc, QueueNotFound) else None,
                )
            )
            return None


def source_name(target: DlqTarget, to: QueueRef | None, message: Delivery) -> str | None:
    """The queue the message came from, when it is not sent there by choice (``--to``): a
    task's route may send it elsewhere (redrive.celery)."""
    if to is not None:
        return None
    if message.died_in:
        return queue_name(message.died_in)
    return target.single_source.name if target.single_source else None


def routed_from(source: str | None, target: str) -> str | None:
    """The source a task's route sends a message away from (redrive.celery), else None."""
    return source if source is not None and source != target else None


def why_no_single_source(target: DlqTarget) -> NoTarget:
    names = tuple(s.name for s in target.sources)
    if not names:
        return NoTarget(
            f"no queue dead-letters into {target.dlq.name} (ListDeadLetterSourceQueues found "
            "none) and SQS did not say where the messages came from"
        )
    return NoTarget(
        f"{target.dlq.name} has {len(names)} source queues ({', '.join(names)}, from "
        "ListDeadLetterSourceQueues) and SQS did not say which one each message came from",
        names,
    )


def why_no_archived_source(task: str | None) -> NoTarget:
    """An archive stands where a DLQ would, but no queue dead-letters into a file: its
    records go where their route or their recorded source says, or nowhere."""
    if task is None or task == UNKNOWN_TASK:
        return NoTarget(
            "their bodies are not Celery tasks, so no task route names a queue for them, and "
            "the archive does not say which queue they came from"
        )
    return NoTarget(
        f"no route names a queue for task {task} and the archive does not say which queue "
        "it came from (no record of the queue it died in)"
    )
