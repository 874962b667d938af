"""What the sandbox's extensions of moto know of the messages handled while they are
installed: the receipt handles issued, the queue holding each message, when it was last
received and which queue moto dead-lettered it from.

A module of its own, not globals of :mod:`redrive.sandbox.moto_sqs` (which fills it, and whose
replacements of moto's hot paths look messages up in it): :mod:`redrive.sandbox.move_tasks`,
which moto_sqs installs, asks it where a message came from without importing moto_sqs back.
"""

from __future__ import annotations

from moto.sqs.models import Message, Queue

# Keyed by message object (moto's Message has no __eq__/__hash__ of its own: identity), held
# outside the messages so that the deepcopy moto makes of every message it hands out copies
# none of it.
handles: dict[str, Message] = {}
"""Receipt handle -> the message it was issued for."""
homes: dict[Message, Queue] = {}
"""Message -> the queue whose ``_messages`` holds it."""
received_at: dict[Message, float] = {}
"""Message -> when it was last received (epoch milliseconds)."""
origins: dict[Message, str] = {}
"""Message -> ARN of the queue moto dead-lettered it from."""


def origin_arn(receipt_handle: str) -> str | None:
    """ARN of the queue moto dead-lettered the message of ``receipt_handle`` from, if it did so
    while the extensions were installed."""
    message = handles.get(receipt_handle)
    return origins.get(message) if message is not None else None


def forget_everything() -> None:
    handles.clear()
    homes.clear()
    received_at.clear()
    origins.clear()


def forget(message: Message) -> None:
    if homes.get(message) is not None:
        del homes[message]
    received_at.pop(message, None)
    origins.pop(message, None)
    for handle in message.all_receipt_handles:
        if handle is not None and handles.get(handle) is message:
            del handles[handle]


def indexed_in(queue: Queue, receipt_handle: str) -> Message | None:
    """The message ``receipt_handle`` was issued for, if the index places it in ``queue``."""
    message = handles.get(receipt_handle)
    if message is None or homes.get(message) is not queue:
        return None
    return message
