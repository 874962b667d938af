"""A selection's filters as text (confirmations, the audit trail) and the filters that matched
nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from redrive.render.tables import printable
from redrive.selection import FilterMisses
from redrive.shell import shell_quote


def misses_text(misses: FilterMisses | None, *, matched: int) -> list[str]:
    """What a --task or --message-id filter that matched nothing could have meant."""
    if misses is None:
        return []
    lines = [""]
    for miss in misses.patterns:
        line = f"--task {shell_quote(miss.pattern)} matched no message scanned"
        if miss.near:
            line += f"; it nearly matches {', '.join(miss.near)}"
        if miss.suggestion:
            line += f": did you mean --task {shell_quote(miss.suggestion)}?"
        lines.append(printable(line))
    if misses.ids_not_seen_count:
        shown = ", ".join(misses.ids_not_seen)
        more = misses.ids_not_seen_count - len(misses.ids_not_seen)
        lines.append(
            f"{misses.ids_not_seen_count} of the {misses.ids_given} --message-id value(s) "
            f"matched no message scanned: {printable(shown)}"
            + (f" and {more} more" if more else "")
            + " (already moved or deleted, or mistyped)"
        )
    if misses.patterns and misses.tasks_seen:
        seen = ", ".join(f"{task} ({n})" for task, n in misses.tasks_seen)
        more = misses.distinct_tasks - len(misses.tasks_seen)
        lines.append(
            printable(f"tasks scanned: {seen}" + (f" and {more} more" if more > 0 else ""))
        )
    elif misses.patterns and not matched:
        lines.append("no message was scanned: the DLQ looked empty")
    return lines


_UNITS = (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60))


_AGE_FLAGS = (("older_than_seconds", "--older-than"), ("newer_than_seconds", "--newer-than"))


def duration_flag(seconds: float) -> str:
    """A duration as an option value that parses back to the same seconds: ``90m``, ``3d``."""
    if seconds != int(seconds):
        return f"{seconds:g}s"
    whole = int(seconds)
    for unit, size in _UNITS:
        if whole and whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def filters_text(filters: Mapping[str, Any]) -> str:
    """The filters of a run (``Selection.describe()``, as any redrive recorded them) as the
    options that select the same messages: ``--task 'apps.payments.*' --older-than 1h``."""
    words: list[str] = []
    for pattern in filters.get("tasks") or ():
        words += ["--task", shell_quote(str(pattern))]
    for pattern in filters.get("exclude_tasks") or ():
        words += ["--exclude-task", shell_quote(str(pattern))]
    for key, flag in _AGE_FLAGS:
        if isinstance(filters.get(key), int | float):
            words += [flag, duration_flag(float(filters[key]))]
    ids = filters.get("message_ids")
    if isinstance(ids, str) and ids:
        words.append(f"({ids})")  # "12 ids (from a plan)": a plan's ids stay in the plan
    elif ids:
        for message_id in ids:
            words += ["--message-id", shell_quote(str(message_id))]
    if filters.get("limit") is not None:
        words += ["--limit", str(filters["limit"])]
    for expression in filters.get("where") or ():
        words += ["--where", shell_quote(str(expression))]
    known = {"tasks", "exclude_tasks", "older_than_seconds", "newer_than_seconds", "where"}
    for key, value in filters.items():
        if key not in known | {"message_ids", "limit"} and value not in (None, [], ""):
            words.append(f"{key}={value}")
    return printable(" ".join(words)) if words else "none (every message)"
