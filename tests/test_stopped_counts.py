"""The counts of a run that stopped partway add up (issue 37, point 8): the totals are the sum
of the rows, every matched message is moved, a duplicate, failed or skipped under a reason
(in doubt counted as such), and what the run never reached is said."""

from __future__ import annotations

import sqlite3
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import Family, MotoServer, make_family
from kill_points import At, KillPoints
from test_e2e import start_redrive
from test_move import TASK, body, move, put
from test_processes_e2e import MOVE, finished_with_a_killed_child, seed_dlq, tasks

from redrive import attributes
from redrive.broker.memory import MemoryBroker, MemoryStore, forget_store, memory_store
from redrive.broker.memory.store import Stored
from redrive.config import Layout
from redrive.errors import BrokerUnavailable
from redrive.ledger import SqliteLedger
from redrive.operations.move import MoveEngine, MoveOptions, MoveResult
from redrive.operations.verdict import IN_DOUBT
from redrive.render.move import move_text
from redrive.runs.observer import NULL_OBSERVER, Callbacks, RunObserver
from redrive.sandbox.encoder import encode

# The ``distant`` fixture (fast_sqs answering after 20 ms) of the --processes tests.
from test_processes_e2e import distant  # noqa: F401  # isort: skip


def adds_up(data: dict[str, Any]) -> None:
    """A summary's JSON: the totals are the rows' sums, and each matched message has one
    fate."""
    rows = data["tasks"].values()
    assert data["matched"] == sum(r["matched"] for r in rows), data
    assert data["moved"] == sum(r["moved"] for r in rows), data
    by_reason: Counter[str] = Counter()
    for row in rows:
        by_reason.update(row["skipped"])
        done = row["moved"] + row["failed"] + row["duplicates_deleted"]
        assert row["matched"] == done + sum(row["skipped"].values()), row
    assert dict(+by_reason) == {k: v for k, v in data["skipped_by_reason"].items() if v}, data
    duplicates = data["duplicates_deleted"] + data.get("duplicates_to_delete", 0)
    fates = data["moved"] + data["failed"] + duplicates + data["skipped"]
    assert data["matched"] == fates, data
    assert data["in_doubt"] == by_reason[IN_DOUBT] + by_reason["in-doubt-lease-live"], data


def claimed_keys(ledger: Path, run_prefix: str) -> int:
    with sqlite3.connect(ledger) as conn:
        [(n,)] = conn.execute(
            "SELECT count(*) FROM keys WHERE state = 'claimed' AND run_id LIKE ?",
            (f"{run_prefix}%",),
        )
    return int(n)


def failing_at(step: str, nth: int) -> Callable[[str], None]:
    """An error (the broker gone) at the ``nth`` time the run reaches ``step``."""
    seen: Counter[str] = Counter()

    def hook(name: str) -> None:
        seen[name] += 1
        if name == step and seen[name] == nth:
            raise BrokerUnavailable(f"the broker went away at {step}")

    return hook


@pytest.mark.parametrize("pipelined", [True, False], ids=["two-stage", "one-stage"])
@pytest.mark.parametrize("step", ["claimed", "sent"])
def test_a_run_an_error_stops_mid_batch_counts_the_batch(
    family: Family, tmp_path: Path, step: str, pipelined: bool
) -> None:
    """Claimed (or sent, unrecorded) when the broker went away: the batch was counted as
    matched and nothing else, its claims in doubt in the ledger but not in the summary."""
    put(family.client, family.dlq_url, [body(f"t-{i}") for i in range(25)])
    ledger = tmp_path / "l.sqlite3"
    with pytest.raises(BrokerUnavailable) as caught:
        move(family.client, ledger, fault=failing_at(step, 2), pipelined=pipelined)
    partial = caught.value.partial
    assert isinstance(partial, MoveResult)
    assert partial.matched > partial.moved >= 10
    data = partial.to_json()
    adds_up(data)
    assert partial.in_doubt == claimed_keys(ledger, partial.run_id or "") > 0
    assert partial.own_in_doubt == partial.in_doubt
    assert "when this run stopped (as said below)" in move_text(partial)
    stopped = partial.skipped["not-sent-run-stopped"]
    assert partial.moved + partial.in_doubt + stopped == partial.matched


def test_an_interrupted_processes_run_counts_every_message_once(
    distant: MotoServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A child SIGKILLed mid-send: its last report matched what the ledger holds nothing of
    (poison, skipped), so the totals exceeded the rows ("800 matched" while the rows summed
    to 700). Now the rows add up, in doubt is the ledger's claims, and the messages never
    scanned are said."""
    checkout = make_family(distant.client(), "onion-checkout")
    dead = tasks(600, seed=41)
    poison = {attributes.COUNT: {"DataType": "Number", "StringValue": "3"}}
    for i in range(0, len(dead), 2):  # every other message redriven to death already
        dead[i] = replace(dead[i], attributes={**dead[i].attributes, **poison})
    seed_dlq(checkout, dead)
    ledger = tmp_path / "l.sqlite3"
    points = KillPoints(tmp_path / "kill", At("move.claimed", nth=4))
    args = ("--ledger", str(ledger), "--processes", "2", "--workers", "2", "--lease", "3")
    parent = start_redrive(distant, *MOVE, *args, out=tmp_path / "k", points=points)
    report, died = finished_with_a_killed_child(parent, tmp_path / "k", points)
    adds_up(report)
    assert report["in_doubt"] == claimed_keys(ledger, report["run_id"]) > 0
    # What the run never reached (nor a dead process reported) is said, not left out.
    assert 0 < report.get("not_scanned", 0) <= 600 - report["scanned"]
    assert died["in_doubt"] > 0


def test_what_a_dead_child_reported_beyond_the_ledger_is_a_row_of_its_own(
    tmp_path: Path,
) -> None:
    """Its last report matched 9 (4 of them poison, skipped); the ledger holds 3 sent and 2
    claimed. The totals said 9 matched while the rows summed to 5."""
    from test_processes import key_for

    from redrive.cli.processes import processes_text
    from redrive.ledger import Claim, SqliteLedger
    from redrive.messages import decode
    from redrive.operations.move import processes as move_processes
    from redrive.render.move import move_text
    from redrive.runs import processes
    from redrive.runs.processes import ChildStatus, ProcessesResult
    from redrive.sandbox.encoder import encode

    claims = []
    for i in range(5):
        info = decode(encode("apps.a.capture", [], {}, task_id=f"id-{i}"))
        key = key_for(info, message_id=f"m-{i}", generation=0, body="", namespace="sqs")
        claims.append(Claim(key, "apps.a.capture", f"m-{i}", "https://sqs/1/onion-checkout"))
    ledger = SqliteLedger(tmp_path / "l.sqlite3")
    try:
        ledger.start_run("p.1", command="move", info={})
        ledger.claim_many("p.1", claims)
        ledger.mark_sent_many("p.1", {c.key: f"s-{c.key}" for c in claims[:3]})
        status = ChildStatus(1, "p.1", 4242, "died", -9)
        result = MoveResult(
            dry_run=False, target="checkout", dlq="dlq", run_id="p", depth_before=30
        )
        move_processes._add_left(result, (10, 9, 3, 30), status, processes.left_by(ledger, status))
    finally:
        ledger.close()
    result.cut_short = True
    data = result.to_json()
    adds_up(data)
    assert (data["matched"], data["moved"], data["in_doubt"]) == (9, 3, 2)
    assert data["skipped_by_reason"]["not-recorded-process-died"] == 4
    assert data["not_scanned"] == 20
    text = processes_text(ProcessesResult(result, 2, [status]), move_text(result))
    assert "4 message(s) matched by a process that died before it reported" in text, text
    assert "it sent none of them" in text
    assert "about 20 message(s) of the DLQ not scanned" in text


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    name = f"twice-{uuid.uuid4().hex[:8]}"
    made = memory_store(name)
    made.create_queue("onion-dlq")
    made.create_queue("onion", dead_letter_queue="onion-dlq", max_receive_count=3)
    yield made
    forget_store(name)


def move_twice(
    store: MemoryStore,
    ledger: SqliteLedger,
    *,
    pad: int = 0,
    observer: RunObserver[MoveResult] = NULL_OBSERVER,
    **options: Any,
) -> MoveEngine:
    """A move of 4 tasks twice over (8 copies, one batch; each body ``pad`` bytes longer):
    the second copy of each follows the first, counted once the first one's fate is known."""
    bodies = [encode(TASK, [f"f-{i}"], {"pad": "x" * pad}, task_id=f"f-{i}") for i in range(4)]
    with store.lock:  # straight into the DLQ: a body too long for a send gets there too
        dlq = store.queue("onion-dlq")
        for text in bodies * 2:
            store.enqueue(dlq, Stored(store.new_id(), text, {}, store.wall()))
    broker = MemoryBroker(store)
    target = broker.resolve(Layout((), "test"), "onion-dlq", lambda region: broker)
    return MoveEngine(
        target,
        ledger,
        MoveOptions(execute=True, **options),
        broker_factory=lambda: MemoryBroker(store),
        observer=observer,
    )


@pytest.mark.parametrize("pipelined", [True, False], ids=["two-stage", "one-stage"])
@pytest.mark.parametrize("step", ["claimed", "sent", "recorded"])
def test_the_further_copies_of_a_key_in_the_batch_a_run_stopped_in_are_counted(
    store: MemoryStore, tmp_path: Path, step: str, pipelined: bool
) -> None:
    """A run stopped in the batch counted the first copies and never their followers: it
    received 8 messages and its counts said 4."""
    with SqliteLedger(tmp_path / "l.sqlite3") as ledger:
        stopping = Callbacks[MoveResult](on_step=failing_at(step, 1))
        engine = move_twice(store, ledger, pipelined=pipelined, observer=stopping)
        with pytest.raises(BrokerUnavailable) as caught:
            engine.run()
    partial = caught.value.partial
    assert isinstance(partial, MoveResult)
    adds_up(partial.to_json())
    assert partial.scanned == partial.matched == 8, partial
    stopped = partial.skipped["not-sent-run-stopped"]
    assert partial.moved + partial.in_doubt + stopped == 8, partial
    # Each follower's fate is its key's: in doubt with it, or left (not sent) beside a
    # first copy the run recorded sent.
    if step == "recorded":
        assert (partial.moved, stopped, partial.in_doubt) == (4, 4, 0), partial
    else:
        assert partial.in_doubt == partial.own_in_doubt == 8, partial


def test_the_further_copies_of_a_refused_send_fail_with_it(
    store: MemoryStore, tmp_path: Path
) -> None:
    """Bodies over the broker's largest message: the first copies failed and their followers
    were counted nowhere (8 received, 4 counted)."""
    with SqliteLedger(tmp_path / "l.sqlite3") as ledger:
        result = move_twice(store, ledger, pad=300_000, pipelined=False).run()
    adds_up(result.to_json())
    assert (result.scanned, result.matched, result.failed, result.moved) == (8, 8, 8, 0)
    assert all(m.detail.startswith("MessageTooLong") for m in result.failed_messages)


def test_the_further_copies_of_an_unconfirmed_send_are_in_doubt_with_it(
    store: MemoryStore, tmp_path: Path
) -> None:
    """No confirm came for the first copies (in doubt, this run's own); their followers were
    counted nowhere (8 received, 4 counted)."""
    store.lost_confirms.update(str(i) for i in range(8))
    with SqliteLedger(tmp_path / "l.sqlite3") as ledger:
        result = move_twice(store, ledger, pipelined=False).run()
    adds_up(result.to_json())
    assert (result.scanned, result.matched, result.moved) == (8, 8, 0), result
    assert result.in_doubt == result.own_in_doubt == 8, result
