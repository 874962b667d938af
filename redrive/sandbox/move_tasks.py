"""Message move tasks for the sandbox's moto: SQS's own DLQ redrive, which moto 5.2 lacks.

StartMessageMoveTask, ListMessageMoveTasks and CancelMessageMoveTask as the SQS API
reference describes them: the source must be a standard queue that some queue's
RedrivePolicy names as its DLQ; without DestinationArn each message goes back to the queue
it was dead-lettered from; one active task per source queue; up to
MaxNumberOfMessagesPerSecond messages a second (1 to 500; 500 when not given); the listing
gives the most recent tasks first (MaxResults 1 to 10, default 1), with the TaskHandle only
while a task is RUNNING; a cancelled task stops moving within a tick (CANCELLING, then
CANCELLED), and what it moved stays moved.

A task is a thread that moves messages the way SQS's redrive does: it receives visible
messages from the DLQ (so no one else can receive them meanwhile), sends each body with its
message attributes to the destination, then deletes it from the DLQ; all through moto's own
backend calls. ApproximateNumberOfMessagesToMove is the DLQ's visible count at the start;
the task completes when it has moved that many or the DLQ has no visible message left.
Installed by :func:`redrive.sandbox.moto_sqs.extended`.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any, Final

from moto.core.responses import ActionResult
from moto.core.utils import unix_time_millis
from moto.sqs.exceptions import InvalidParameterValue, SQSException
from moto.sqs.models import Message, Queue, SQSBackend, sqs_backends
from moto.sqs.responses import SQSResponse

import redrive.sandbox.message_index as message_index

__all__ = ["DEFAULT_RATE", "MAX_RATE", "replacements", "stop_all", "stop_backend"]

MAX_RATE: Final = 500
#: What a task moves per second when the request names no rate (SQS: "system optimized").
DEFAULT_RATE: Final = MAX_RATE
MAX_LISTED: Final = 10
_TICK_SECONDS: Final = 0.05
# A task's own hold on what it received, while it sends and deletes.
_TASK_VISIBILITY_SECONDS: Final = 30

RUNNING, COMPLETED, CANCELLING, CANCELLED, FAILED = (
    "RUNNING",
    "COMPLETED",
    "CANCELLING",
    "CANCELLED",
    "FAILED",
)


class ResourceNotFound(SQSException):
    def __init__(self, message: str) -> None:
        super().__init__("ResourceNotFoundException", message)


class UnsupportedOperation(SQSException):
    def __init__(self, message: str) -> None:
        super().__init__("AWS.SimpleQueueService.UnsupportedOperation", message)


@dataclass
class _Task:
    handle: str
    backend: SQSBackend
    source: Queue
    destination_arn: str | None
    rate: int | None
    started_ms: int
    to_move: int
    status: str = RUNNING
    moved: int = 0
    failure_reason: str | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "Status": self.status,
            "SourceArn": self.source.queue_arn,
            "ApproximateNumberOfMessagesMoved": self.moved,
            "ApproximateNumberOfMessagesToMove": self.to_move,
            "StartedTimestamp": self.started_ms,
        }
        if self.status == RUNNING:
            entry["TaskHandle"] = self.handle
        if self.destination_arn is not None:
            entry["DestinationArn"] = self.destination_arn
        if self.rate is not None:
            entry["MaxNumberOfMessagesPerSecond"] = self.rate
        if self.status == FAILED and self.failure_reason:
            entry["FailureReason"] = self.failure_reason
        return entry


_lock = threading.Lock()
_tasks: dict[str, list[_Task]] = {}
"""Source queue ARN -> its tasks, oldest first (at most MAX_LISTED)."""


def replacements() -> list[tuple[Any, str, Any]]:
    """``(owner, name, value)`` to set while the sandbox's extensions are installed."""
    return [
        (SQSResponse, "start_message_move_task", _start_response),
        (SQSResponse, "list_message_move_tasks", _list_response),
        (SQSResponse, "cancel_message_move_task", _cancel_response),
    ]


def stop_all() -> None:
    """End every task's thread (a task still running is left as it is, not CANCELLED)."""
    with _lock:
        tasks = [task for listed in _tasks.values() for task in listed]
        _tasks.clear()
    _join(tasks)


def stop_backend(backend: SQSBackend) -> None:
    """End and forget the tasks of one backend (moto is resetting it)."""
    with _lock:
        mine = [t for listed in _tasks.values() for t in listed if t.backend is backend]
        for arn in [
            arn for arn, listed in _tasks.items() if listed and listed[0].backend is backend
        ]:
            del _tasks[arn]
    _join(mine)


def _join(tasks: list[_Task]) -> None:
    for task in tasks:
        task.stop.set()
    for task in tasks:
        if task.thread is not None and task.thread is not threading.current_thread():
            task.thread.join(5)


# -- the API --------------------------------------------------------------------------------


def _start_response(self: SQSResponse) -> ActionResult:
    handle = start_task(
        self._get_param("SourceArn"),
        self._get_param("DestinationArn"),
        self._get_param("MaxNumberOfMessagesPerSecond"),
    )
    return ActionResult({"TaskHandle": handle})


def _list_response(self: SQSResponse) -> ActionResult:
    max_results = self._get_param("MaxResults")
    return ActionResult({"Results": list_tasks(self._get_param("SourceArn"), max_results)})


def _cancel_response(self: SQSResponse) -> ActionResult:
    moved = cancel_task(self._get_param("TaskHandle"))
    return ActionResult({"ApproximateNumberOfMessagesMoved": moved})


def start_task(source_arn: Any, destination_arn: Any, rate: Any) -> str:
    backend, source = _queue_of(source_arn, "SourceArn")
    if not any(q.dead_letter_queue is source for q in backend.queues.values()):
        raise InvalidParameterValue("Source queue must be configured as a Dead Letter Queue.")
    if source.fifo_queue:
        raise UnsupportedOperation("Message move tasks support standard queues only.")
    if destination_arn is not None:
        _, destination = _queue_of(destination_arn, "DestinationArn")
        if destination is source:
            raise InvalidParameterValue("The destination queue cannot be the source queue.")
    if rate is not None and (not isinstance(rate, int) or not 1 <= rate <= MAX_RATE):
        raise InvalidParameterValue(
            f"Value {rate} for parameter MaxNumberOfMessagesPerSecond is invalid. "
            f"Reason: must be between 1 and {MAX_RATE}."
        )
    with _lock:
        listed = _tasks.setdefault(source.queue_arn, [])
        if any(t.status in (RUNNING, CANCELLING) for t in listed):
            raise UnsupportedOperation(
                "There is already a task running. Only one active task is allowed for a "
                "source queue arn at a given time."
            )
        task_id = str(uuid.uuid4())
        handle = base64.b64encode(
            json.dumps({"taskId": task_id, "sourceArn": source.queue_arn}).encode()
        ).decode()
        task = _Task(
            handle=handle,
            backend=backend,
            source=source,
            destination_arn=destination_arn,
            rate=rate,
            started_ms=int(unix_time_millis()),
            to_move=source.approximate_number_of_messages,
        )
        listed.append(task)
        del listed[:-MAX_LISTED]
        task.thread = threading.Thread(
            target=_run, args=(task,), name=f"move-task-{task_id[:8]}", daemon=True
        )
        task.thread.start()
    return handle


def list_tasks(source_arn: Any, max_results: Any) -> list[dict[str, Any]]:
    _, source = _queue_of(source_arn, "SourceArn")
    if max_results is None:
        max_results = 1
    if not isinstance(max_results, int) or not 1 <= max_results <= MAX_LISTED:
        raise InvalidParameterValue(
            f"Value {max_results} for parameter MaxResults is invalid. "
            f"Reason: must be between 1 and {MAX_LISTED}."
        )
    with _lock:
        listed = list(_tasks.get(source.queue_arn, []))
    return [task.entry() for task in reversed(listed)][:max_results]


def cancel_task(handle: Any) -> int:
    with _lock:
        task = next((t for listed in _tasks.values() for t in listed if t.handle == handle), None)
        if task is None:
            raise ResourceNotFound(f"The task handle {handle} does not exist.")
        if task.status != RUNNING:
            raise InvalidParameterValue(
                f"Only a RUNNING task can be cancelled; this one is {task.status}."
            )
        task.status = CANCELLING
        return task.moved


def _queue_of(arn: Any, parameter: str) -> tuple[SQSBackend, Queue]:
    parts = str(arn or "").split(":")
    if len(parts) != 6 or parts[0] != "arn" or not parts[1] or parts[2] != "sqs":
        raise ResourceNotFound(
            f"The resource that you specified for the {parameter} parameter doesn't exist."
        )
    _, _, _, region, account, name = parts
    backend: SQSBackend = sqs_backends[account][region]
    queue = backend.queues.get(name)
    if queue is None or queue.queue_arn != arn:
        raise ResourceNotFound(
            f"The resource that you specified for the {parameter} parameter doesn't exist."
        )
    return backend, queue


# -- moving -----------------------------------------------------------------------------------


def _run(task: _Task) -> None:
    per_second = task.rate or DEFAULT_RATE
    began = time.monotonic()
    try:
        while not task.stop.wait(_TICK_SECONDS):
            with _lock:
                if task.status == CANCELLING:
                    task.status = CANCELLED
                    return
            allowed = min(
                task.to_move - task.moved,
                int(per_second * (time.monotonic() - began)) + 1 - task.moved,
            )
            if task.moved >= task.to_move:
                _finish(task, COMPLETED)
                return
            if allowed <= 0:
                continue
            if _move_some(task, allowed) == 0:
                # Nothing visible left to move (what is in flight is someone else's).
                _finish(task, COMPLETED)
                return
    except SQSException as exc:
        _finish(task, FAILED, f"{exc.code}: {exc.message}")
    except Exception as exc:  # a thread's failure must end as a FAILED task, not a traceback
        _finish(task, FAILED, f"{type(exc).__name__}: {exc}")


def _finish(task: _Task, status: str, reason: str | None = None) -> None:
    with _lock:
        if task.status in (RUNNING, CANCELLING):
            task.status = CANCELLED if task.status == CANCELLING else status
            task.failure_reason = reason


def _move_some(task: _Task, allowed: int) -> int:
    moved = 0
    while moved < allowed and not task.stop.is_set():
        received = task.backend.receive_message(
            task.source.name, min(10, allowed - moved), 0, _TASK_VISIBILITY_SECONDS, ["All"]
        )
        if not received:
            break
        for copy in received:
            _send_back(task, copy)
            task.backend.delete_message(task.source.name, copy.receipt_handle)  # type: ignore[arg-type]
            with _lock:
                task.moved += 1
            moved += 1
    return moved


def _send_back(task: _Task, copy: Message) -> None:
    arn = task.destination_arn or _origin(task, copy)
    backend, destination = _queue_of(arn, "DestinationArn")
    backend.send_message(
        destination.name,
        copy.body,
        message_attributes=deepcopy(copy.message_attributes),
        group_id=copy.group_id,
        deduplication_id=copy.deduplication_id,
    )


def _origin(task: _Task, copy: Message) -> str:
    arn = message_index.origin_arn(copy.receipt_handle or "")
    if arn is not None:
        return arn
    # A message sent to the DLQ directly has no origin; a DLQ with one source queue names it.
    sources = [q for q in task.backend.queues.values() if q.dead_letter_queue is task.source]
    if len(sources) == 1:
        return sources[0].queue_arn
    raise InvalidParameterValue(
        f"message {copy.id} was not dead-lettered from a queue and {task.source.name} is the "
        f"DLQ of {len(sources)} queues: name a DestinationArn"
    )
