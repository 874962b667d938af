"""What the user's code writes goes to stderr: redrive's stdout holds only redrive's results.

An app module that prints on import, a router or a result backend that prints when called:
their lines must never land in the middle of a ``--json`` document. While a thread runs the
user's code (:func:`users_code`: loading the app, reading its settings and tasks, building
and reading its result backend, calling its router), what that thread writes to
``sys.stdout`` goes to ``sys.stderr``; what any other thread writes (redrive's own results)
still goes to stdout. On the main thread, file descriptor 1 is stderr's as well for the
while, so a subprocess or a C extension writing to fd 1 directly is kept off stdout too;
other threads cannot borrow fd 1 (it is the whole process's), so there only ``sys.stdout``
is redirected (redrive writes its results from the main thread, never while it runs the
user's code there). A ``--processes`` child loads the app through the same calls, so the same
holds in each child (spawned, it starts with no redirection of its own to undo).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any, TextIO

_lock = threading.Lock()
_inside = threading.local()
_router: _Router | None = None
_threads = 0
"""How many threads are inside :func:`users_code` (the router stays while any is)."""


class _Router:
    """``sys.stdout`` while some thread runs the user's code: that thread's writes go to
    stderr, every other thread's to the stdout it replaced. Once it is no longer
    ``sys.stdout``, whoever still writes to it kept it from the user's code (a logging
    handler made at import, say): that goes to stderr too."""

    ours: TextIO

    def __init__(self, ours: TextIO) -> None:
        self.ours = ours

    def _target(self) -> TextIO:
        ours = sys.stdout is self and not getattr(_inside, "depth", 0)
        target: TextIO = self.ours if ours else sys.stderr
        return target

    def write(self, text: str) -> int:
        return self._target().write(text)

    def writelines(self, lines: Any) -> None:
        self._target().writelines(lines)

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name: str) -> Any:
        # encoding, isatty, fileno, buffer...: those of where this thread's writes go.
        return getattr(self._target(), name)


@contextlib.contextmanager
def users_code() -> Iterator[None]:
    """Run the user's code with its output on stderr (see the module's docstring)."""
    depth = getattr(_inside, "depth", 0)
    if depth:
        _inside.depth = depth + 1
        try:
            yield
        finally:
            _inside.depth = depth
        return
    _enter()
    saved_fd = _borrow_fd1() if threading.current_thread() is threading.main_thread() else None
    _inside.depth = 1
    try:
        yield
    finally:
        _inside.depth = 0
        if saved_fd is not None:
            _give_back_fd1(saved_fd)
        _leave()


def _enter() -> None:
    global _router, _threads
    with _lock:
        if _threads == 0 and sys.stdout is not None:
            _router = _Router(sys.stdout)
            sys.stdout = _router
        _threads += 1


def _leave() -> None:
    global _router, _threads
    with _lock:
        _threads -= 1
        if _threads == 0 and _router is not None:
            sys.stdout = _router.ours
            _router = None


def _borrow_fd1() -> int | None:
    """Point fd 1 at stderr; the duplicate of the real stdout to restore it from (None when
    there is no fd 1 or 2 to work with)."""
    _flush(_router.ours if _router is not None else None)
    _flush(sys.__stdout__)
    try:
        saved = os.dup(1)
    except OSError:
        return None
    try:
        os.dup2(2, 1)
    except OSError:
        os.close(saved)
        return None
    return saved


def _give_back_fd1(saved: int) -> None:
    # What the user's code left in a buffer bound for fd 1 goes out while it is stderr's.
    _flush(sys.__stdout__)
    _flush_c_stdio()
    try:
        os.dup2(saved, 1)
    finally:
        os.close(saved)


def _flush(stream: Any) -> None:
    with contextlib.suppress(Exception):
        if stream is not None:
            stream.flush()


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL(None)


def _flush_c_stdio() -> None:
    """C's stdout buffer (a C extension's printf) goes out now, while fd 1 is stderr's, not
    at exit, when fd 1 is the real stdout again."""
    with contextlib.suppress(Exception):
        _libc().fflush(None)
