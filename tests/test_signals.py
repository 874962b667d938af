"""redrive.signals: handlers swapped for a block are put back, whenever a Ctrl-C lands.

Under load a test worker once ran with SIGINT ignored: the swap of SIGINT and SIGTERM was one
dict comprehension, and a KeyboardInterrupt raised after SIGINT was swapped and before the
``try`` left SIGINT ignored for good (``--processes`` ignores both while it spawns).
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from redrive.signals import handlers_while

real_signal = signal.signal


def ctrl_c_between_the_swaps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Ctrl-C lands as SIGTERM is about to be swapped, SIGINT already swapped."""

    def swap(number: int, handler: Any) -> Any:
        if number == signal.SIGTERM and handler is signal.SIG_IGN:
            raise KeyboardInterrupt
        return real_signal(number, handler)

    monkeypatch.setattr(signal, "signal", swap)


def test_a_ctrl_c_between_two_swaps_puts_the_first_back(monkeypatch: pytest.MonkeyPatch) -> None:
    before = signal.getsignal(signal.SIGINT)
    ctrl_c_between_the_swaps(monkeypatch)
    with (
        pytest.raises(KeyboardInterrupt),
        handlers_while(signal.SIG_IGN, (signal.SIGINT, signal.SIGTERM)),
    ):
        pass
    assert signal.getsignal(signal.SIGINT) is before


def test_the_processes_spawn_guard_puts_sigint_back_after_a_ctrl_c(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from redrive.runs import processes

    before = signal.getsignal(signal.SIGINT)
    ctrl_c_between_the_swaps(monkeypatch)
    with pytest.raises(KeyboardInterrupt), processes._signals_ignored():
        pass
    assert signal.getsignal(signal.SIGINT) is before


def test_handlers_are_swapped_inside_and_put_back_after() -> None:
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    with handlers_while(signal.SIG_IGN, (signal.SIGINT, signal.SIGTERM)):
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
