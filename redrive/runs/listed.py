"""The messages a result names (in doubt, failed, ambiguous): at most :data:`MAX_LISTED` of
each, however many there were, in one process's result as in the children's joined."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

MAX_LISTED = 100


@dataclass(frozen=True, slots=True)
class Listed:
    """One message named in the result (in doubt, or failed)."""

    task: str
    task_id: str | None
    message_id: str
    key: str
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "task_id": self.task_id,
            "message_id": self.message_id,
            "key": self.key,
            "detail": self.detail,
        }


def listed_json(name: str, count: int, listing: Sequence[object]) -> dict[str, Any]:
    """How much of a capped list (at most :data:`MAX_LISTED`) the JSON holds: ``NAME_listed``
    (its length) and ``NAME_truncated`` (whether ``count``, NAME's total, is more)."""
    return {f"{name}_listed": len(listing), f"{name}_truncated": count > len(listing)}


def joined(lists: Sequence[list[T]], cap: int = MAX_LISTED) -> list[T]:
    """The lists one after another, the first ``cap`` items (as one scan keeps them)."""
    out: list[T] = []
    for listing in lists:
        out.extend(listing[: cap - len(out)])
    return out
