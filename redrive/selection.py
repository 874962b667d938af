"""Which messages an operation acts on: task patterns, age, message ids, ``--where``
expressions over each message's record, and a count limit."""

from __future__ import annotations

import difflib
import fnmatch
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redrive.messages import TaskInfo

if TYPE_CHECKING:
    from redrive.broker.base import Delivery
    from redrive.where import Where


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
    where: Where | None = None
    """``--where`` expressions (redrive.where), compiled once: every one must hold."""

    @property
    def is_filtered(self) -> bool:
        return bool(
            self.tasks
            or self.exclude_tasks
            or self.older_than is not None
            or self.newer_than is not None
            or self.message_ids
            or self.limit is not None
            or self.where is not None
        )

    def reads(self, field: str) -> bool:
        """Whether a ``--where`` expression reads this field of the record."""
        return self.where is not None and field in self.where.fields

    def matches(
        self,
        info: TaskInfo,
        *,
        message_id: str,
        sent_at: float | None,
        now: float,
        message: Delivery | None = None,
        sources: Sequence[str] = (),
    ) -> bool:
        """Whether one message passes every filter except ``limit`` (the caller counts).

        ``message`` (and the DLQ's source queue names, for the record's ``queue``) is what
        a ``--where`` reads; the cheap filters run first, so it reads only what they let
        through. Without ``message`` a ``--where`` matches nothing."""
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
        if self.where is not None:
            return message is not None and self.where.matches(
                info, message, now=now, sources=sources
            )
        return True

    def describe(self) -> dict[str, Any]:
        """The filters as plain data, for JSON output, plans and the audit trail
        (``where``, the expressions' text, only when there are some)."""
        described: dict[str, Any] = {
            "tasks": list(self.tasks),
            "exclude_tasks": list(self.exclude_tasks),
            "older_than_seconds": self.older_than,
            "newer_than_seconds": self.newer_than,
            "message_ids": sorted(self.message_ids),
            "limit": self.limit,
        }
        if self.where is not None:
            described["where"] = list(self.where.texts)
        return described


def _any_match(task: str, patterns: Sequence[str]) -> bool:
    # fnmatchcase: task names are case-sensitive Python paths; "*" must not match case-blind.
    return any(task == p or fnmatch.fnmatchcase(task, p) for p in patterns)


# Distinct task names a scan counts for the hints of a filter that matched nothing: a DLQ of
# a million messages has a few dozen task names, but a producer's junk could have one each.
MAX_SEEN_TASKS = 1_000
SHOWN_TASKS = 20
NEAR_MATCHES = 5
SHOWN_IDS = 20


@dataclass(frozen=True, slots=True)
class PatternMiss:
    """A --task pattern that matched no scanned message, and what it nearly matched."""

    pattern: str
    near: tuple[str, ...]
    suggestion: str | None
    """A pattern that matches the near matches (e.g. ``*.send_email``), when there is one."""

    def to_json(self) -> dict[str, Any]:
        return {"pattern": self.pattern, "near": list(self.near), "suggestion": self.suggestion}


@dataclass(frozen=True, slots=True)
class FilterMisses:
    """Filters that matched nothing in a scan, and what the scan saw instead."""

    patterns: tuple[PatternMiss, ...]
    tasks_seen: tuple[tuple[str, int], ...]
    """The most common task names scanned, with their counts (at most SHOWN_TASKS)."""
    distinct_tasks: int
    """How many task names the scan saw (at least; it counts MAX_SEEN_TASKS at most)."""
    ids_not_seen: tuple[str, ...]
    """--message-id values no scanned message had (at most SHOWN_IDS of them)."""
    ids_not_seen_count: int
    ids_given: int
    ids_missing: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    """Every --message-id value no scanned message had (bounded by the ids given): what a
    plan's apply reports as gone."""

    def to_json(self) -> dict[str, Any]:
        return {
            "tasks": [p.to_json() for p in self.patterns],
            "tasks_seen": dict(self.tasks_seen),
            # As every capped list in the JSON says how much of it is there.
            "tasks_seen_listed": len(self.tasks_seen),
            "tasks_seen_truncated": self.distinct_tasks > len(self.tasks_seen),
            "distinct_tasks": self.distinct_tasks,
            "message_ids_not_seen": list(self.ids_not_seen),
            "message_ids_not_seen_count": self.ids_not_seen_count,
            "message_ids_not_seen_listed": len(self.ids_not_seen),
            "message_ids_not_seen_truncated": self.ids_not_seen_count > len(self.ids_not_seen),
            "message_ids_given": self.ids_given,
        }


@dataclass(slots=True)
class Sightings:
    """What a scan saw, counted for a --task or --message-id filter that may match nothing:
    task names (at most MAX_SEEN_TASKS distinct ones) and which given message ids appeared.
    Memory stays bounded by the cap and by the ids given."""

    selection: Selection
    tasks: Counter[str] = field(default_factory=Counter)
    # Messages whose names went uncounted (past the cap), per --task pattern they match.
    uncounted_hits: Counter[str] = field(default_factory=Counter)
    uncounted: int = 0
    ids_seen: set[str] = field(default_factory=set)

    def add(self, task: str, message_id: str) -> None:
        if task in self.tasks or len(self.tasks) < MAX_SEEN_TASKS:
            self.tasks[task] += 1
        else:
            self.uncounted += 1
            for pattern in self.selection.tasks:
                if _any_match(task, (pattern,)):
                    self.uncounted_hits[pattern] += 1
        if message_id in self.selection.message_ids:
            self.ids_seen.add(message_id)

    def misses(self) -> FilterMisses | None:
        """The filters that matched no scanned message; None when each matched one."""
        names = list(self.tasks)
        patterns = tuple(
            PatternMiss(p, *near_matches(p, names))
            for p in self.selection.tasks
            if not self.uncounted_hits[p] and not any(_any_match(n, (p,)) for n in names)
        )
        not_seen = sorted(self.selection.message_ids - self.ids_seen)
        if not patterns and not not_seen:
            return None
        return FilterMisses(
            patterns=patterns,
            tasks_seen=tuple(
                sorted(self.tasks.items(), key=lambda kv: (-kv[1], kv[0]))[:SHOWN_TASKS]
            ),
            distinct_tasks=len(self.tasks) + (1 if self.uncounted else 0),
            ids_not_seen=tuple(not_seen[:SHOWN_IDS]),
            ids_not_seen_count=len(not_seen),
            ids_given=len(self.selection.message_ids),
            ids_missing=frozenset(not_seen),
        )


def near_matches(pattern: str, names: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
    """Task names a --task pattern nearly matches, best first, and a pattern that would
    match them: the last part of a dotted name (``send_email`` for
    ``apps.notifications.tasks.send_email``: ``*.send_email``), the same name in another
    case, a part of a name (``*email*``), then names that are spelled alike."""
    bare = pattern.strip("*")
    suffix = [n for n in names if _any_match(n, (f"*.{pattern}",))]
    if suffix:
        return _first(suffix), f"*.{pattern}"
    folded = [n for n in names if fnmatch.fnmatch(n.lower(), pattern.lower())]
    if folded:
        return _first(folded), None
    if bare:
        inside = [n for n in names if _any_match(n, (f"*{pattern}*",))]
        if inside:
            return _first(inside), f"*{bare}*"
    alike = difflib.get_close_matches(pattern, names, n=NEAR_MATCHES, cutoff=0.6)
    if not alike:
        # A dotted path compared whole is long; compare last parts too.
        last = {n.rsplit(".", 1)[-1]: n for n in names}
        alike = [
            last[p] for p in difflib.get_close_matches(pattern.rsplit(".", 1)[-1], list(last), n=5)
        ]
    return tuple(alike), None


def _first(names: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted(names)[:NEAR_MATCHES])
