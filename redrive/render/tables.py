"""Tables fitted to the terminal (tabulate), and the cells and wrapping every view shares."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import tabulate as tabulate_module
import wcwidth
from tabulate import tabulate

from redrive.durations import format_duration


def printable(text: str) -> str:
    """Text from a message made safe to print: control and invisible characters escaped.

    A DLQ holds whatever a producer sent; raw escape sequences would reach the operator's
    terminal and a newline in a task name would forge a table row.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


# A "|" would split a Markdown table's cell in two (and a backslash before it unescape it),
# "<" start HTML, "[" "]" a link, "`" a code span: each is taken literally once escaped.
_MARKDOWN_SPECIAL = str.maketrans({c: "\\" + c for c in "\\|<>[]`"})


def markdown_text(text: str) -> str:
    """Text from a message made literal in Markdown (a table cell, a heading)."""
    return printable(text).translate(_MARKDOWN_SPECIAL)


def display_width(text: str) -> int:
    """The columns a terminal gives ``text``: two for a CJK character or an emoji, none for
    a combining mark (the measure tabulate aligns by, wcwidth's)."""
    if text.isascii():
        return len(text)
    width = int(wcwidth.wcswidth(text))
    return width if width >= 0 else len(text)


def _head(text: str, width: int) -> str:
    """The longest start of ``text`` no wider than ``width`` columns."""
    used = 0
    for i, char in enumerate(text):
        used += display_width(char)
        if used > width:
            return text[:i]
    return text


def _tail(text: str, width: int) -> str:
    """The longest end of ``text`` no wider than ``width`` columns."""
    return _head(text[::-1], width)[::-1]


class _Lines(str):
    """A cell already folded onto several lines (its newlines are the fitting's own)."""

    __slots__ = ()


def table(
    rows: Iterable[Sequence[Any]],
    headers: Sequence[str],
    *,
    fmt: str = "simple",
    maxcolwidths: Sequence[int | None] | None = None,
    maxheadercolwidths: Sequence[int | None] | None = None,
) -> str:
    def cell(value: Any) -> Any:
        if isinstance(value, Short):
            value = value.full
        if not isinstance(value, str) or isinstance(value, _Lines):
            return value
        value = printable(value)
        return markdown_text(value) if fmt == "github" else value

    body = [[cell(v) for v in row] for row in rows]
    return str(
        tabulate(
            body,
            headers=list(headers),
            tablefmt=fmt,
            disable_numparse=True,
            maxcolwidths=list(maxcolwidths) if maxcolwidths else None,
            maxheadercolwidths=list(maxheadercolwidths) if maxheadercolwidths else None,
        )
    )


# -- fitting a table to the terminal --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Short:
    """A cell with a shorter reading for a narrow terminal: ``3h ago`` for a timestamp."""

    full: Any
    short: Any


@dataclass(frozen=True, slots=True)
class Narrow:
    """One way to make a table narrower, tried in order until the table fits.

    ``tight``: no padding beside the headers; ``drop`` a column; ``short``: use its cells'
    short readings; ``shrink`` its cells to fit (never below ``to`` characters);
    ``headers``: wrap every header onto lines no wider than its column needs; ``wrap``: wrap
    a column's text onto several lines, between words (for sentences, which a cut would
    make useless); ``note``: a cell wider than ``to`` goes below the table as a numbered
    note, its cell a ``[1]`` (a router's error: wanted whole); ``below``: the column leaves
    the table for a list under it, one line per row that has a value, named by the row's
    first cell (what only some rows have, or what is long in every row); ``empty``: drop
    a column that says nothing (every cell 0, ``-`` or blank: the totals above say it).
    """

    action: Literal["tight", "drop", "short", "shrink", "headers", "wrap", "note", "below", "empty"]
    column: str = ""
    to: int = 0


ELLIPSIS = "\u2026"


def shorten_end(text: str, width: int) -> str:
    if display_width(text) <= width:
        return text
    return _head(text, max(0, width - 1)) + ELLIPSIS


def shorten_middle(text: str, width: int) -> str:
    """``onion-che…-dlq``: both ends of a name usually matter."""
    if display_width(text) <= width:
        return text
    if width < 5:
        return shorten_end(text, width)
    tail = (width - 1) // 2
    return _head(text, width - 1 - tail) + ELLIPSIS + _tail(text, tail)


def shorten_task(name: str, width: int) -> str:
    """``apps.pay….capture_payment``: a task's last dotted part is its name, kept whole
    (even past ``width``: docs/commands.md promises it); the module path before it is what a
    reader can most easily do without."""
    if display_width(name) <= width:
        return name
    head, dot, last = name.rpartition(".")
    if not head:
        return shorten_end(name, width)
    tail = dot + last
    return _head(head, max(0, width - 1 - display_width(tail))) + ELLIPSIS + tail


# Queue names and identities differ at both ends (``onion-checkout-dlq``); the rest, at the end.
_SHRINKERS: dict[str, Callable[[str, int], str]] = {
    "task": shorten_task,
    "queue": shorten_middle,
    "dlq": shorten_middle,
    "destination": shorten_middle,
    "target": shorten_middle,
    "who": shorten_middle,
}


def fitted_table(
    rows: Sequence[Sequence[Any]],
    headers: Sequence[str],
    *,
    width: int | None,
    steps: Sequence[Narrow] = (),
    fmt: str = "simple",
) -> str:
    """``table``, narrowed by ``steps`` (in order) until no line is wider than ``width``, so
    the terminal never folds a row into the next: the least useful columns go first, then
    long names are shortened, and what is too wide for a column goes below the table
    (``below``, ``note``). Still too wide (ids that must stay whole), one block per row.
    ``width`` None shows everything, at full length; only the plain format is narrowed
    (Markdown is for documents).
    """
    view = _TableView(rows, headers)
    text = view.render(fmt)
    if width is None or fmt != "simple":
        return text
    for step in (*steps, *_LAST_STEPS):
        overflow = _widest(text) - width
        if overflow <= 0:
            break
        if view.apply(step, overflow):
            text = view.render(fmt)
    # Wider than any narrowing makes it: one block per row, every value whole.
    too_wide = _widest(text) > width
    text = view.records(width) if too_wide else view.relax(text, width, fmt)
    return text + view.below_text(width) + view.notes_text(width)


# Whatever a view's own steps leave: no header padding, headers folded.
_LAST_STEPS = (Narrow("tight"), Narrow("headers"))


def _widest(text: str) -> int:
    return max((display_width(line) for line in text.splitlines()), default=0)


# A word, where a `code span` (a command to paste) counts as one word, spaces and all.
_WORDS = re.compile(r"(?:[^\s`]*`[^`]*`)+[^\s`]*|\S+")


def _words(text: str) -> list[str]:
    return _WORDS.findall(text)


def fold(text: str, width: int, *, hang: str = "") -> list[str]:
    """``text`` on lines no wider than ``width``, broken between words (the spaces kept
    where a line goes on), never inside a `code span` (a command: it must paste whole);
    only a word wider than a whole line (a long path) is cut. The lines after the first
    start with the first's indent and ``hang``."""
    indent = text[: len(text) - len(text.lstrip(" "))]
    room = width - display_width(indent + hang)
    lines: list[str] = []
    prefix, current = indent, ""
    for match in _SPACED.finditer(text, len(indent)):
        gap, word = match.groups()
        for piece in _pieces(word, room):
            if current and display_width(prefix + current + gap + piece) > width:
                lines.append(prefix + current)
                prefix, current = indent + hang, piece
            else:
                current = current + gap + piece if current else piece
            gap = ""
    lines.append(prefix + current)
    return lines


_SPACED = re.compile(r"(\s*)((?:[^\s`]*`[^`]*`)+[^\s`]*|\S+)")


def _pieces(word: str, room: int) -> list[str]:
    """A word as the pieces it is printed in: whole, unless it is wider than a line and
    not a `code span`."""
    if display_width(word) <= room or "`" in word or room < 8:
        return [word]
    pieces = []
    while word:
        piece = _head(word, room)
        pieces.append(piece)
        word = word[len(piece) :]
    return pieces


def _is_command(line: str) -> bool:
    """A suggested command on a line of its own: it must paste back whole."""
    return line.lstrip().startswith(("redrive ", "$ redrive "))


def fit_text(text: str, width: int | None) -> str:
    """A view's text with every line wider than ``width`` folded between words (a list
    item's continuation indented under it); a suggested command's own line stays whole,
    wider or not. Lines that fit (a fitted table's) are left as they are."""
    if width is None:
        return text
    out: list[str] = []
    for line in text.split("\n"):
        if display_width(line) <= width or _is_command(line) or not line.strip():
            out.append(line)
        else:
            out.extend(fold(line, width, hang="  " if line.startswith(" ") else ""))
    return "\n".join(out)


# What a cell holds when it has nothing to say.
_NOTHING = ("", "-", "0")


class _TableView:
    """The columns a table still shows, and how each is narrowed."""

    def __init__(self, rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
        self.rows = [list(row) for row in rows]
        self.headers = list(headers)
        self.short: set[str] = set()
        self.caps: dict[str, int] = {}
        self.wrapped: set[str] = set()
        self.noted: set[str] = set()
        self.notes: dict[tuple[str, str], int] = {}
        self.below: list[tuple[str, list[tuple[str, str]]]] = []
        self.wrap_headers = False
        self.tight = False

    def cells(self, column: str) -> list[str]:
        i = self.headers.index(column)
        return [self._text(column, row[i]) for row in self.rows]

    def _text(self, column: str, value: Any) -> str:
        if isinstance(value, Short):
            value = value.short if column in self.short else value.full
        return printable(str(value))

    def apply(self, step: Narrow, overflow: int) -> bool:
        """Narrow the view by one step; False when the step does not apply."""
        if step.action == "tight":
            changed = not self.tight
            self.tight = True
            return changed
        if step.action == "headers":
            changed = not self.wrap_headers
            self.wrap_headers = True
            return changed
        if step.column not in self.headers:
            return False
        if step.action == "empty" and any(c not in _NOTHING for c in self.cells(step.column)):
            return False
        if step.action == "below":
            labels = self._labels()
            values = zip(labels, self.cells(step.column), strict=True)
            # A row with nothing to say (no value, a count of 0) is left out of the list.
            kept = [(k, v) for k, v in values if v not in _NOTHING]
            self.below.append((step.column, kept))
        if step.action in ("drop", "below", "empty"):
            i = self.headers.index(step.column)
            del self.headers[i]
            for row in self.rows:
                del row[i]
            return True
        if step.action == "short":
            self.short.add(step.column)
            return True
        cells = self.cells(step.column)
        widest = max((display_width(c) for c in cells), default=0)
        widest = min(widest, self.caps.get(step.column, widest))
        floor = step.to
        if step.action == "wrap":
            # Between words only: no column narrower than its longest word.
            floor = max(floor, *(display_width(w) for c in cells for w in _words(c)), 1)
        if step.action == "note":
            floor = max(floor, len(f"[{len(self.notes) + len(cells)}]"))
        cap = max(floor, widest - overflow, 1)
        if cap >= widest:
            return False
        self.caps[step.column] = cap
        if step.action == "wrap":
            self.wrapped.add(step.column)
        if step.action == "note":
            self.noted.add(step.column)
        return True

    def relax(self, text: str, width: int, fmt: str) -> str:
        """Give shortened columns back the room later steps freed (a column moved below
        the table leaves space a name cut earlier can have again)."""
        for column in [c for c in self.caps if c in self.headers]:
            if column in self.wrapped or column in self.noted:
                continue
            slack = width - _widest(text)
            if slack <= 0:
                break
            cap = self.caps[column]
            shown = max(display_width(self._cell(column, v)) for v in self._values(column))
            self.caps[column] = max(cap, shown) + slack
            wider = self.render(fmt)
            if _widest(wider) <= width:
                text = wider
            else:
                self.caps[column] = cap
        return text

    def _values(self, column: str) -> list[Any]:
        i = self.headers.index(column)
        return [row[i] for row in self.rows] or [""]

    def _labels(self) -> list[str]:
        """Each row's name: its first cell, with its second where the first repeats."""
        first = self.cells(self.headers[0])
        if len(set(first)) == len(first) or len(self.headers) < 2:
            return first
        second = self.cells(self.headers[1])
        return [f"{a} ({b})" for a, b in zip(first, second, strict=True)]

    def records(self, width: int) -> str:
        """The rows as blocks of ``column: value`` lines (a table no width can hold: ids
        that must stay whole), the first column's value heading each block."""
        self.notes.clear()
        blocks = []
        for row in self.rows:
            lines: list[str] = []
            for i, (column, value) in enumerate(zip(self.headers, row, strict=True)):
                line = f"{'  ' if i else ''}{column}: {self._text(column, value)}"
                lines += fold(line, width, hang="  " if i else "    ")
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks)

    def _cell(self, column: str, value: Any) -> str:
        text = self._text(column, value)
        cap = self.caps.get(column)
        if cap is None or display_width(text) <= cap:
            return text
        if column in self.noted:
            number = self.notes.setdefault((column, text), len(self.notes) + 1)
            return f"[{number}]"
        if column in self.wrapped:
            return _Lines("\n".join(fold(text, cap)))
        return _SHRINKERS.get(column, shorten_end)(text, cap)

    def render(self, fmt: str) -> str:
        self.notes.clear()
        body = [
            [self._cell(column, value) for column, value in zip(self.headers, row, strict=True)]
            for row in self.rows
        ]
        header_widths: list[int | None] | None = None
        if self.wrap_headers:
            header_widths = []
            for i, header in enumerate(self.headers):
                content = max(
                    (display_width(line) for r in body for line in str(r[i]).split("\n")),
                    default=0,
                )
                longest_word = max(len(w) for w in header.split()) if header.strip() else 1
                header_widths.append(max(content, longest_word))
        with _header_padding(0 if self.tight else None):
            return table(body, self.headers, fmt=fmt, maxheadercolwidths=header_widths)

    def below_text(self, width: int) -> str:
        """The columns that left the table, each a list under it."""
        lines: list[str] = []
        for column, values in self.below:
            if values:
                lines += ["", f"{column}:"]
                lines += [line for k, v in values for line in fold(f"  {k}: {v}", width, hang="  ")]
        return "\n" + "\n".join(lines) if lines else ""

    def notes_text(self, width: int) -> str:
        """The cells that went below the table, numbered as their ``[n]`` marks."""
        if not self.notes:
            return ""
        lines = ["", ""]
        for (column, text), number in sorted(self.notes.items(), key=lambda item: item[1]):
            mark = f"[{number}] "
            lines.extend(fold(f"{mark}{column}: {text}", width, hang=" " * len(mark)))
        return "\n".join(lines)


@contextlib.contextmanager
def _header_padding(padding: int | None) -> Iterator[None]:
    """tabulate pads every header by two spaces (a module setting, read at each call); a
    narrow table spends those on its cells. Rendering is single-threaded, in the CLI."""
    if padding is None:
        yield
        return
    saved = tabulate_module.MIN_PADDING
    tabulate_module.MIN_PADDING = padding
    try:
        yield
    finally:
        tabulate_module.MIN_PADDING = saved


def wrapped(text: str, width: int | None) -> str:
    """A line of prose folded to ``width`` (between words, never inside one)."""
    if width is None or display_width(text) <= width:
        return text
    return "\n".join(fold(text, width))


def when(ts: float | None, now: float | None = None) -> str:
    """``2026-11-30 03:12Z (3h ago)``."""
    if ts is None:
        return "-"
    now = time.time() if now is None else now
    stamp = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%MZ")
    return f"{stamp} ({format_duration(now - ts)} ago)"


def ago(ts: float | None, now: float | None = None) -> str:
    """``3h ago``: the short reading of :func:`when`."""
    if ts is None:
        return "-"
    now = time.time() if now is None else now
    return f"{format_duration(now - ts)} ago"


def when_cell(ts: float | None, now: float | None = None) -> Short:
    return Short(when(ts, now), ago(ts, now))
