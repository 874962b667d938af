"""Celery's ``saferepr`` (celery/utils/saferepr.py, BSD licence), ported for the values a JSON
task carries: what Celery writes in a protocol 2 message's ``argsrepr`` and ``kwargsrepr``
headers (``saferepr(args, 1024, maxlevels=3)``).

A repair writes an edited task's reprs as Celery would have, and only when the message's own
reprs are Celery's (a producer may pass its own ``argsrepr`` to hide a secret: that one is
kept). Celery is an optional dependency of redrive, so the port is here;
``tests/test_repair_encode.py`` checks it against Celery's own on random JSON values.

It differs from :func:`repr`: strings are always in single quotes with only ``'`` escaped,
long text is cut at a space with ``...``, and containers deeper than ``maxlevels`` are
``[...]``/``{...}``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from numbers import Number
from typing import Any, Final

__all__ = ["REPR_MAXLEVELS", "REPR_MAXSIZE", "saferepr"]

#: Celery's ``argsrepr_maxsize``/``kwargsrepr_maxsize`` and ``task_repr_maxlevels`` defaults.
REPR_MAXSIZE: Final = 1024
REPR_MAXLEVELS: Final = 3


@dataclass(frozen=True, slots=True)
class _Literal:
    value: str
    truncate: bool
    direction: int


@dataclass(frozen=True, slots=True)
class _Key:
    value: Any


@dataclass(frozen=True, slots=True)
class _Quoted:
    value: str


@dataclass(frozen=True, slots=True)
class _Done:
    """The end of a container (Celery's ``_dirty``, whose recursion guard a JSON tree,
    which holds no container inside itself, never needs)."""


_DICT_START: Final = _Literal("{", False, +1)
_DICT_KVSEP: Final = _Literal(": ", True, 0)
_DICT_END: Final = _Literal("}", False, -1)
_LIST_START: Final = _Literal("[", False, +1)
_LIST_END: Final = _Literal("]", False, -1)
_LIST_SEP: Final = _Literal(", ", True, 0)
_TUPLE_START: Final = _Literal("(", False, +1)
_TUPLE_END: Final = _Literal(")", False, -1)
_TUPLE_END_SV: Final = _Literal(",)", False, -1)
_DONE: Final = _Done()


def saferepr(value: Any, maxlen: int | None = REPR_MAXSIZE, maxlevels: int = REPR_MAXLEVELS) -> str:
    return "".join(_saferepr(value, maxlen, maxlevels))


def _truncate(text: str, maxlen: int | None) -> str:
    # celery.utils.text.truncate
    if maxlen and len(text) >= maxlen:
        return text[:maxlen].rsplit(" ", 1)[0] + "..."
    return text


def _chaindict(mapping: dict[Any, Any]) -> Iterator[Any]:
    size = len(mapping)
    for i, (key, item) in enumerate(mapping.items()):
        yield _Key(key)
        yield _DICT_KVSEP
        yield item
        if i < size - 1:
            yield _LIST_SEP


def _chainlist(items: list[Any] | tuple[Any, ...]) -> Iterator[Any]:
    size = len(items)
    for i, item in enumerate(items):
        yield item
        if i < size - 1:
            yield _LIST_SEP


def _saferepr(value: Any, maxlen: int | None, maxlevels: int) -> Iterator[str]:
    stack: deque[Iterator[Any]] = deque([iter([value])])
    for token, rest in _reprstream(stack, maxlevels):
        if maxlen is not None and maxlen <= 0:
            if isinstance(token, _Literal) and token.direction < 0:
                # The value cut was the last of its container: nothing is left out.
                yield token.value
                continue
            yield ", ..."
            stack.append(chain([token], rest))
            break
        if isinstance(token, _Literal):
            text = token.value
        elif isinstance(token, _Key):
            text = saferepr(token.value, maxlen, maxlevels)
        elif isinstance(token, _Quoted):
            text = "'{}'".format(_truncate(token.value, maxlen).replace("'", "\\'"))
        else:
            text = _truncate(token, maxlen)
        yield text
        if maxlen is not None:
            maxlen -= len(text)
    depth = 0
    for rest1 in stack:
        # Past maxlen: close what was opened before it.
        for rest2 in rest1:
            if isinstance(rest2, _Literal) and not rest2.truncate:
                depth += rest2.direction
                if depth < 0:
                    depth = 0
                    yield rest2.value


def _reprstream(stack: deque[Iterator[Any]], maxlevels: int) -> Iterator[tuple[Any, Any]]:
    level = 0
    while stack:
        rest = stack.popleft()
        for item in rest:
            if isinstance(item, _Done):
                continue
            if isinstance(item, _Literal):
                level += item.direction
                yield item, rest
            elif isinstance(item, _Key):
                yield item, rest
            elif isinstance(item, Number):
                yield str(item), rest
            elif isinstance(item, str):
                yield _Quoted(item), rest
            else:
                opened = _opened(item)
                if opened is None:
                    yield repr(item), rest
                    continue
                start, end, items = opened
                if maxlevels and level >= maxlevels:
                    yield _Literal(f"{start.value}...{end.value}", False, 0), rest
                    continue
                stack.append(chain([start], items, [_DONE, end], rest))
                break


def _opened(item: Any) -> tuple[_Literal, _Literal, Iterator[Any]] | None:
    if isinstance(item, tuple):
        return _TUPLE_START, _TUPLE_END_SV if len(item) == 1 else _TUPLE_END, _chainlist(item)
    if isinstance(item, dict):
        return _DICT_START, _DICT_END, _chaindict(item)
    if isinstance(item, list):
        return _LIST_START, _LIST_END, _chainlist(item)
    return None
