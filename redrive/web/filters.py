"""A DLQ page's filters, kept in its URL (a filtered view is a link, and stays after an
action): the CLI's ``--task`` globs, ``--older-than`` and ``--where``, and inspect's
``--group-by``.

``--task`` picks among the scan's groups (a DLQ's scan is by task already: no scan of its
own); an age or a ``--where`` is a scan of its own, as ``inspect --where`` is one."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlencode

from redrive.durations import parse_duration
from redrive.errors import UsageProblem
from redrive.web.scans import ScanRequest

MAX_FILTERS = 10


class Query(Protocol):
    def getlist(self, key: str) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class DlqFilters:
    tasks: tuple[str, ...] = ()
    older_than: str | None = None
    where: tuple[str, ...] = ()
    group_by: str = "task"

    def request(self, target: str) -> ScanRequest:
        where = list(self.where)
        if self.older_than:
            # age_seconds is the record's field (docs/where.md): what --older-than reads.
            where.append(f"age_seconds >= `{_seconds(self.older_than)}`")
        return ScanRequest(target, tuple(where), self.group_by)

    def selects(self, task: object) -> bool:
        """Whether a group (or a kept message) of this task is shown."""
        if not self.tasks:
            return True
        return isinstance(task, str) and any(fnmatch.fnmatchcase(task, p) for p in self.tasks)

    def pairs(self) -> list[tuple[str, str]]:
        pairs = [("task", t) for t in self.tasks]
        if self.older_than:
            pairs.append(("older_than", self.older_than))
        pairs += [("where", w) for w in self.where]
        if self.group_by != "task":
            pairs.append(("group_by", self.group_by))
        return pairs

    def query(self, lead: str = "?") -> str:
        """The filters as a query string (``lead`` included: ``&`` to follow other
        parameters; empty when there are none)."""
        pairs = self.pairs()
        return lead + urlencode(pairs) if pairs else ""

    @property
    def active(self) -> bool:
        return bool(self.pairs())


def _seconds(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise UsageProblem(f"older than: {exc}") from None


def _values(query: Query, key: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in query.getlist(key) if v.strip())
    if len(values) > MAX_FILTERS:
        raise UsageProblem(f"{key}: at most {MAX_FILTERS} values")
    return values


def filters_of(query: Query) -> DlqFilters:
    """The filters a page's query string gives; a bad one is a UsageProblem (said on the
    page, 400)."""
    older = _values(query, "older_than")
    group_by = _values(query, "group_by")
    filters = DlqFilters(
        tasks=_values(query, "task"),
        older_than=older[0] if older else None,
        where=_values(query, "where"),
        group_by=group_by[0] if group_by else "task",
    )
    if filters.older_than:
        _seconds(filters.older_than)  # a bad duration is said before any scan
    return filters


def kept_filters(query: Query) -> DlqFilters:
    """The DLQ page's filters an action's pages carry along (in their URLs, or a form's
    ``view`` field), to link back to the page as it was: none when they do not read as
    filters (only a hand-made URL gives such; the action itself never reads them)."""
    try:
        return filters_of(query)
    except UsageProblem:
        return DlqFilters()
