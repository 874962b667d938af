"""Server-side moves: SQS's own DLQ redrive (StartMessageMoveTask), followed and cancelled.

SQS moves the messages itself, up to 500 a second, but it cannot filter and it knows nothing
of redrive's ledger (no idempotency keys, no expired / poison / in-doubt checks). So it is
offered only for moving a whole DLQ back, and the CLI refuses it together with any selection.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import botocore.exceptions

from redrive.aws.errors import ACCESS_CODES, aws_errors, error_code
from redrive.broker import native
from redrive.broker.base import DlqTarget, QueueRef
from redrive.broker.native import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    FAILED,
    RUNNING,
    TERMINAL,
    MoveTaskRunning,
    NativePlan,
    NoRunningMoveTask,
    destination_label,
)
from redrive.broker.sqs.broker import SqsBroker
from redrive.broker.sqs.calls import COUNT_ATTRIBUTES
from redrive.errors import AwsError, RedriveError, UsageProblem

__all__ = [
    "CANCELLED",
    "CANCELLING",
    "COMPLETED",
    "FAILED",
    "RUNNING",
    "TERMINAL",
    "MoveTask",
    "MoveTaskRunning",
    "NativePlan",
    "NoRunningMoveTask",
    "SqsMoveTasks",
    "cancel_move_task",
    "destination_label",
    "follow_native_move",
    "list_move_tasks",
    "native_request",
    "plan_native_move",
    "start_native_move",
    "validate_rate",
]

#: SQS's ceiling for MaxNumberOfMessagesPerSecond.
MAX_NATIVE_RATE = 500
#: ListMessageMoveTasks returns at most this many (the most recent) tasks.
MAX_LISTED_TASKS = 10

# Our clock and SQS's StartedTimestamp may disagree a little; a task that started more than
# this long before we asked for it cannot be ours.
CLOCK_SKEW_SECONDS = 120.0

# Codes SQS has used to refuse a second task on a queue that already has an active one.
_CONFLICT_CODES = {
    "InvalidParameterValue",
    "UnsupportedOperation",
    "AWS.SimpleQueueService.UnsupportedOperation",
}


class MoveTask(native.MoveTask):
    """One entry of ListMessageMoveTasks (SQS gives the handle only while RUNNING, and
    ApproximateNumberOfMessagesToMove once the task really starts)."""

    __slots__ = ()

    @classmethod
    def from_response(cls, raw: Mapping[str, Any]) -> MoveTask:
        to_move = raw.get("ApproximateNumberOfMessagesToMove")
        rate = raw.get("MaxNumberOfMessagesPerSecond")
        return cls(
            status=str(raw.get("Status", "")),
            moved=int(raw.get("ApproximateNumberOfMessagesMoved") or 0),
            to_move=int(to_move) if to_move is not None else None,
            started=_epoch_seconds(raw.get("StartedTimestamp")),
            failure_reason=_one_line(raw.get("FailureReason")),
            handle=raw.get("TaskHandle") or None,
            source_arn=str(raw.get("SourceArn", "")),
            destination_arn=raw.get("DestinationArn") or None,
            rate=int(rate) if rate is not None else None,
        )


def validate_rate(rate: float | None) -> int | None:
    """``--rate`` as MaxNumberOfMessagesPerSecond: a whole number from 1 to 500."""
    if rate is None:
        return None
    if not 1 <= rate <= MAX_NATIVE_RATE or rate != int(rate):
        raise UsageProblem(
            f"--rate {rate:g} cannot be used with --native: SQS's StartMessageMoveTask takes a "
            f"whole number of messages per second from 1 to {MAX_NATIVE_RATE}"
        )
    return int(rate)


def native_request(
    target: DlqTarget, *, destination: QueueRef | None, rate: float | None
) -> dict[str, Any]:
    """The StartMessageMoveTask parameters, checked before anything is sent."""
    if not target.dlq.ident:
        raise RedriveError(f"SQS gave no ARN for DLQ {target.dlq.name}: cannot start a move task")
    request: dict[str, Any] = {"SourceArn": target.dlq.ident}
    if destination is not None:
        if not destination.ident:
            raise RedriveError(f"SQS gave no ARN for queue {destination.name}: cannot move to it")
        if destination.ident == target.dlq.ident:
            raise UsageProblem(f"--to {destination.name} is the DLQ itself: name another queue")
        request["DestinationArn"] = destination.ident
    per_second = validate_rate(rate)
    if per_second is not None:
        request["MaxNumberOfMessagesPerSecond"] = per_second
    return request


def plan_native_move(
    broker: SqsBroker, target: DlqTarget, *, destination: QueueRef | None, rate: float | None
) -> NativePlan:
    """Check the request and read what the dry run shows: the DLQ's depth, an active task."""
    request = native_request(target, destination=destination, rate=rate)
    counts = broker.attributes(target.dlq.url, [COUNT_ATTRIBUTES[0]])
    depth = counts.get(COUNT_ATTRIBUTES[0], "")
    running: MoveTask | None = None
    unknown: str | None = None
    try:
        running = active_task(list_move_tasks(broker, target))
    except RedriveError as exc:
        # Only informs the dry run; --execute would meet the same error and stop there.
        unknown = str(exc)
    return NativePlan(
        dlq=target.dlq,
        destination=destination,
        sources=tuple(s.name for s in target.sources),
        rate=request.get("MaxNumberOfMessagesPerSecond"),
        approximate_messages=int(depth) if depth.isdigit() else None,
        running=running,
        running_unknown=unknown,
        chosen_rate_ceiling=MAX_NATIVE_RATE,
    )


def start_native_move(
    broker: SqsBroker, target: DlqTarget, *, destination: QueueRef | None, rate: float | None
) -> str:
    """Start SQS's move of every message in the DLQ; returns the task handle.

    ``destination=None`` sends each message back to the queue it was dead-lettered from.
    """
    request = native_request(target, destination=destination, rate=rate)
    try:
        with aws_errors("StartMessageMoveTask", resource=target.dlq.name):
            response = broker.client.start_message_move_task(**request)
    except AwsError as exc:
        raise _explain_start_failure(broker, target, exc) from exc.__cause__
    handle = response.get("TaskHandle")
    if not handle:
        raise AwsError(
            f"StartMessageMoveTask on {target.dlq.name} returned no task handle: check "
            f"`redrive tasks {target.label}` before starting again"
        )
    return str(handle)


def list_move_tasks(
    broker: SqsBroker, target: DlqTarget, max_results: int = MAX_LISTED_TASKS
) -> list[MoveTask]:
    """The DLQ's most recent move tasks, newest first."""
    if not 1 <= max_results <= MAX_LISTED_TASKS:
        raise UsageProblem(
            f"SQS lists 1 to {MAX_LISTED_TASKS} move tasks per queue, not {max_results}"
        )
    with aws_errors("ListMessageMoveTasks", resource=target.dlq.name):
        response = broker.client.list_message_move_tasks(
            SourceArn=target.dlq.ident, MaxResults=max_results
        )
    tasks = [MoveTask.from_response(raw) for raw in response.get("Results", [])]
    return sorted(tasks, key=lambda t: t.started or 0.0, reverse=True)


def active_task(tasks: list[MoveTask]) -> MoveTask | None:
    return next((t for t in tasks if t.status in (RUNNING, CANCELLING)), None)


def follow_native_move(
    broker: SqsBroker,
    target: DlqTarget,
    handle: str,
    *,
    poll_seconds: float = 5.0,
    stop: threading.Event,
    on_progress: Callable[[MoveTask], None],
    appear_within: float = 60.0,
    max_wait: float = 86_400.0,
    clock: Callable[[], float] = time.monotonic,
) -> MoveTask:
    """Poll ListMessageMoveTasks until the task started as ``handle`` ends.

    Returns the task as last seen. It is still RUNNING when ``stop`` was set or ``max_wait``
    seconds passed: following ends there, but the task is NOT cancelled and keeps moving
    messages on the server (cancel it with :func:`cancel_move_task`). A task that does not
    show up in the listing for ``appear_within`` seconds raises :class:`AwsError`.
    """
    began = clock()
    # SQS drops the handle from a task once it leaves RUNNING, so a finished task is
    # recognised by its start time instead.
    earliest = time.time() - CLOCK_SKEW_SECONDS
    seen_started: float | None = None
    last: MoveTask | None = None
    sighted = began
    while True:
        mine = _find_task(list_move_tasks(broker, target), handle, seen_started, earliest)
        if mine is not None and mine.handle == handle:
            seen_started = mine.started
        if mine is not None:
            last, sighted = mine, clock()
            on_progress(mine)
            if mine.terminal:
                return mine
        elif clock() - sighted > appear_within:
            raise AwsError(
                f"move task {handle} of DLQ {target.dlq.name} "
                f"{'no longer appears' if last else 'did not appear'} in ListMessageMoveTasks "
                f"(waited {appear_within:g}s): check `redrive tasks {target.label}`"
            )
        if clock() - began >= max_wait or stop.wait(poll_seconds):
            break
    # Stopped before the first sighting: SQS accepted the task, so it is running or queued.
    return last if last is not None else _not_yet_seen(target, handle)


def _find_task(
    tasks: list[MoveTask], handle: str, seen_started: float | None, earliest: float
) -> MoveTask | None:
    """The task started as ``handle`` among the listed ones."""
    mine = next((t for t in tasks if t.handle == handle), None)
    if mine is not None:
        return mine
    if seen_started is not None:
        return next((t for t in tasks if t.handle is None and t.started == seen_started), None)
    # It ended before the first poll saw it running: the newest handle-less task that
    # started after we asked (only one task per queue can be active at a time).
    return next(
        (t for t in tasks if t.handle is None and t.started is not None and t.started >= earliest),
        None,
    )


def _not_yet_seen(target: DlqTarget, handle: str) -> MoveTask:
    return MoveTask(
        status=RUNNING,
        moved=0,
        to_move=None,
        started=None,
        failure_reason=None,
        handle=handle,
        source_arn=target.dlq.ident,
        destination_arn=None,
        rate=None,
    )


def cancel_move_task(broker: SqsBroker, target: DlqTarget) -> MoveTask | None:
    """Cancel the DLQ's RUNNING move task; messages already moved stay moved.

    Returns the task as CANCELLING (SQS ends it shortly after), or ``None`` when it finished
    by itself before the cancel reached it.
    """
    tasks = list_move_tasks(broker, target)
    running = next((t for t in tasks if t.status == RUNNING and t.handle), None)
    if running is None or running.handle is None:
        latest = (
            f" (the latest, started {_stamp(tasks[0].started)}, is {tasks[0].status})"
            if tasks
            else ""
        )
        raise NoRunningMoveTask(
            f"no move task is running for DLQ {target.dlq.name}{latest}: nothing to cancel"
        )
    try:
        with aws_errors("CancelMessageMoveTask", resource=target.dlq.name):
            response = broker.client.cancel_message_move_task(TaskHandle=running.handle)
    except AwsError:
        # SQS refuses to cancel a task that is no longer RUNNING: a race, not a failure.
        if any(t.handle == running.handle for t in list_move_tasks(broker, target)):
            raise
        return None
    moved = response.get("ApproximateNumberOfMessagesMoved")
    return replace(
        running, status=CANCELLING, moved=int(moved) if moved is not None else running.moved
    )


def _explain_start_failure(
    broker: SqsBroker, target: DlqTarget, exc: AwsError
) -> AwsError | RedriveError:
    cause = exc.__cause__
    if not isinstance(cause, botocore.exceptions.ClientError):
        return exc
    code = error_code(cause)
    message = str(cause.response.get("Error", {}).get("Message", "")).lower()
    if code in ACCESS_CODES:
        return AwsError(
            f"{exc} (a redrive also needs sqs:ReceiveMessage, sqs:DeleteMessage and "
            "sqs:GetQueueAttributes on the DLQ, and sqs:SendMessage on the destination)"
        )
    if code not in _CONFLICT_CODES and "already" not in message:
        return exc
    try:
        running = active_task(list_move_tasks(broker, target))
    except RedriveError:
        running = None
    if running is None and "already" not in message and "active" not in message:
        return exc
    about = (
        f" (started {_stamp(running.started)}, {running.status}, {_progress(running)})"
        if running is not None
        else ""
    )
    return MoveTaskRunning(
        f"a move task is already running for DLQ {target.dlq.name}{about}; SQS allows one "
        f"at a time: watch it with `redrive tasks {target.label}`, stop it with "
        f"`redrive tasks {target.label} --cancel`"
    )


def _progress(task: MoveTask) -> str:
    total = f" of {task.to_move:,}" if task.to_move is not None else ""
    return f"{task.moved:,}{total} moved"


def _epoch_seconds(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    # The API documents epoch milliseconds; take seconds too rather than land in 1970.
    return number / 1000 if number > 1e11 else number


def _stamp(ts: float | None) -> str:
    if ts is None:
        return "at an unknown time"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _one_line(text: Any) -> str | None:
    # A failure reason lands in a table cell and in a one-line error.
    return (" ".join(str(text).split()) or None) if text else None


class SqsMoveTasks:
    """SQS's message move tasks behind :class:`redrive.broker.native.NativeMover`."""

    server = "SQS"
    noun = "move task"

    def __init__(self, broker: SqsBroker) -> None:
        self.broker = broker

    def check(
        self, target: DlqTarget, *, destination: QueueRef | None, rate: float | None
    ) -> int | None:
        request = native_request(target, destination=destination, rate=rate)
        per_second = request.get("MaxNumberOfMessagesPerSecond")
        return int(per_second) if per_second is not None else None

    def plan(
        self, target: DlqTarget, *, destination: QueueRef | None, rate: float | None
    ) -> NativePlan:
        return plan_native_move(self.broker, target, destination=destination, rate=rate)

    def start(self, target: DlqTarget, *, destination: QueueRef | None, rate: float | None) -> str:
        return start_native_move(self.broker, target, destination=destination, rate=rate)

    def follow(
        self,
        target: DlqTarget,
        handle: str,
        *,
        poll_seconds: float,
        stop: threading.Event,
        on_progress: Callable[[native.MoveTask], None],
    ) -> native.MoveTask:
        return follow_native_move(
            self.broker,
            target,
            handle,
            poll_seconds=poll_seconds,
            stop=stop,
            on_progress=on_progress,
        )

    def listed(self, target: DlqTarget) -> list[native.MoveTask]:
        return list(list_move_tasks(self.broker, target))

    def cancel(self, target: DlqTarget) -> native.MoveTask | None:
        return cancel_move_task(self.broker, target)
