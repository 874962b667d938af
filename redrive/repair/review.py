"""One message repaired, as the dry run shows it and a plan records it: the task before and
after (a diff of its args, kwargs and times), what each edit did, and the digests of the
body before and after (``apply`` sends exactly the reviewed body, and refuses a message
whose body is no longer the one reviewed)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from redrive.errors import NotRepairable
from redrive.repair.edits import Edit, EditOutcome, TaskContent, apply_edits
from redrive.repair.encode import TaskMessage, encode, open_task
from redrive.repair.paths import path_text

__all__ = ["ABSENT", "Change", "Repair", "body_digest", "diff_content", "repair"]


class _Absent:
    """A place a task does not have (before a ``--set --create``, after an ``--unset``)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Final = _Absent()


def body_digest(body: str | bytes) -> str:
    """``sha256:<hex>`` of a body's bytes (text as UTF-8)."""
    data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class Change:
    """One place the edits changed: its path, and its JSON value before and after
    (:data:`ABSENT` where the place did not, or no longer does, exist)."""

    path: str
    before: Any
    after: Any

    @property
    def text(self) -> str:
        """``kwargs.currency: "USD" → "EUR"``."""
        return f"{self.path}: {_shown(self.before)} → {_shown(self.after)}"


def _shown(value: Any) -> str:
    if value is ABSENT:
        return "(absent)"
    return json.dumps(value, ensure_ascii=False)


def _same(a: Any, b: Any) -> bool:
    return a is b or (
        a is not ABSENT
        and b is not ABSENT
        and json.dumps(a, ensure_ascii=False) == json.dumps(b, ensure_ascii=False)
    )


def _diff(root: str, steps: tuple[str | int, ...], before: Any, after: Any) -> Iterator[Change]:
    if _same(before, after):
        return
    if isinstance(before, dict) and isinstance(after, dict):
        for key in [*before, *(key for key in after if key not in before)]:
            yield from _diff(root, (*steps, key), before.get(key, ABSENT), after.get(key, ABSENT))
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for index, (old, new) in enumerate(zip(before, after, strict=True)):
            yield from _diff(root, (*steps, index), old, new)
    else:
        yield Change(path_text(root, steps), before, after)


def diff_content(before: TaskContent, after: TaskContent) -> tuple[Change, ...]:
    """Each place that differs, in the task's own order: args, kwargs, eta, expires. A list
    whose length changed is shown whole (its elements moved)."""
    return (
        *_diff("args", (), before.args, after.args),
        *_diff("kwargs", (), before.kwargs, after.kwargs),
        *_diff("eta", (), before.eta, after.eta),
        *_diff("expires", (), before.expires, after.expires),
    )


@dataclass(frozen=True, slots=True)
class Repair:
    """One message with the edits applied."""

    message: TaskMessage
    after: TaskContent
    outcomes: tuple[EditOutcome, ...]
    body: str
    """The body to send: the original itself when no edit changed anything."""

    @property
    def before(self) -> TaskContent:
        return self.message.content

    @property
    def changed(self) -> bool:
        return any(outcome.changed for outcome in self.outcomes)

    @property
    def digest_before(self) -> str:
        return body_digest(self.message.body)

    @property
    def digest_after(self) -> str:
        return body_digest(self.body)

    def diff(self) -> tuple[Change, ...]:
        return diff_content(self.before, self.after)


def repair(body: str | bytes, edits: Sequence[Edit]) -> Repair:
    """``body`` with ``edits`` applied and written back as Celery would;
    :class:`redrive.errors.NotRepairable` for a message that cannot be edited (not a
    Celery task, or not JSON)."""
    try:
        message = open_task(body)
        after, outcomes = apply_edits(message.content, edits)
        changed = any(outcome.changed for outcome in outcomes)
        return Repair(message, after, outcomes, encode(message, after) if changed else message.body)
    except RecursionError:
        # Copying and writing JSON recurse: one absurdly nested task must not stop a run.
        raise NotRepairable("the task's arguments are nested too deeply to edit") from None
