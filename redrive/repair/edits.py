"""The edits of a repair, as the command line gives them, and applying them to one task.

``--set PATH=JSON`` (``--create``: a missing PATH is created), ``--unset PATH``,
``--rename kwargs.OLD=kwargs.NEW``, ``--clear-expires`` and ``--clear-eta``. Parsing refuses,
before anything is received, what cannot be meant (a value that is not JSON, a path outside
args and kwargs, two edits of one place); applying is pure and never fails: a path a
message does not have changes nothing in it and is reported (:class:`EditOutcome`).

Each edit knows the words that make it (:attr:`SetValue.words` and so on), so a plan records
them and ``apply`` parses the same edits back (:func:`parse_edit_words`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from redrive.errors import UsageProblem
from redrive.repair.paths import Step, TaskPath, parse_path, path_text, split_assignment
from redrive.shell import shell_quote

__all__ = [
    "CLEAR_ETA",
    "CLEAR_EXPIRES",
    "Clear",
    "Edit",
    "EditOutcome",
    "Rename",
    "SetValue",
    "Status",
    "TaskContent",
    "Unset",
    "apply_edits",
    "check_edits",
    "edits_from_options",
    "parse_edit_words",
    "parse_rename",
    "parse_set",
    "parse_unset",
]


@dataclass(frozen=True, slots=True)
class TaskContent:
    """What edits change in a task, whichever protocol carries it: its arguments, and the
    two times (as written: ISO 8601 text, or None) a worker reads before running it."""

    args: list[Any]
    kwargs: dict[str, Any]
    eta: Any = None
    expires: Any = None


@dataclass(frozen=True, slots=True)
class SetValue:
    path: TaskPath
    value: Any
    create: bool = False

    @property
    def words(self) -> tuple[str, ...]:
        text = f"{self.path.text}={_json(self.value)}"
        return ("--set", text, "--create") if self.create else ("--set", text)


@dataclass(frozen=True, slots=True)
class Unset:
    path: TaskPath

    @property
    def words(self) -> tuple[str, ...]:
        return ("--unset", self.path.text)


@dataclass(frozen=True, slots=True)
class Rename:
    old: TaskPath
    new: TaskPath

    @property
    def words(self) -> tuple[str, ...]:
        return ("--rename", f"{self.old.text}={self.new.text}")


@dataclass(frozen=True, slots=True)
class Clear:
    """``--clear-expires`` or ``--clear-eta``: the time set to None, as Celery writes a task
    sent without one."""

    field: Literal["eta", "expires"]

    @property
    def words(self) -> tuple[str, ...]:
        return (f"--clear-{self.field}",)


CLEAR_EXPIRES: Final = Clear("expires")
CLEAR_ETA: Final = Clear("eta")

Edit = SetValue | Unset | Rename | Clear

Status = Literal["changed", "unchanged", "missing", "taken"]
"""What an edit did to one task: changed it; found it already so (the value it sets, a time
already unset); found no such path (nothing changed); a rename whose new name is taken."""


@dataclass(frozen=True, slots=True)
class EditOutcome:
    edit: Edit
    status: Status
    detail: str = ""
    """Why nothing changed, in words for the dry run (``kwargs.address is a string``)."""

    @property
    def changed(self) -> bool:
        return self.status == "changed"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _problem(option: str, word: str, what: str, fix: str) -> UsageProblem:
    return UsageProblem(f"{option} {shell_quote(word, always=True)}: {what}; {fix}")


def _example_value(text: str) -> str:
    """The JSON a value written bare most likely meant: a string."""
    return json.dumps(text.strip(), ensure_ascii=False)


def parse_set(word: str, *, create: bool = False) -> SetValue:
    """``--set PATH=JSON``."""
    parts = split_assignment(word)
    if parts is None:
        raise _problem(
            "--set",
            word,
            "needs PATH=JSON",
            f"""write --set {shell_quote(word.strip() + '="VALUE"', always=True)} """
            """(e.g. --set 'kwargs.currency="EUR"')""",
        )
    text, raw = parts
    path = parse_path(text, option="--set", word=word)
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        fixed = f"{text}={_example_value(raw)}"
        raise _problem(
            "--set",
            word,
            f"{raw!r} is not JSON",
            f"a string is in double quotes: --set {shell_quote(fixed, always=True)}",
        ) from None
    if not path.steps and not isinstance(value, list if path.root == "args" else dict):
        shape = "a list ([...])" if path.root == "args" else "an object ({...})"
        raise _problem(
            "--set",
            word,
            f"{path.root} is always {shape}",
            f"set one place in it, e.g. {_eg(path)}",
        )
    return SetValue(path, value, create)


def _eg(path: TaskPath) -> str:
    return "--set 'args[0]=1'" if path.root == "args" else """--set 'kwargs.currency="EUR"'"""


def parse_unset(word: str) -> Unset:
    """``--unset PATH``."""
    path = parse_path(word, option="--unset")
    if not path.steps:
        empty = "[]" if path.root == "args" else "{}"
        raise _problem(
            "--unset",
            word,
            f"{path.root} itself cannot be removed",
            f"to empty it: --set {shell_quote(f'{path.root}={empty}', always=True)}",
        )
    return Unset(path)


def parse_rename(word: str) -> Rename:
    """``--rename kwargs.OLD=kwargs.NEW``: a key renamed where it is (same object, its place
    in the object kept)."""
    parts = split_assignment(word)
    example = "--rename kwargs.OLD=kwargs.NEW"
    if parts is None:
        raise _problem("--rename", word, "needs OLD=NEW", f"write {example}")
    old = parse_path(parts[0], option="--rename", word=word)
    new = parse_path(parts[1], option="--rename", word=word)
    for path in (old, new):
        if not path.steps or not isinstance(path.steps[-1], str):
            raise _problem(
                "--rename",
                word,
                f"{path.text} is not a key of an object (a rename renames a key)",
                f"write {example}; to move a positional argument, --set and --unset",
            )
    if (old.root, old.parent) != (new.root, new.parent):
        fixed = f"{old.text}={_beside(old, new)}"
        raise _problem(
            "--rename",
            word,
            "OLD and NEW must be keys of the same object",
            f"--rename {shell_quote(fixed, always=True)}",
        )
    if old.steps == new.steps:
        raise _problem("--rename", word, "OLD and NEW are the same key", f"write {example}")
    return Rename(old, new)


def _beside(old: TaskPath, new: TaskPath) -> str:
    """NEW's name beside OLD, in OLD's object: what a rename across objects most likely meant."""
    return path_text(old.root, (*old.parent, new.steps[-1]))


def _paths(edit: Edit) -> tuple[TaskPath, ...]:
    if isinstance(edit, SetValue | Unset):
        return (edit.path,)
    if isinstance(edit, Rename):
        return (edit.old, edit.new)
    return ()


def _shown(edit: Edit) -> str:
    return " ".join(shell_quote(word) for word in edit.words if word != "--create")


def check_edits(edits: Sequence[Edit]) -> None:
    """Refuse two edits of one place (or of a place and one inside it): which would win is
    no choice to leave to the order of options. An unset list element shifts the ones after
    it, so it is alone in its list."""
    for at, first in enumerate(edits):
        for second in edits[at + 1 :]:
            if first == second:
                raise UsageProblem(f"{_shown(first)} is given twice: give it once")
            for a in _paths(first):
                for b in _paths(second):
                    if a.within(b) or b.within(a):
                        raise UsageProblem(
                            f"{_shown(first)} and {_shown(second)} both change "
                            f"{min(a.text, b.text, key=len)}: give one edit per place"
                        )
                    for unset, other, edit in ((first, b, second), (second, a, first)):
                        if _shifts(unset, other):
                            raise UsageProblem(
                                f"{_shown(unset)} moves every element after it, so "
                                f"{_shown(edit)} would reach another one: give that list "
                                "one edit, or set it whole"
                            )


def _shifts(edit: Edit, other: TaskPath) -> bool:
    """Whether ``edit`` removes a list element of a list that ``other`` reaches into."""
    if not isinstance(edit, Unset) or not isinstance(edit.path.steps[-1], int):
        return False
    path = edit.path
    parent = TaskPath(path.root, path.parent, path.text)
    return other.within(parent) and len(other.steps) > len(path.parent)


def edits_from_options(
    *,
    sets: Iterable[str] = (),
    unsets: Iterable[str] = (),
    renames: Iterable[str] = (),
    clear_expires: bool = False,
    clear_eta: bool = False,
    create: bool = False,
) -> tuple[Edit, ...]:
    """A command line's edit options as edits, checked (:func:`check_edits`)."""
    sets = list(sets)
    if create and not sets:
        raise UsageProblem("--create applies to --set: add --set PATH=JSON, or drop --create")
    edits: list[Edit] = [parse_rename(word) for word in renames]
    edits += [parse_set(word, create=create) for word in sets]
    edits += [parse_unset(word) for word in unsets]
    edits += [CLEAR_EXPIRES] if clear_expires else []
    edits += [CLEAR_ETA] if clear_eta else []
    check_edits(edits)
    return tuple(edits)


def parse_edit_words(words: Sequence[str]) -> tuple[Edit, ...]:
    """The edits of the words :attr:`Edit.words` gave (a plan's record), checked."""
    edits: list[Edit] = []
    at = 0
    while at < len(words):
        option = words[at]
        if option in ("--clear-expires", "--clear-eta"):
            edits.append(CLEAR_EXPIRES if option == "--clear-expires" else CLEAR_ETA)
            at += 1
            continue
        if option not in ("--set", "--unset", "--rename") or at + 1 >= len(words):
            raise UsageProblem(
                f"{shell_quote(option)} is not an edit: edits are --set, "
                "--unset, --rename, --clear-expires and --clear-eta"
            )
        word = words[at + 1]
        at += 2
        if option == "--set":
            create = at < len(words) and words[at] == "--create"
            at += 1 if create else 0
            edits.append(parse_set(word, create=create))
        elif option == "--unset":
            edits.append(parse_unset(word))
        else:
            edits.append(parse_rename(word))
    check_edits(edits)
    return tuple(edits)


# --- applying -------------------------------------------------------------------------


@dataclass(slots=True)
class _Work:
    """The task being edited: its own copies, so the caller's values never change."""

    args: list[Any]
    kwargs: dict[str, Any]
    times: dict[str, Any] = field(default_factory=dict)

    def root(self, path: TaskPath) -> Any:
        return self.args if path.root == "args" else self.kwargs


def apply_edits(
    content: TaskContent, edits: Sequence[Edit]
) -> tuple[TaskContent, tuple[EditOutcome, ...]]:
    """The task as the edits leave it, and what each did. Pure: ``content`` is not changed."""
    work = _Work(
        copy.deepcopy(content.args),
        copy.deepcopy(content.kwargs),
        {"eta": content.eta, "expires": content.expires},
    )
    outcomes = tuple(_apply(work, edit) for edit in edits)
    if not any(outcome.changed for outcome in outcomes):
        return content, outcomes
    return (
        replace(
            content,
            args=work.args,
            kwargs=work.kwargs,
            eta=work.times["eta"],
            expires=work.times["expires"],
        ),
        outcomes,
    )


def _apply(work: _Work, edit: Edit) -> EditOutcome:
    if isinstance(edit, Clear):
        if work.times[edit.field] is None:
            return EditOutcome(edit, "unchanged", f"no {edit.field}")
        work.times[edit.field] = None
        return EditOutcome(edit, "changed")
    if isinstance(edit, SetValue):
        return _set(work, edit)
    if isinstance(edit, Unset):
        return _unset(work, edit)
    return _rename(work, edit)


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"


def _walk(
    value: Any, path: TaskPath, steps: Sequence[Step], *, create: bool = False
) -> tuple[Any, str]:
    """The container at ``steps`` below ``value``, or (None, why not). ``create``: missing
    keys of objects on the way become empty objects."""
    for depth, step in enumerate(steps):
        here = _text(path, depth)
        if isinstance(step, str):
            if not isinstance(value, dict):
                return None, f"{here} is {_kind(value)}, not an object"
            if step not in value:
                if not create:
                    return None, f"no {_text(path, depth + 1)}"
                value[step] = {}
            value = value[step]
        else:
            if not isinstance(value, list):
                return None, f"{here} is {_kind(value)}, not a list"
            if not -len(value) <= step < len(value):
                return None, f"no {_text(path, depth + 1)} ({here} has {len(value)})"
            value = value[step]
    return value, ""


def _text(path: TaskPath, depth: int) -> str:
    """The path down to ``depth`` steps (``kwargs.address``)."""
    return path_text(path.root, path.steps[:depth])


def _same(a: Any, b: Any) -> bool:
    # 1, 1.0 and true are equal in Python, not in JSON: compare what the body would hold.
    return _json(a) == _json(b)


def _set(work: _Work, edit: SetValue) -> EditOutcome:
    path = edit.path
    value = copy.deepcopy(edit.value)
    if not path.steps:
        if _same(work.root(path), value):
            return EditOutcome(edit, "unchanged", f"{path.text} is already {_json(value)}")
        if path.root == "args":
            work.args = value
        else:
            work.kwargs = value
        return EditOutcome(edit, "changed")
    # Walk without creating first: a path missing under a list or a string is never created.
    parent, why = _walk(work.root(path), path, path.parent)
    if why.startswith("no ") and edit.create:
        # Tried on a copy first: a path that cannot be made whole must leave nothing made.
        # (Only objects are made: a list made here could hold no element yet.)
        _, trial = _walk(copy.deepcopy(work.root(path)), path, path.parent, create=True)
        if not trial and isinstance(path.steps[-1], str):
            parent, why = _walk(work.root(path), path, path.parent, create=True)
    if why:
        return EditOutcome(edit, "missing", why)
    last = path.steps[-1]
    if isinstance(last, str):
        if not isinstance(parent, dict):
            return EditOutcome(
                edit,
                "missing",
                f"{_text(path, len(path.parent))} is {_kind(parent)}, not an object",
            )
        if last not in parent and not edit.create:
            return EditOutcome(edit, "missing", f"no {path.text} (--create adds it)")
    elif not isinstance(parent, list):
        return EditOutcome(
            edit, "missing", f"{_text(path, len(path.parent))} is {_kind(parent)}, not a list"
        )
    elif last == len(parent) and edit.create:
        parent.append(value)
        return EditOutcome(edit, "changed")
    elif not -len(parent) <= last < len(parent):
        return EditOutcome(
            edit, "missing", f"no {path.text} ({_text(path, len(path.parent))} has {len(parent)})"
        )
    if (last in parent if isinstance(parent, dict) else True) and _same(parent[last], value):
        return EditOutcome(edit, "unchanged", f"{path.text} is already {_json(value)}")
    parent[last] = value
    return EditOutcome(edit, "changed")


def _unset(work: _Work, edit: Unset) -> EditOutcome:
    path = edit.path
    _, why = _walk(work.root(path), path, path.steps)
    if why:
        return EditOutcome(edit, "missing", why)
    parent, _ = _walk(work.root(path), path, path.parent)
    del parent[path.steps[-1]]
    return EditOutcome(edit, "changed")


def _rename(work: _Work, edit: Rename) -> EditOutcome:
    old, new = edit.old, edit.new
    parent, why = _walk(work.root(old), old, old.parent)
    if why:
        return EditOutcome(edit, "missing", why)
    if not isinstance(parent, dict):
        here = _text(old, len(old.parent))
        return EditOutcome(edit, "missing", f"{here} is {_kind(parent)}, not an object")
    old_key, new_key = old.steps[-1], new.steps[-1]
    if old_key not in parent:
        return EditOutcome(edit, "missing", f"no {old.text}")
    if new_key in parent:
        return EditOutcome(edit, "taken", f"{new.text} is there already")
    # Rebuilt in place, so that the key keeps its place among the others.
    items = [(new_key if key == old_key else key, value) for key, value in parent.items()]
    parent.clear()
    parent.update(items)
    return EditOutcome(edit, "changed")
