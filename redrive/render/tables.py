"""Tables fitted to the terminal (tabulate), and the cells and wrapping every view shares."""

from __future__ import annotations

import contextlib
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import tabulate as tabulate_module
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
        if not isinstance(value, str):
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
    a column's text onto several lines (for sentences, which a cut would make useless).
    """

    action: Literal["tight", "drop", "short", "shrink", "headers", "wrap"]
    column: str = ""
    to: int = 0


ELLIPSIS = "\u2026"


def shorten_end(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    return text[: max(0, width - 1)] + ELLIPSIS


def shorten_middle(text: str, width: int) -> str:
    """``onion-che…-dlq``: both ends of a name usually matter."""
    if len(text) <= width:
        return text
    if width < 5:
        return shorten_end(text, width)
    tail = (width - 1) // 2
    return text[: width - 1 - tail] + ELLIPSIS + text[len(text) - tail :]


def shorten_task(name: str, width: int) -> str:
    """``apps.pay….capture_payment``: a task's last dotted part is its name; the module path
    before it is what a reader can most easily do without."""
    if len(name) <= width:
        return name
    head, dot, last = name.rpartition(".")
    tail = dot + last
    if not head or len(tail) + 2 > width:
        return shorten_end(name, width)
    return head[: width - 1 - len(tail)] + ELLIPSIS + tail


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
    long names are shortened. ``width`` None shows everything, at full length; only the
    plain format is narrowed (Markdown is for documents).
    """
    view = _TableView(rows, headers)
    text = view.render(fmt)
    if width is None or fmt != "simple":
        return text
    for step in steps:
        overflow = _widest(text) - width
        if overflow <= 0:
            break
        if view.apply(step, overflow):
            text = view.render(fmt)
    return text


def _widest(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


class _TableView:
    """The columns a table still shows, and how each is narrowed."""

    def __init__(self, rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
        self.rows = [list(row) for row in rows]
        self.headers = list(headers)
        self.short: set[str] = set()
        self.caps: dict[str, int] = {}
        self.wrapped: set[str] = set()
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
        if step.action == "drop":
            i = self.headers.index(step.column)
            del self.headers[i]
            for row in self.rows:
                del row[i]
            return True
        if step.action == "short":
            self.short.add(step.column)
            return True
        widest = max((len(c) for c in self.cells(step.column)), default=0)
        widest = min(widest, self.caps.get(step.column, widest))
        cap = max(step.to, widest - overflow, 1)
        if cap >= widest:
            return False
        self.caps[step.column] = cap
        if step.action == "wrap":
            self.wrapped.add(step.column)
        return True

    def render(self, fmt: str) -> str:
        body = []
        for row in self.rows:
            line = []
            for column, value in zip(self.headers, row, strict=True):
                text = self._text(column, value)
                cap = self.caps.get(column)
                if cap is not None and column not in self.wrapped:
                    text = _SHRINKERS.get(column, shorten_end)(text, cap)
                line.append(text)
            body.append(line)
        col_widths: list[int | None] = [
            self.caps.get(c) if c in self.wrapped else None for c in self.headers
        ]
        header_widths: list[int | None] | None = None
        if self.wrap_headers:
            header_widths = []
            for i, header in enumerate(self.headers):
                content = max((len(str(r[i])) for r in body), default=0)
                longest_word = max(len(w) for w in header.split()) if header.strip() else 1
                header_widths.append(max(content, longest_word))
        with _header_padding(0 if self.tight else None):
            return table(
                body,
                self.headers,
                fmt=fmt,
                maxcolwidths=col_widths if any(col_widths) else None,
                maxheadercolwidths=header_widths,
            )


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
    if width is None or len(text) <= width:
        return text
    return textwrap.fill(text, width, break_long_words=False, break_on_hyphens=False)


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
