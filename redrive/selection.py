"""Which messages an operation acts on: task patterns, age, message ids and a count limit."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from redrive.messages import TaskInfo

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """Seconds in ``90m``, ``6h``, ``3d``, ``2w`` or a bare number of seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 15m, 6h, 3d)")
    number, unit = match.groups()
    return float(number) * _UNIT_SECONDS[(unit or "s").lower()]


def iso_utc(ts: float | None) -> str | None:
    """``2026-11-30T12:00:00Z``: how every timestamp appears in JSON output."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def format_duration(seconds: float) -> str:
    """A short, human reading of a duration: ``45s``, ``12m``, ``5h 3m``, ``2d 4h``."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        hours, rest = divmod(seconds, 3600)
        return f"{hours}h {rest // 60}m" if rest >= 60 else f"{hours}h"
    days, rest = divmod(seconds, 86400)
    return f"{days}d {rest // 3600}h" if rest >= 3600 else f"{days}d"


@dataclass(frozen=True, slots=True)
class Selection:
    """Filters shared by move, purge, archive and replay. Empty means: everything."""

    tasks: tuple[str, ...] = ()
    exclude_tasks: tuple[str, ...] = ()
    older_than: float | None = None
    """Seconds: only messages enqueued at least this long ago."""
    newer_than: float | None = None
    message_ids: frozenset[str] = field(default_factory=frozenset)
    limit: int | None = None

    @property
    def is_filtered(self) -> bool:
        return bool(
            self.tasks
            or self.exclude_tasks
            or self.older_than is not None
            or self.newer_than is not None
            or self.message_ids
            or self.limit is not None
        )

    def matches(
        self, info: TaskInfo, *, message_id: str, sent_at: float | None, now: float
    ) -> bool:
        """Whether one message passes every filter except ``limit`` (the caller counts)."""
        if self.message_ids and message_id not in self.message_ids:
            return False
        if self.tasks and not _any_match(info.task, self.tasks):
            return False
        if self.exclude_tasks and _any_match(info.task, self.exclude_tasks):
            return False
        if self.older_than is not None or self.newer_than is not None:
            if sent_at is None:
                return False
            age = now - sent_at
            if self.older_than is not None and age < self.older_than:
                return False
            if self.newer_than is not None and age > self.newer_than:
                return False
        return True

    def describe(self) -> dict[str, Any]:
        """The filters as plain data, for JSON output, plans and the audit trail."""
        return {
            "tasks": list(self.tasks),
            "exclude_tasks": list(self.exclude_tasks),
            "older_than_seconds": self.older_than,
            "newer_than_seconds": self.newer_than,
            "message_ids": sorted(self.message_ids),
            "limit": self.limit,
        }


def _any_match(task: str, patterns: Sequence[str]) -> bool:
    # fnmatchcase: task names are case-sensitive Python paths; "*" must not match case-blind.
    return any(task == p or fnmatch.fnmatchcase(task, p) for p in patterns)
