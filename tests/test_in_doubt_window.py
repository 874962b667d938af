"""Issue 37, points 3 and 4: what a killed run leaves in doubt, and what the rerun says of it.

A run claims a send batch just before it goes (after ``--rate``'s wait), so a kill leaves in
doubt at most the batch being sent per worker, never a received batch still waiting on the
rate (in-process moto: a simulated kill at a step; RabbitMQ: the real ``redrive`` SIGKILLed
at a kill point, four workers and a rate)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from celery import Celery
from conftest import Cli, Family, SqsClock, as_json, wait_until
from kill_points import At, KillPoints
from test_move import LEASE, Crash, arrived, body, crash_at, failing_sends, keys_in, move, put
from test_rabbitmq_e2e import _states, drain, killed, ok_json, redrive, task_ids

from redrive.broker.sqs import SqsBroker
from redrive.keys import task_id_of_key
from redrive.ledger import KeyState, RunInfo, SqliteLedger
from redrive.render.move import move_text
from redrive.runs.lifecycle import run_is_live
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
    assert max(sent.values()) == 1, sent
    assert sum(sent.values()) <= states["claimed"] + states["sent"] + states["done"], states
    left = task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq"))
    assert sum(left.values()) + states["done"] == 400, (left, states)


# -- point 3: a rerun right after a kill ---------------------------------------------------


def test_a_killed_process_its_parent_has_not_reaped_is_dead(tmp_path: Path) -> None:
    """A SIGKILLed run whose parent has not reaped it yet (a zombie) still answers signal 0,
    but sends nothing more: its claims are in doubt, not a live run's (which a rerun skipped
    as claimed-by-another-run, exit 0)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child.send_signal(signal.SIGKILL)
        stat = Path(f"/proc/{child.pid}/stat")
        deadline = time.monotonic() + 30
        while stat.read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child never died"
            time.sleep(0.01)
        now = time.time()
        run = RunInfo(
            "r1",
            "move",
            started_at=now - 1,
            heartbeat_at=now,
            lease_until=now + 600,
            ended_at=None,
            outcome=None,
            info={"host": socket.gethostname(), "pid": child.pid},
            counts={},
        )
        assert not run_is_live(run, now)
    finally:
        child.wait()


def test_a_rerun_inside_a_stopped_runs_lease_says_so_and_needs_attention(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    """SQS: the run killed after its first claim keeps its batch hidden for its lease; a rerun
    at once moves the rest, and says the DLQ is not drained: the stopped run, when its lease
    ends (rerun then), exit 3 (needs attention), not "moved" and exit 0."""
    put(family.client, family.dlq_url, [body(f"t-{i}") for i in range(25)])
    ledger = tmp_path / "l.sqlite3"
    with pytest.raises(Crash):
        move(family.client, ledger, lease=600, fault=crash_at("claimed", 1), pipelined=False)
    led = SqliteLedger(ledger)
    try:
        (dead,) = [r.run_id for r in led.runs()]
    finally:
        led.close()

    rerun = move(family.client, ledger)

    assert (rerun.moved, rerun.in_doubt, rerun.still_hidden) == (15, 0, 10)
    assert list(rerun.stopped_leases) == [dead]
    assert rerun.needs_attention
    text = move_text(rerun)
    assert f"held by run {dead}, which stopped without ending" in text, text
    assert "rerun then" in text and "received by another run or consumer" not in text
    assert rerun.to_json()["rerun_at"] is not None
    again = cli("move", "checkout", "--execute", "--yes", "--ledger", str(ledger))
    assert again.exit_code == 3, again.output
    assert f"held by run {dead}, which stopped without ending" in again.output


def test_in_doubt_left_by_this_runs_unconfirmed_sends_is_not_blamed_on_an_earlier_run(
    family: Family, tmp_path: Path
) -> None:
    """A send the broker never confirmed (its answer lost, as to a broker restart) is this
    run's: the summary says so, not "when an earlier run stopped"."""
    ids = [f"t-{i}" for i in range(12)]
    put(family.client, family.dlq_url, [body(t) for t in ids])
    proxy = failing_sends(family.client, set(), unanswered={"t-3"})

    first = move(
        family.client,
        tmp_path / "l.sqlite3",
        sqs=lambda: SqsBroker(family.client, send_client=proxy),
    )

    assert (first.in_doubt, first.own_in_doubt) == (1, 1)
    text = move_text(first)
    assert "the broker stopped answering this run" in text, text
    assert "earlier run" not in text, text


def _zombie(process: subprocess.Popen[str]) -> None:
    """Wait until ``process`` has died and is not reaped (its parent, this test, has not
    waited for it): what a script that kills a run and reruns at once leaves."""
    stat = Path(f"/proc/{process.pid}/stat")
    wait_until(lambda: stat.read_text().rpartition(")")[2].split()[0] == "Z", "a zombie")


@pytest.mark.e2e
def test_a_rerun_right_after_a_sigkill_holds_the_killed_runs_claims_in_doubt_exit_3(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    """The issue's story: `move --rate 30` SIGKILLed, rerun at once (the killed process not
    yet reaped). The rerun skipped its claims as claimed-by-another-run and exited 0; they
    are the killed run's, in doubt: exit 3. With claims made a slice at a time, they are
    the 30 of the one slice being sent, not the 100 received."""
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families()[:1], 100)
    ledger = tmp_path / "ledger.sqlite3"
    args = ["move", "checkout", "--execute", "--yes", "--json", "--ledger", str(ledger)]
    points = KillPoints(tmp_path / "kill", At("move.claimed"))
    victim = subprocess.Popen(
        points.argv(
            "--broker",
            rabbitmq_vhost.amqp_url,
            "--rabbitmq-api",
            rabbitmq_vhost.api_url,
            *args,
            "--rate",
            "30",
            "--lease",
            "600",
        ),
        env=points.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        points.wait_for_note()
        _zombie(victim)

        rerun = ok_json(redrive(rabbitmq_vhost, *args), 3)
    finally:
        if victim.poll() is None:
            victim.kill()
        victim.wait(30)
    assert (rerun["moved"], rerun["in_doubt"]) == (70, 30), rerun
    assert rerun["skipped_by_reason"] == {"in-doubt": 30}, rerun
    assert list(rerun["stopped_runs"]) and rerun["rerun_at"], rerun


# -- point 4: resolving in-doubt keys one by one ---------------------------------------------

HOUR_AGO = 3600.0


def _claims_an_hour_ago(family: Family, ledger: Path, sqs_clock: SqsClock) -> None:
    """Ten tasks sent to the queue and killed before the ledger recorded the send (an hour
    ago: the claims and the run's lease are that old), so all ten are in doubt, and back
    in the DLQ (SQS's clock wound past the killed run's hold)."""
    put(family.client, family.dlq_url, [body(f"t-{i}") for i in range(10)])
    then = lambda: time.time() - HOUR_AGO  # noqa: E731
    with pytest.raises(Crash):
        move(family.client, ledger, now=then, ledger_clock=then, fault=crash_at("sent", 1))
    sqs_clock.advance(LEASE + 120)
    assert family.depth() == (10, 0)


def _backend(tmp_path: Path, succeeded: Sequence[str]) -> str:
    """Celery's database backend on SQLite, with SUCCESS records (dated now) for ``succeeded``."""
    url = f"db+sqlite:///{tmp_path}/results.sqlite"
    app = Celery("resolve-test", backend=url)
    try:
        for task_id in succeeded:
            app.backend.store_result(task_id, {"ok": True}, "SUCCESS")
    finally:
        app.backend.ResultSession().get_bind().dispose()
    return url


def _states_by_task(ledger: Path) -> dict[str, KeyState]:
    return {task_id_of_key(k) or k: v[0] for k, v in keys_in(ledger).items()}


def test_resolve_shows_the_evidence_and_acts_only_on_proof_or_the_operators_choice(
    family: Family, tmp_path: Path, cli: Cli, sqs_clock: SqsClock
) -> None:
    """Two tasks the result backend records as run after the claim are recorded as sent
    (the next move deletes their DLQ copies); the rest have no record, which proves nothing:
    left to the operator, who names one to skip and one to resend. The dry run changes
    nothing; no target queue is read (its copies stay visible, none received)."""
    ledger = tmp_path / "l.sqlite3"
    _claims_an_hour_ago(family, ledger, sqs_clock)
    url = _backend(tmp_path, ["t-1", "t-2"])
    base = ("--result-backend", url, "ledger", "resolve", "--ledger", str(ledger))
    choose = ("--skip", "t-4", "--resend", "t-5")

    plan = cli(*base, *choose)
    assert plan.exit_code == 0, plan.output
    assert "found: the result backend records SUCCESS" in plan.output, plan.output
    assert "would record it as sent" in plan.output and "would leave it in doubt" in plan.output
    again = f"redrive ledger resolve --resend t-5 --skip t-4 --ledger {ledger} --execute"
    assert f"to do it, run:\n  {again}" in plan.output, plan.output
    assert "(claimed by run " in plan.output and "which never ended" in plan.output
    assert set(_states_by_task(ledger).values()) == {KeyState.CLAIMED}, "a dry run"
    planned = as_json(cli(*base, *choose, "--json"))
    assert planned["by_action"] == {"record-sent": 2, "resend": 1, "skip": 1, "leave": 6}

    done = cli(*base, *choose, "--execute", "--json")
    assert done.exit_code == 3, done.output  # six left in doubt
    assert as_json(done)["left_in_doubt"] == 6
    states = _states_by_task(ledger)
    assert {t: states.get(t) for t in ("t-1", "t-2", "t-4", "t-5")} == {
        "t-1": KeyState.SENT,
        "t-2": KeyState.SENT,
        "t-4": KeyState.SKIPPED,
        "t-5": None,
    }
    assert Counter(states.values())[KeyState.CLAIMED] == 6
    assert family.depth(family.queue_url) == (10, 0), "the target queue was not read"

    rerun = move(family.client, ledger)
    assert (rerun.moved, rerun.duplicates, rerun.in_doubt) == (1, 2, 6), rerun
    assert arrived(family)["t-5"] == 2  # the operator's choice: the task runs twice
    assert arrived(family, family.dlq_url) == Counter({f"t-{i}": 1 for i in (0, 3, 4, 6, 7, 8, 9)})


def test_resolve_without_a_backend_says_nothing_proves_and_changes_nothing(
    family: Family, tmp_path: Path, cli: Cli, sqs_clock: SqsClock
) -> None:
    ledger = tmp_path / "l.sqlite3"
    _claims_an_hour_ago(family, ledger, sqs_clock)

    done = cli("ledger", "resolve", "--ledger", str(ledger), "--execute")

    assert done.exit_code == 3, done.output
    assert done.output.count("no result backend given") == 10, done.output
    assert "10 left to you" in done.output
    assert set(_states_by_task(ledger).values()) == {KeyState.CLAIMED}
