"""The sandbox's SQS: moto 5.2's, without its depth-proportional costs, plus message move tasks.

moto does work proportional to a queue's depth on every call (bench/README.md has the
profile): each message a receive hands out costs three walks of the whole queue (the
retention check computes every queue attribute), each walk converts two datetimes per
message, and ChangeMessageVisibility and DeleteMessage search every receipt handle of every
message. A scan of 2,000 messages took moto 6 to 11 minutes; 10,000 would take hours.

:func:`extended` replaces those hot paths, in this process, with ones that give the same
answers in (amortised) constant time per message, and keeps everything else moto's own
(request parsing, validation, errors, redrive policies, FIFO, long polling):

- ``Queue.messages`` and the ``ApproximateNumberOf*`` counts read the clock once per call,
  not twice per message (same filters);
- the retention check of each received message reads the queue's retention period instead
  of computing every queue attribute;
- ChangeMessageVisibility and DeleteMessage find a message through an index of the receipt
  handles issued while the extensions are installed (a handle the index does not know, or
  whose message it does not place in that queue, takes moto's own search: its answer, its
  error);
- receipt handles are drawn in one call of moto's random generator (same alphabet, length);
- standard queues skip collecting the FIFO groups of in-flight messages (moto uses them for
  FIFO queues only);
- the server's dispatcher lists moto's service packages once, not on every request (it
  reads moto's directory, about 170 stat calls a request);
- messages are not entered in moto's list of every model instance ever made (only its
  ``/moto-api/data.json`` page reads it): moto deep-copies each message it hands out, so
  that list grew by every message of every scan, about 11 MB a scan of 10,000.

One rule changes, towards SQS: ChangeMessageVisibility's 12-hour ceiling counts from the
message's last receive, as SQS documents it, not from when the message was sent. moto's rule
refuses every visibility change of a message sent more than 12 hours ago, which every seeded
message older than that is (and every message of a sandbox left running overnight).

:mod:`redrive.sandbox.move_tasks` adds StartMessageMoveTask, ListMessageMoveTasks and
CancelMessageMoveTask, which moto 5.2 answers with an HTML 500 page.

The extensions are for moto 5.2 only (pyproject pins ``moto>=5.2,<5.3``): every replaced
method is moto 5.2.5's, read line by line. ``tests/test_sandbox_sqs.py`` runs the same
sequences of calls against stock and extended moto and compares every answer.
"""

from __future__ import annotations

import functools
import string
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import moto
import moto.backends
from moto.core.utils import camelcase_to_underscores, unix_time, unix_time_millis
from moto.moto_api._internal import mock_random
from moto.sqs import models
from moto.sqs.constants import MAXIMUM_VISIBILITY_TIMEOUT
from moto.sqs.exceptions import InvalidParameterValue
from moto.sqs.models import Message, Queue, SQSBackend

import redrive.sandbox.message_index as message_index
import redrive.sandbox.move_tasks as move_tasks

__all__ = ["MOTO_SERIES", "extended", "installed"]

#: The moto release series these replacements were written against.
MOTO_SERIES: Final = "5.2."

_RECEIPT_HANDLE_LENGTH: Final = 185  # moto.sqs.utils.generate_receipt_handle's

_install_lock = threading.Lock()
_users = 0
_originals: list[tuple[Any, str, Any]] = []


def installed() -> bool:
    """Whether the extensions are in force in this process."""
    return _users > 0


@contextmanager
def extended() -> Iterator[None]:
    """Install the extensions for the duration of the block (nested uses share them).

    Leaving the last block restores moto's own methods and forgets the indexes, so moto
    in this process is exactly stock moto again (messages keep their state). Raises
    RuntimeError for a moto other than 5.2.
    """
    global _users
    with _install_lock:
        if _users == 0:
            _install()
        _users += 1
    try:
        yield
    finally:
        with _install_lock:
            _users -= 1
            if _users == 0:
                _uninstall()


def _install() -> None:
    if not moto.__version__.startswith(MOTO_SERIES):
        raise RuntimeError(
            f"the sandbox's SQS extensions are written for moto {MOTO_SERIES}x, "
            f"not {moto.__version__}: install 'moto>=5.2,<5.3'"
        )
    message_index.forget_everything()
    replacements: list[tuple[Any, str, Any]] = [
        (Queue, "messages", property(_visible_messages)),
        (Queue, "approximate_number_of_messages_delayed", property(_count_delayed)),
        (Queue, "approximate_number_of_messages_not_visible", property(_count_not_visible)),
        (
            Queue,
            "pending_message_groups",
            property(_pending_groups(Queue.__dict__["pending_message_groups"])),
        ),
        (Queue, "add_message", _add_message(Queue.add_message)),
        (Queue, "delete_message", _delete_message(Queue.delete_message)),
        (Message, "mark_received", _mark_received(Message.mark_received)),
        (Message, "__new__", _untracked_new),
        (SQSBackend, "is_message_valid_based_on_retention_period", _within_retention),
        (
            SQSBackend,
            "change_message_visibility",
            _change_visibility(SQSBackend.change_message_visibility),
        ),
        (SQSBackend, "purge_queue", _forgetting_queue(SQSBackend.purge_queue)),
        (SQSBackend, "delete_queue", _forgetting_queue(SQSBackend.delete_queue)),
        (SQSBackend, "reset", _forgetting_backend(SQSBackend.reset)),
        (models, "generate_receipt_handle", _receipt_handle),
        (
            models,
            "camelcase_to_underscores",
            functools.lru_cache(maxsize=256)(camelcase_to_underscores),
        ),
    ]
    replacements.append(
        (moto.backends, "list_of_moto_modules", _listed_once(moto.backends.list_of_moto_modules))
    )
    replacements.extend(move_tasks.replacements())
    for owner, name, replacement in replacements:
        _originals.append((owner, name, owner.__dict__.get(name, _ABSENT)))
        setattr(owner, name, replacement)


def _uninstall() -> None:
    move_tasks.stop_all()
    while _originals:
        owner, name, original = _originals.pop()
        if original is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    message_index.forget_everything()


_ABSENT: Final = object()


# -- Queue --------------------------------------------------------------------------------


def _visible_messages(self: Queue) -> list[Message]:
    # moto: [m for m in self._messages if m.visible and not m.delayed], where visible is
    # now > visible_at and delayed is now < delayed_until, each reading the clock.
    now = unix_time_millis()
    return [m for m in self._messages if now > m.visible_at and not now < m.delayed_until]


def _count_delayed(self: Queue) -> int:
    now = unix_time_millis()
    return len([m for m in self._messages if now < m.delayed_until])


def _count_not_visible(self: Queue) -> int:
    now = unix_time_millis()
    return len([m for m in self._messages if not now > m.visible_at])


def _pending_groups(original: Any) -> Callable[[Queue], set[str]]:
    def pending_message_groups(self: Queue) -> set[str]:
        # moto's receive_message consults the groups only when queue.fifo_queue.
        if not self.fifo_queue:
            return set()
        groups: set[str] = original.fget(self)
        return groups

    return pending_message_groups


def _add_message(original: Callable[[Queue, Message], None]) -> Callable[[Queue, Message], None]:
    def add_message(self: Queue, message: Message) -> None:
        # moto dead-letters a message by removing it from its queue and adding the same
        # object to the DLQ: the queue it was in is where it came from.
        source = message_index.homes.get(message)
        # Before moto appends it: a reader must never find the message without its home.
        message_index.homes[message] = self
        original(self, message)
        if self.fifo_queue and not any(m is message for m in self._messages):
            # Dropped as a duplicate within FIFO's deduplication window.
            if message_index.homes.get(message) is self:
                del message_index.homes[message]
            return
        if source is not None and source is not self and source.dead_letter_queue is self:
            message_index.origins[message] = source.queue_arn

    return add_message


def _delete_message(original: Callable[[Queue, str], None]) -> Callable[[Queue, str], None]:
    def delete_message(self: Queue, receipt_handle: str) -> None:
        message = None
        if receipt_handle not in self.deleted_messages:
            message = message_index.indexed_in(self, receipt_handle)
        if message is None:
            original(self, receipt_handle)
            return
        # moto 5.2.5's, for the one message that had this handle.
        self.pending_messages.discard(message)
        self.deleted_messages.update(message.all_receipt_handles)  # type: ignore[arg-type]
        # A new list, as moto builds one: a reader iterating the old one is undisturbed.
        remaining = list(self._messages)
        remaining.remove(message)
        self._messages = remaining
        message_index.forget(message)

    return delete_message


# -- Message ------------------------------------------------------------------------------


def _mark_received(
    original: Callable[[Message, int | None], None],
) -> Callable[[Message, int | None], None]:
    def mark_received(self: Message, visibility_timeout: int | None = None) -> None:
        original(self, visibility_timeout)
        message_index.received_at[self] = unix_time_millis()
        if self.receipt_handle is not None:
            message_index.handles[self.receipt_handle] = self

    return mark_received


def _untracked_new(cls: type[Message], *args: Any, **kwargs: Any) -> Message:
    # moto.core.common_models.BaseModel.__new__, without instances_tracked.append.
    return object.__new__(cls)


def _receipt_handle() -> str:
    return "".join(mock_random.choices(string.ascii_lowercase, k=_RECEIPT_HANDLE_LENGTH))


def _listed_once(original: Callable[[], Any]) -> Callable[[], tuple[str, ...]]:
    listed: list[tuple[str, ...]] = []

    def list_of_moto_modules() -> tuple[str, ...]:
        # moto's package directory does not change while it runs.
        if not listed:
            listed.append(tuple(original()))
        return listed[0]

    return list_of_moto_modules


# -- SQSBackend ---------------------------------------------------------------------------


def _within_retention(self: SQSBackend, queue_name: str, message: Message) -> bool:
    # moto computes every attribute of the queue (three walks of it) to read this one.
    retention_period = int(self.get_queue(queue_name).message_retention_period)  # type: ignore[attr-defined]
    retain_until = retention_period + message.sent_timestamp / 1000  # type: ignore[operator]
    return bool(retain_until > unix_time())


def _change_visibility(
    original: Callable[[SQSBackend, str, str, int], None],
) -> Callable[[SQSBackend, str, str, int], None]:
    def change_message_visibility(
        self: SQSBackend, queue_name: str, receipt_handle: str, visibility_timeout: int
    ) -> None:
        queue = self.get_queue(queue_name)
        message = message_index.indexed_in(queue, receipt_handle)
        if message is None:
            original(self, queue_name, receipt_handle, visibility_timeout)
            return
        visibility_timeout_msec = int(visibility_timeout) * 1000
        given_visibility_timeout = unix_time_millis() + visibility_timeout_msec
        # SQS: at most 12 hours from the receive (moto: from the send).
        received = message_index.received_at.get(message, message.sent_timestamp)
        if given_visibility_timeout - received > MAXIMUM_VISIBILITY_TIMEOUT * 1000:  # type: ignore[operator]
            raise InvalidParameterValue(
                f"Value {visibility_timeout} for parameter VisibilityTimeout is invalid. "
                "Reason: Total VisibilityTimeout for the message is beyond the limit "
                "[43200 seconds]"
            )
        message.change_visibility(visibility_timeout)
        if message.visible and message in queue.pending_messages:
            queue.pending_messages.remove(message)

    return change_message_visibility


def _forgetting_queue(original: Callable[..., None]) -> Callable[..., None]:
    def forgetting(self: SQSBackend, queue_name: str, *args: Any, **kwargs: Any) -> None:
        queue = self.queues.get(queue_name)
        if queue is not None:
            for message in list(queue._messages):
                message_index.forget(message)
        original(self, queue_name, *args, **kwargs)

    return forgetting


def _forgetting_backend(original: Callable[[SQSBackend], None]) -> Callable[[SQSBackend], None]:
    def reset(self: SQSBackend) -> None:
        move_tasks.stop_backend(self)
        for queue in list(getattr(self, "queues", {}).values()):
            for message in list(queue._messages):
                message_index.forget(message)
        original(self)

    return reset
