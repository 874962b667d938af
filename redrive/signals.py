"""Signal handlers swapped for a block and always put back, a Ctrl-C at any moment included."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator, Sequence
from typing import Any


@contextlib.contextmanager
def handlers_while(handler: Any, signals: Sequence[int]) -> Iterator[None]:
    """``handler`` for each of ``signals`` inside the block; the old ones after it.

    Each old handler is recorded before its signal is swapped, inside the ``try``: a Ctrl-C
    that lands between two swaps (a KeyboardInterrupt raised there) still puts back what was
    swapped. A dict built by swapping every signal at once lost them all then, and the
    process went on with SIGINT ignored.
    """
    previous: dict[int, Any] = {}
    try:
        for number in signals:
            previous[number] = signal.getsignal(number)
            signal.signal(number, handler)
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)
