"""``move --native`` on RabbitMQ: a dynamic shovel moves the whole DLQ back, server-side.

The shovel (management API, ``/api/parameters/shovel/VHOST/NAME``) consumes the DLQ and
publishes each message, properties and x-death untouched, to exactly one queue through the
default exchange; ``ack-mode: on-confirm`` acks a message only once the destination
confirmed it, and ``src-delete-after: queue-length`` makes the shovel delete itself once it
moved as many messages as the DLQ held when it started. Like SQS's move tasks it cannot
filter and bypasses redrive's ledger. Both URIs are direct connections inside the node
(``amqp:///VHOST``): no credentials are written into the parameter.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, Final

from redrive.broker.base import DlqTarget, QueueRef
from redrive.broker.native import (
    CANCELLED,
    COMPLETED,
    FAILED,
    RUNNING,
    MoveTask,
    MoveTaskRunning,
    NativePlan,
    NoRunningMoveTask,
)
from redrive.broker.rabbitmq.broker import RabbitBroker
from redrive.errors import RedriveError, UsageProblem

#: redrive's shovels are named ``redrive-<DLQ>``: one at a time per DLQ, as on SQS.
PREFIX: Final = "redrive-"
COMPONENT: Final = "shovel"


def shovel_name(dlq: str) -> str:
    return f"{PREFIX}{dlq}"


class Shovels:
    """RabbitMQ's dynamic shovels behind :class:`redrive.broker.native.NativeMover`."""

    server = "RabbitMQ"
    noun = "shovel"

    def __init__(self, broker: RabbitBroker, *, clock: Callable[[], float] = time.time) -> None:
        self.broker = broker
        self.api = broker.queues.api
        self.vhost = broker.queues.vhost
        self.clock = clock
        # What this process started: how many the DLQ held then, and when.
        self._started: dict[str, tuple[int, float]] = {}

    # -- the request ---------------------------------------------------------------------

    def destination_of(self, target: DlqTarget, destination: QueueRef | None) -> QueueRef:
        """``--to``, else the DLQ's one source queue; several sources need ``--to``."""
        if destination is None:
            destination = target.single_source
            if destination is None:
                names = ", ".join(s.name for s in target.sources)
                raise UsageProblem(
                    f"{target.dlq.name} has {len(target.sources)} source queues ({names}) and a "
                    "shovel moves every message to one queue: choose it with --to"
                    if target.sources
                    else f"no queue dead-letters into {target.dlq.name}: name the "
                    "destination with --to"
                )
        if destination.name == target.dlq.name:
            raise UsageProblem(f"--to {destination.name} is the DLQ itself: name another queue")
        return destination

    def check(
        self, target: DlqTarget, *, destination: QueueRef | None, rate: float | None
    ) -> int | None:
        if rate is not None:
            raise UsageProblem(
                "--rate cannot be used with --native on RabbitMQ: a shovel has no rate limit "
                "(drop --native to move at a chosen rate)"
            )
        self.destination_of(target, destination)
        return None

    def definition(self, target: DlqTarget, destination: QueueRef) -> dict[str, Any]:
        uri = "amqp:///" + urllib.parse.quote(self.vhost, safe="")
        return {
            "src-protocol": "amqp091",
            "src-uri": uri,
            "src-queue": target.dlq.name,
            "src-delete-after": "queue-length",
            "dest-protocol": "amqp091",
            "dest-uri": uri,
            "dest-queue": destination.name,
            "ack-mode": "on-confirm",
        }

    # -- the seam ------------------------------------------------------------------------

    def plan(
        self, target: DlqTarget, *, destination: QueueRef | None, rate: float | None
    ) -> NativePlan:
        self.check(target, destination=destination, rate=rate)
        to = self.destination_of(target, destination)
        running: MoveTask | None = None
        unknown: str | None = None
        try:
            running = next((t for t in self.listed(target) if not t.terminal), None)
        except RedriveError as exc:  # only informs the dry run
            unknown = str(exc)
        name = shovel_name(target.dlq.name)
        return NativePlan(
            dlq=target.dlq,
            destination=to,
            sources=tuple(s.name for s in target.sources),
            rate=None,
            approximate_messages=self.broker.counts(target.dlq.name).ready,
            running=running,
            running_unknown=unknown,
            mechanism=f"RabbitMQ dynamic shovel {name}",
            server="RabbitMQ",
            extra=(("shovel", name), ("definition", self.definition(target, to))),
        )

    def start(self, target: DlqTarget, *, destination: QueueRef | None, rate: float | None) -> str:
        self.check(target, destination=destination, rate=rate)
        to = self.destination_of(target, destination)
        name = shovel_name(target.dlq.name)
        if self.api.get("parameters", COMPONENT, self.vhost, name) is not None:
            raise MoveTaskRunning(
                f"shovel {name} already moves DLQ {target.dlq.name}: watch it with "
                f"`redrive tasks {target.label}`, stop it with `redrive tasks {target.label} "
                "--cancel`"
            )
        depth = self.broker.counts(target.dlq.name).ready
        self._started[name] = (depth, self.clock())
        self.api.put(
            "parameters",
            COMPONENT,
            self.vhost,
            name,
            body={"value": self.definition(target, to)},
        )
        return name

    def follow(
        self,
        target: DlqTarget,
        handle: str,
        *,
        poll_seconds: float,
        stop: threading.Event,
        on_progress: Callable[[MoveTask], None],
    ) -> MoveTask:
        """Poll until the shovel deleted itself (COMPLETED), terminated (FAILED) or was
        deleted by someone else; ``stop`` ends following, never the shovel."""
        while True:
            task = self._seen(target, handle)
            on_progress(task)
            if task.terminal or stop.wait(poll_seconds):
                return task

    def listed(self, target: DlqTarget) -> list[MoveTask]:
        params = self.api.get("parameters", COMPONENT, self.vhost) or []
        states = {s.get("name"): s for s in self.api.get("shovels", self.vhost) or []}
        found = [
            self._task(target, str(p["name"]), p.get("value") or {}, states.get(p["name"]))
            for p in params
            if str(p.get("name", "")).startswith(PREFIX)
            and (p.get("value") or {}).get("src-queue") == target.dlq.name
        ]
        return sorted(found, key=lambda t: t.started or 0.0, reverse=True)

    def cancel(self, target: DlqTarget) -> MoveTask | None:
        # Every listed shovel still exists: a terminated one restarts after its reconnect
        # delay, so it is cancelled as a running one is.
        running = next(iter(self.listed(target)), None)
        if running is None or running.handle is None:
            raise NoRunningMoveTask(
                f"no shovel of redrive's moves DLQ {target.dlq.name}: nothing to cancel"
            )
        if not self.api.delete("parameters", COMPONENT, self.vhost, running.handle):
            return None  # it deleted itself first: the move completed
        return MoveTask(
            status=CANCELLED,
            moved=running.moved,
            to_move=running.to_move,
            started=running.started,
            failure_reason=None,
            handle=running.handle,
            source_arn=running.source_arn,
            destination_arn=running.destination_arn,
            rate=None,
        )

    # -- reading a shovel ----------------------------------------------------------------

    def _seen(self, target: DlqTarget, name: str) -> MoveTask:
        param = self.api.get("parameters", COMPONENT, self.vhost, name)
        if param is None:
            # src-delete-after deleted it: everything it set out to move is moved.
            to_move, started = self._started.get(name, (0, None))
            return self._made(target, name, {}, COMPLETED, to_move, to_move, started, None)
        state = next(
            (s for s in self.api.get("shovels", self.vhost) or [] if s.get("name") == name), None
        )
        return self._task(target, name, param.get("value") or {}, state)

    def _task(
        self, target: DlqTarget, name: str, value: dict[str, Any], state: dict[str, Any] | None
    ) -> MoveTask:
        started_at = self._started.get(name)
        to_move = started_at[0] if started_at else None
        moved = 0
        if to_move is not None:
            moved = max(0, to_move - self.broker.counts(target.dlq.name).ready)
        status, reason = RUNNING, None
        if state is not None and state.get("state") == "terminated":
            # It retries after its reconnect delay until cancelled: say so.
            why = " ".join(str(state.get("reason", "terminated")).split())
            status, reason = FAILED, f"{why} (it retries; `redrive tasks --cancel` stops it)"
        return self._made(
            target,
            name,
            value,
            status,
            moved,
            to_move,
            started_at[1] if started_at else None,
            reason,
        )

    def _made(
        self,
        target: DlqTarget,
        name: str,
        value: dict[str, Any],
        status: str,
        moved: int,
        to_move: int | None,
        started: float | None,
        reason: str | None,
    ) -> MoveTask:
        dest = value.get("dest-queue")
        return MoveTask(
            status=status,
            moved=moved,
            to_move=to_move,
            started=started,
            failure_reason=reason,
            handle=name,
            source_arn=target.dlq.ident,
            destination_arn=self.broker.queues.ident(str(dest)) if dest else None,
            rate=None,
        )
