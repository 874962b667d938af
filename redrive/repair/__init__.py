"""Repairing a task on its way back: edits of its args, kwargs and times (``--set``,
``--unset``, ``--rename``, ``--clear-expires``, ``--clear-eta``), written back as Celery and
kombu wrote the message (its protocol, serializer, compression and encodings kept).

The pure core of ``move``/``replay`` with edits: :mod:`~redrive.repair.edits` (parsing and
applying), :mod:`~redrive.repair.encode` (a message's layers, opened and written again),
:mod:`~redrive.repair.review` (one message repaired: its diff and digests).
"""

from __future__ import annotations

from redrive.repair.edits import (
    CLEAR_ETA,
    CLEAR_EXPIRES,
    Clear,
    Edit,
    EditOutcome,
    Rename,
    SetValue,
    TaskContent,
    Unset,
    apply_edits,
    edits_from_options,
    parse_edit_words,
)
from redrive.repair.encode import TaskMessage, encode, open_task
from redrive.repair.review import ABSENT, Change, Repair, body_digest, diff_content, repair

__all__ = [
    "ABSENT",
    "CLEAR_ETA",
    "CLEAR_EXPIRES",
    "Change",
    "Clear",
    "Edit",
    "EditOutcome",
    "Rename",
    "Repair",
    "SetValue",
    "TaskContent",
    "TaskMessage",
    "Unset",
    "apply_edits",
    "body_digest",
    "diff_content",
    "edits_from_options",
    "encode",
    "open_task",
    "parse_edit_words",
    "repair",
]
