"""A PATH of an edit: a place in a task's ``args`` or ``kwargs``, written as the ``--where``
record writes it (``kwargs.currency``, ``args[0]``, ``kwargs.address.zip``,
``kwargs."odd key"``, ``kwargs.items[0].sku``).

It is parsed by the same JMESPath parser as ``--where``, so a path reads the same in both;
only names and indexes are a path (a wildcard, a slice or a filter names no one place).
Reading and writing a path go through plain JSON values: a task's arguments as decoded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from jmespath import exceptions as jmespath_errors
from jmespath.parser import Parser

from redrive.errors import UsageProblem
from redrive.shell import shell_quote

__all__ = ["ROOTS", "Root", "Step", "TaskPath", "parse_path", "path_text", "split_assignment"]

Root = Literal["args", "kwargs"]
Step = str | int
"""A key of an object, or an index of a list (negative: from the end, as in JMESPath)."""

ROOTS: Final = ("args", "kwargs")
# JMESPath's unquoted identifier: any other name is written quoted, as a JSON string.
_BARE_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXAMPLES: Final = 'kwargs.currency, args[0], kwargs.address.zip, kwargs."odd key"'
# What the rest of a --where record holds: named in the error that refuses them.
_NOT_EDITABLE: Final = frozenset(
    {"task", "id", "task_id", "headers", "retries", "eta", "expires", "queue", "state"}
)


@dataclass(frozen=True, slots=True)
class TaskPath:
    """A parsed PATH: its root (``args`` or ``kwargs``) and the steps below it."""

    root: Root
    steps: tuple[Step, ...]
    text: str
    """The PATH as written (what messages and the dry run's diff show)."""

    @property
    def parent(self) -> tuple[Step, ...]:
        return self.steps[:-1]

    def within(self, other: TaskPath) -> bool:
        """Whether this path is ``other`` or lies below it (an index from the end may be
        any element, so it is taken to meet every index of its list)."""
        if self.root != other.root or len(self.steps) < len(other.steps):
            return False
        return all(_same_step(a, b) for a, b in zip(self.steps, other.steps, strict=False))


def _same_step(a: Step, b: Step) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b or a < 0 or b < 0
    return a == b


def _problem(option: str, word: str, what: str, fix: str) -> UsageProblem:
    return UsageProblem(f"{option} {shell_quote(word, always=True)}: {what}; {fix}")


def parse_path(text: str, *, option: str, word: str | None = None) -> TaskPath:
    """``text`` as a path into args or kwargs; a UsageProblem (exit 2) naming ``option`` and
    the ``word`` it came in (default: the path) when it is not one."""
    word = text if word is None else word
    try:
        parsed = Parser().parse(text.strip()).parsed
    except jmespath_errors.JMESPathError:
        raise _problem(
            option, word, f"{text!r} is not a path", f"write a path such as {_EXAMPLES}"
        ) from None
    steps = _steps(parsed)
    if steps is None:
        raise _problem(
            option,
            word,
            f"{text!r} is not a single place (a path is names and [indexes] only)",
            f"write a path such as {_EXAMPLES}",
        )
    root = steps[0]
    if root not in ROOTS:
        raise _problem(option, word, *_outside(root, text))
    return TaskPath(root="args" if root == "args" else "kwargs", steps=steps[1:], text=text)


def _outside(root: Step, text: str) -> tuple[str, str]:
    if isinstance(root, str) and root in _NOT_EDITABLE:
        return (
            f"{root} is not an argument: edits reach args and kwargs only (the task name, "
            "id and headers stay as they were)",
            "to change the queue use --route or --to; to drop a passed expiry, --clear-expires",
        )
    return (
        "an edit's path starts at args or kwargs",
        f"did you mean kwargs.{text.strip()}?",
    )


def _steps(node: dict[str, Any]) -> tuple[Step, ...] | None:
    """The names and indexes of a path's tree, in order; None for any other shape."""
    kind = node.get("type")
    if kind == "field":
        return (str(node["value"]),)
    if kind == "index":
        value = node.get("value")
        return (value,) if isinstance(value, int) else None
    if kind not in ("subexpression", "index_expression"):
        return None
    steps: tuple[Step, ...] = ()
    for child in node.get("children", []):
        more = _steps(child) if isinstance(child, dict) else None
        if more is None:
            return None
        steps += more
    # An index first ("[0].x") has no root; jmespath reads it off the record itself.
    return steps if steps and isinstance(steps[0], str) else None


def split_assignment(word: str) -> tuple[str, str] | None:
    """``PATH=VALUE`` at its first ``=`` outside a quoted name (``kwargs."a=b"=1``); None
    when there is none."""
    quoted = False
    at = 0
    while at < len(word):
        char = word[at]
        if quoted and char == "\\":
            at += 2
            continue
        if char == '"':
            quoted = not quoted
        elif char == "=" and not quoted:
            return word[:at], word[at + 1 :]
        at += 1
    return None


def path_text(root: str, steps: Sequence[Step]) -> str:
    """A path as it is written: ``kwargs.address.zip``, ``args[0]``, ``kwargs."odd key"``."""
    text = root
    for step in steps:
        if isinstance(step, int):
            text += f"[{step}]"
        elif _BARE_NAME.fullmatch(step):
            text += "." + step
        else:
            text += "." + json.dumps(step, ensure_ascii=False)
    return text
