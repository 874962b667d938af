"""Issue 37, points 3 and 4: what a killed run leaves in doubt, and what the rerun says of it.

A run claims a send batch just before it goes (after ``--rate``'s wait), so a kill leaves in
doubt at most the batch being sent per worker, never a received batch still waiting on the
rate (in-process moto: a simulated kill at a step; RabbitMQ: the real ``redrive`` SIGKILLed
at a kill point, four workers and a rate)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from conftest import Family
from kill_points import At, KillPoints
from test_move import Crash, body, crash_at, keys_in, move, put
from test_rabbitmq_e2e import _states, drain, killed, task_ids

from redrive.ledger import KeyState
from redrive.sandbox.rabbitmq_layout import fill_layout, rabbit_families
from redrive.sandbox.rabbitmq_node import Vhost


def test_a_rate_claims_each_slice_just_before_it_goes(family: Family, tmp_path: Path) -> None:
    """A batch of 10 at --rate 5 goes as two sends of 5: a kill after the first claim leaves
    those 5 claimed (in doubt), the other 5 unclaimed (they were waiting on the rate)."""
    put(family.client, family.dlq_url, [body(f"t-{i}") for i in range(10)])
    ledger = tmp_path / "l.sqlite3"

    with pytest.raises(Crash):
        move(family.client, ledger, rate=5.0, fault=crash_at("claimed", 1))

    states = Counter(state for state, _, _ in keys_in(ledger).values())
    assert states == Counter({KeyState.CLAIMED: 5}), states


def test_a_rate_sends_everything_a_slice_at_a_time(family: Family, tmp_path: Path) -> None:
    """A whole run at --rate 5 moves every message, each once, a slice of 5 at a time: the
    received batches of 10 and 2 go as three claims and three sends."""
    put(family.client, family.dlq_url, [body(f"t-{i}") for i in range(12)])
    ledger = tmp_path / "l.sqlite3"
    steps: Counter[str] = Counter()

    result = move(family.client, ledger, rate=5.0, fault=lambda step: steps.update([step]))

    assert (result.moved, result.in_doubt, result.failed) == (12, 0, 0)
    assert Counter(state for state, _, _ in keys_in(ledger).values()) == Counter(
        {KeyState.DONE: 12}
    )
    assert steps["claimed"] == steps["sent"] == steps["recorded"] == 3, steps


@pytest.mark.e2e
def test_a_sigkill_at_a_rate_leaves_at_most_one_send_batch_per_worker(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    """Four workers each receive 100 at --rate 50: the run killed once the first send is
    confirmed (before it is recorded) leaves in doubt that send's 50 and at most one send
    batch of each other worker, never the 100 each worker received and waits to send."""
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families()[:1], 400)
    ledger = tmp_path / "ledger.sqlite3"
    args = ["move", "checkout", "--execute", "--yes", "--json", "--ledger", str(ledger)]
    points = KillPoints(tmp_path / "kill", At("move.sent"))
    killed(rabbitmq_vhost, points, *args, "--workers", "4", "--rate", "50", "--lease", "2")

    states = _states(ledger)
    assert 50 <= states["claimed"] <= 4 * 50, states
    sent = task_ids(drain(rabbitmq_vhost, "onion-checkout"))
    assert max(sent.values()) == 1 and sum(sent.values()) <= states["claimed"], (sent, states)
    assert sum(task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq")).values()) == 400
