"""A run copies its counts for :meth:`RunObserver.on_progress` only when an observer wants
them (issue 25, item 5: the copy, after every batch, was 2 % of a -w16 move's CPU): nobody
watching, a progress line that is not shown, or a --processes child between two reports."""

from __future__ import annotations

from typing import Any

from redrive.cli.console import Progress, ProgressDisplay
from redrive.runs.observer import NULL_OBSERVER, Callbacks, Observers, RunObserver


def test_who_wants_progress() -> None:
    assert RunObserver().wants_progress  # a subclass that hears it, by default
    assert not NULL_OBSERVER.wants_progress
    assert Callbacks(on_progress=lambda result: None).wants_progress
    assert not Callbacks(on_step=lambda step: None).wants_progress
    assert not Observers(NULL_OBSERVER, Callbacks()).wants_progress
    assert Observers(NULL_OBSERVER, Callbacks(on_progress=lambda result: None)).wants_progress


def test_a_progress_line_always_hears_progress() -> None:
    """Its Progress decides what is shown (and is where a second Ctrl-C's stand-in lands in
    tests/test_audit.py): a display not shown still hears every report."""

    def line(result: Any, progress: Progress) -> str:
        return str(result)

    assert ProgressDisplay(Progress("moving", enabled=False), line).wants_progress
    assert ProgressDisplay(Progress("moving", enabled=True), line).wants_progress
