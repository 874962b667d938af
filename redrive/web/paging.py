"""The DLQ page's message list, a page at a time: of the whole DLQ, or of the groups a
``task`` filter picks, read from the scan's spool (:mod:`redrive.web.spool`), never from a
new read of the broker. A page's links to the next and previous ones keep the filters."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from redrive.errors import UsageProblem
from redrive.web.filters import DlqFilters, Query
from redrive.web.samples import public_record
from redrive.web.scans import ScanOutcome

PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_PAGE = 1_000_000


@dataclass(frozen=True, slots=True)
class PageAsk:
    """Which page (from 1) of how many messages."""

    number: int = 1
    size: int = PAGE_SIZE


def _number(query: Query, key: str, default: int, most: int) -> int:
    values = query.getlist(key)
    if not values or not values[0].strip():
        return default
    try:
        value = int(values[0])
    except ValueError:
        raise UsageProblem(f"{key}: a whole number, not {values[0]!r}") from None
    if not 1 <= value <= most:
        raise UsageProblem(f"{key}: from 1 to {most:,}, not {value:,}")
    return value


def page_of(query: Query) -> PageAsk:
    """The page a query string asks for (``page``, ``per_page``); a bad one is a
    UsageProblem (400)."""
    return PageAsk(
        _number(query, "page", 1, MAX_PAGE), _number(query, "per_page", PAGE_SIZE, MAX_PAGE_SIZE)
    )


def _link(filters: DlqFilters, ask: PageAsk, number: int) -> str:
    pairs = [*filters.pairs(), ("page", str(number))]
    if ask.size != PAGE_SIZE:
        pairs.append(("per_page", str(ask.size)))
    return "?" + urlencode(pairs)


def messages_page(outcome: ScanOutcome, filters: DlqFilters, ask: PageAsk) -> dict[str, Any]:
    """The page's messages (records, arguments withheld) and where it is among the others:
    ``previous`` and ``next`` are query strings (None: no such page)."""
    offset = (ask.number - 1) * ask.size
    spool = outcome.spool
    if spool is not None:
        labels = None if not filters.tasks else [g for g in spool.counts if filters.selects(g)]
        total = spool.selected(labels)
        messages = spool.page(labels, offset, ask.size) if offset < total else []
    else:
        # No spool (a scan not made by the console's scans): the records kept in memory.
        kept = [public_record(r) for r in outcome.records.values()]
        chosen = [r for r in kept if filters.selects(r.get("group"))]
        total, messages = len(chosen), chosen[offset : offset + ask.size]
    pages = math.ceil(total / ask.size)
    return {
        "messages": messages,
        "paging": {
            "page": ask.number,
            "per_page": ask.size,
            "pages": pages,
            "total": total,
            "first": offset + 1 if messages else None,
            "previous": (
                _link(filters, ask, max(1, min(ask.number - 1, pages))) if ask.number > 1 else None
            ),
            "next": _link(filters, ask, ask.number + 1) if ask.number < pages else None,
        },
    }
