"""glibc's malloc arenas: how many a process with many threads keeps.

glibc gives each thread that allocates while another holds an arena's lock an arena of its
own, up to 8 per core; ``--workers 16`` (16 threads, their second stages, the ledger's
writer, the hold renewer) then spreads a long run's garbage over 16 arenas that each keep
their own high-water mark. Two arenas held a ``-w16`` process at 100,000 messages to about
80 MB peak instead of 90-117 MB, with no CPU cost measured (bench/README.md, issues 17 and
25). ``MALLOC_ARENA_MAX`` set by the user wins; elsewhere than glibc nothing changes.
"""

from __future__ import annotations

import ctypes
import os
import sys

ARENAS = 2
"""Arenas a process (or a ``--processes`` child) with worker threads keeps."""

_M_ARENA_MAX = -8  # glibc's malloc.h
_bounded: list[bool] = []


def bound_arenas() -> bool:
    """Keep this process to :data:`ARENAS` malloc arenas from now on (arenas already made
    stay; threads started later share them). Once per process; False when nothing changed:
    the user set ``MALLOC_ARENA_MAX`` (already in force since the process started), or
    this is no glibc."""
    if _bounded:
        return _bounded[0]
    _bounded.append(False)
    if "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        # mallopt's parameter numbers are glibc's: musl has a mallopt that ignores them.
        if not hasattr(libc, "gnu_get_libc_version"):
            return False
        _bounded[0] = bool(libc.mallopt(_M_ARENA_MAX, ARENAS))
    except (OSError, AttributeError):
        return False
    return _bounded[0]


__all__ = ["ARENAS", "bound_arenas"]
