"""Durations and instants as people type and read them: ``90m``, ``5h 3m``, ISO 8601 UTC."""

from __future__ import annotations

import re
from datetime import UTC, datetime

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
