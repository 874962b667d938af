"""One run's life in the ledger (redrive.runs.lifecycle): its id, start, heartbeat and end,
as every operation records it; and the observer the operations report to."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from redrive.ledger import SqliteLedger
from redrive.runs.lifecycle import RunLifecycle, run_is_live
from redrive.runs.observer import Callbacks, NullObserver, Observers, PlanItem


class Crash(BaseException):
    """A simulated kill: nothing gets to record it."""


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[SqliteLedger]:
    with SqliteLedger(tmp_path / "l.sqlite3") as led:
        yield led


def lifecycle(ledger: SqliteLedger, **kw: object) -> RunLifecycle:
    return RunLifecycle(
        ledger,
        execute=True,
        command="redrive move checkout --execute",
        info={"target": "checkout"},
        counts=lambda: {"moved": 3},
        **kw,  # type: ignore[arg-type]
    )


def test_a_run_that_returns_is_completed_with_its_counts(ledger: SqliteLedger) -> None:
    with lifecycle(ledger, end_info=lambda: {"archive": None}) as life:
        assert life.run_id is not None and len(life.run_id) == 16
        run = ledger.run(life.run_id)
        assert run is not None and run.ended_at is None
        assert run_is_live(run, now=run.started_at)  # this process, still in it
        assert run.info is not None and run.info["target"] == "checkout"
        assert {"pid", "host"} <= set(run.info)
    run = ledger.run(life.run_id)
    assert run is not None and (run.outcome, run.counts) == ("completed", {"moved": 3})
    assert run.info is not None and run.info["archive"] is None
    assert not run_is_live(run, now=run.started_at)


def test_a_run_that_raises_is_failed(ledger: SqliteLedger) -> None:
    with pytest.raises(RuntimeError), lifecycle(ledger) as life:
        raise RuntimeError("boom")
    assert life.run_id is not None
    run = ledger.run(life.run_id)
    assert run is not None and run.outcome == "failed"


def test_a_run_stopped_or_interrupted_is_interrupted(ledger: SqliteLedger) -> None:
    stop = threading.Event()
    with lifecycle(ledger, stop=stop) as stopped:
        stop.set()
    with pytest.raises(KeyboardInterrupt), lifecycle(ledger) as aborted:
        raise KeyboardInterrupt
    for life in (stopped, aborted):
        assert life.run_id is not None
        run = ledger.run(life.run_id)
        assert run is not None and run.outcome == "interrupted"


def test_a_crashed_run_records_no_end_and_is_dead_at_once(ledger: SqliteLedger) -> None:
    with pytest.raises(Crash), lifecycle(ledger) as life:
        raise Crash
    assert life.run_id is not None
    run = ledger.run(life.run_id)
    assert run is not None and run.ended_at is None
    # Its pid is this process, which no longer runs it: its claims are in doubt.
    assert not run_is_live(run, now=run.started_at)


def test_an_end_recorded_by_the_run_itself_is_kept(ledger: SqliteLedger) -> None:
    with lifecycle(ledger) as life:
        life.end("interrupted")
    assert life.run_id is not None
    run = ledger.run(life.run_id)
    assert run is not None and run.outcome == "interrupted"


def test_a_dry_run_has_no_id_and_an_unledgered_one_records_nothing(
    ledger: SqliteLedger,
) -> None:
    with RunLifecycle(ledger, execute=False, command="move") as dry:
        pass
    with RunLifecycle(None, execute=True, command="archive") as archive:
        archive.heartbeat()
    assert dry.run_id is None and archive.run_id is not None
    assert ledger.runs(since=0) == []


def test_heartbeats_are_rate_limited_and_lease_ahead(ledger: SqliteLedger) -> None:
    with lifecycle(ledger, lease=60, clock=lambda: 1_000_000.0) as life:
        life.heartbeat()
        assert life.run_id is not None
        run = ledger.run(life.run_id)
        assert run is not None and run.lease_until == 1_000_060.0
        life.clock = lambda: 2_000_000.0
        life.heartbeat()  # within HEARTBEAT_EVERY of the last one: not written
        run = ledger.run(life.run_id)
        assert run is not None and run.lease_until == 1_000_060.0


def test_observers_hear_every_event_in_order() -> None:
    heard: list[object] = []
    item = PlanItem("m-1", "t", None, None, action="purge")
    both: Observers[int] = Observers(
        Callbacks(on_progress=heard.append, on_step=heard.append), NullObserver()
    )
    both.on_progress(7)
    both.on_step("claimed")
    both.on_plan(item)
    Callbacks[int](on_plan=heard.append, on_check=heard.append, on_problem=heard.append).on_plan(
        item
    )
    assert heard == [7, "claimed", item]
