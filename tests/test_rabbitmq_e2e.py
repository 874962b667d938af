"""End to end on RabbitMQ: the real ``redrive`` command as a subprocess against a private
node (``rabbitmq_vhost``), its DLQs filled by RabbitMQ's own dead-lettering of Celery-exact
messages (redrive/sandbox/rabbitmq_layout.py), as tests/test_e2e.py does for SQS. The move
and the kill tests run on 3.10.8 and on 4.0.5 (``on_both_rabbitmq``)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import amqp
import pytest
from conftest import on_both_rabbitmq, wait_until
from kill_points import At, KillPoints, end_leases, wait_until_leases_end, wait_until_stopped

from redrive.sandbox.rabbitmq_layout import (
    fill_layout,
    open_connection,
    rabbit_families,
    raw_channel,
)
from redrive.sandbox.rabbitmq_node import Vhost

pytestmark = pytest.mark.e2e

REDRIVE = [sys.executable, "-m", "redrive"]
ROOT = Path(__file__).resolve().parent.parent


#: The point after a batch was confirmed and recorded SENT, before its DLQ copies are acked.
KILLED_AT_ACK = At("move.recorded")


def redrive(vhost: Vhost, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*REDRIVE, "--broker", vhost.amqp_url, "--rabbitmq-api", vhost.api_url, *args],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def ok_json(result: subprocess.CompletedProcess[str], code: int = 0) -> Any:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


def drain(vhost: Vhost, queue: str) -> list[amqp.Message]:
    """Every message of a queue, left in place (got, then given back by closing)."""
    connection = open_connection(vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        got = []
        while (message := channel.basic_get(queue, no_ack=False)) is not None:
            got.append(message)
        return got
    finally:
        connection.close()


def task_ids(messages: list[amqp.Message]) -> Counter[str]:
    return Counter(str(m.properties["application_headers"]["id"]) for m in messages)


@pytest.fixture
def filled(rabbitmq_vhost: Vhost) -> dict[str, list[amqp.Message]]:
    """The built-in layout on the vhost, each DLQ holding 30 dead-lettered tasks; the DLQs'
    messages as they are before redrive touches them, by family."""
    families = rabbit_families()
    fill_layout(rabbitmq_vhost.amqp_url, families, 30)
    return {f.name: drain(rabbitmq_vhost, f.dlq) for f in families}


def test_status_inspect_and_a_dry_run_change_nothing(
    rabbitmq_vhost: Vhost, filled: dict[str, list[amqp.Message]]
) -> None:
    rows = ok_json(redrive(rabbitmq_vhost, "status", "--json"))
    by_family = (
        {row["family"]: row for row in rows["families"]}
        if isinstance(rows, dict)
        else {row["family"]: row for row in rows}
    )
    assert by_family["checkout"]["dlq"] == "onion-checkout-dlq"
    assert by_family["checkout"]["dlq_counts"]["visible"] == 30

    data = ok_json(redrive(rabbitmq_vhost, "inspect", "checkout", "--json"))
    assert data["total"] == 30
    assert sum(g["count"] for g in data["groups"]) == 30

    plan = ok_json(redrive(rabbitmq_vhost, "move", "checkout", "--json"))
    assert plan["dry_run"] is True and plan["moved"] == 30  # would move
    after = drain(rabbitmq_vhost, "onion-checkout-dlq")
    # The same messages, bodies and order: inspect and the dry run left the DLQ as it was.
    assert [m.body for m in after] == [m.body for m in filled["checkout"]]
    assert drain(rabbitmq_vhost, "onion-checkout") == []


@on_both_rabbitmq
def test_move_execute_puts_every_task_back_byte_identical_once(
    rabbitmq_vhost: Vhost, filled: dict[str, list[amqp.Message]], tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    data = ok_json(
        redrive(
            rabbitmq_vhost,
            "move",
            "checkout",
            "--execute",
            "--yes",
            "--json",
            "--ledger",
            str(ledger),
        )
    )
    assert data["moved"] == 30, data
    source = drain(rabbitmq_vhost, "onion-checkout")
    assert drain(rabbitmq_vhost, "onion-checkout-dlq") == []
    before = filled["checkout"]
    assert sorted(m.body for m in source) == sorted(m.body for m in before)
    assert task_ids(source) == task_ids(before)
    for message in source:
        assert message.properties["delivery_mode"] == 2
        headers = message.properties["application_headers"]
        assert headers["redrive-count"] == "1" and headers["redrive-dlq"] == "onion-checkout-dlq"
    with sqlite3.connect(ledger) as db:
        states = Counter(state for (state,) in db.execute("SELECT state FROM keys"))
    assert states == Counter({"done": 30})

    again = ok_json(
        redrive(
            rabbitmq_vhost,
            "move",
            "checkout",
            "--execute",
            "--yes",
            "--json",
            "--ledger",
            str(ledger),
        )
    )
    assert again["moved"] == 0
    assert task_ids(drain(rabbitmq_vhost, "onion-checkout")) == task_ids(before)


def killed(
    vhost: Vhost, points: KillPoints, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``redrive ARGS`` run until a kill point of ``points`` SIGKILLs it."""
    result = subprocess.run(
        points.argv("--broker", vhost.amqp_url, "--rabbitmq-api", vhost.api_url, *args),
        env=points.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == -signal.SIGKILL, (result.returncode, result.stdout, result.stderr)
    return result


@on_both_rabbitmq
def test_a_sigkill_mid_move_loses_nothing_and_the_rerun_sends_nothing_twice(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    """Killed after its second batch's send was confirmed, before the ledger recorded it: the
    first batch moved (acked, DONE), the second in the source but CLAIMED (in doubt), the
    rest untouched. The rerun with ``--in-doubt skip`` moves the rest; each task is in the
    source exactly once, and exactly the second batch's copies stay in the DLQ."""
    families = rabbit_families()[:1]
    fill_layout(rabbitmq_vhost.amqp_url, families, 350)
    before = task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq"))
    ledger = tmp_path / "ledger.sqlite3"
    args = ["move", "checkout", "--execute", "--yes", "--json", "--ledger", str(ledger)]
    points = KillPoints(tmp_path / "kill", At("move.sent", nth=2))
    killed(rabbitmq_vhost, points, *args, "--lease", "2")
    assert _states(ledger) == Counter({"done": 100, "claimed": 100})
    sent = task_ids(drain(rabbitmq_vhost, "onion-checkout"))
    assert sum(sent.values()) == 200 and max(sent.values()) == 1
    # The kill closed the connection: the second batch's copies are back, with the rest.
    left = task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq"))
    assert sum(left.values()) == 250 and set(left) | set(sent) == set(before)
    second = set(left) & set(sent)
    assert len(second) == 100
    # In doubt already (its pid is gone), but skipped only once its ledger lease is over.
    wait_until_leases_end(ledger)

    rerun = ok_json(redrive(rabbitmq_vhost, *args, "--in-doubt", "skip"))
    assert (rerun["moved"], rerun["in_doubt"], rerun["failed"]) == (150, 0, 0), rerun
    assert rerun["skipped_by_reason"] == {"in-doubt-resolved-skip": 100}, rerun
    source = task_ids(drain(rabbitmq_vhost, "onion-checkout"))
    assert source == before, "each task in the source exactly once: none lost, none doubled"
    assert set(task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq"))) == second
    assert _states(ledger) == Counter({"done": 250, "skipped": 100})
    again = ok_json(redrive(rabbitmq_vhost, *args))
    assert (again["moved"], again["in_doubt"]) == (0, 0), again


@on_both_rabbitmq
def test_a_rerun_inside_the_killed_runs_lease_reports_in_doubt_until_the_lease_ends(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    """Killed after its first batch's send was confirmed, before the ledger recorded it,
    with a lease of ten minutes: a rerun with ``--in-doubt skip`` at once finds the batch
    back in the DLQ and its run dead (its pid is gone), but the ledger lease running, and the
    ledger resolves none of its claims before it ends. So the 100 are reported in doubt (the
    lease live, until when), not resolved, and stay CLAIMED; past the lease they resolve."""
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families()[:1], 150)
    before = task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq"))
    ledger = tmp_path / "ledger.sqlite3"
    args = ["move", "checkout", "--execute", "--yes", "--json", "--ledger", str(ledger)]
    points = KillPoints(tmp_path / "kill", At("move.sent"))
    killed(rabbitmq_vhost, points, *args, "--lease", "600")
    assert _states(ledger) == Counter({"claimed": 100})
    first = task_ids(drain(rabbitmq_vhost, "onion-checkout"))
    assert sum(first.values()) == 100

    held = ok_json(redrive(rabbitmq_vhost, *args, "--in-doubt", "skip"), 3)
    assert (held["moved"], held["in_doubt"], held["failed"]) == (50, 100, 0), held
    assert held["skipped_by_reason"] == {"in-doubt-lease-live": 100}, held
    assert {m["task_id"] for m in held["in_doubt_messages"]} == set(first)
    (detail,) = {m["detail"] for m in held["in_doubt_messages"]}
    assert "lease runs until" in detail and "rerun once the lease is over" in detail, detail
    assert _states(ledger) == Counter({"done": 50, "claimed": 100}), "the ledger did nothing"
    assert task_ids(drain(rabbitmq_vhost, "onion-checkout")) == before, "each task once"
    assert task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq")) == first, "held in doubt"

    end_leases(ledger)
    resolved = ok_json(redrive(rabbitmq_vhost, *args, "--in-doubt", "skip"))
    assert (resolved["moved"], resolved["in_doubt"]) == (0, 0), resolved
    assert resolved["skipped_by_reason"] == {"in-doubt-resolved-skip": 100}, resolved
    assert _states(ledger) == Counter({"done": 50, "skipped": 100})
    assert task_ids(drain(rabbitmq_vhost, "onion-checkout")) == before, "none resent"
    assert task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq")) == first


@on_both_rabbitmq
def test_a_sigkill_before_the_confirm_is_in_doubt_and_resolved_as_on_sqs(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    """Stopped at the first frame read after a batch's 100 publishes were written (their
    confirms not read), then SIGKILLed once RabbitMQ has routed them: the ledger holds the
    batch CLAIMED, neither sent nor acked. The rerun reports exactly those 100 in doubt,
    holds their copies in the DLQ and moves the other 50; ``--in-doubt resend`` sends each of
    them once more (the doubling an operator asks for, and nothing else)."""
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families()[:1], 150)
    before = task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq"))
    ledger = tmp_path / "ledger.sqlite3"
    args = ["move", "checkout", "--execute", "--yes", "--json", "--ledger", str(ledger)]
    points = KillPoints(tmp_path / "kill", At("amqp.unconfirmed", do="stop"))
    broker = ["--broker", rabbitmq_vhost.amqp_url, "--rabbitmq-api", rabbitmq_vhost.api_url]
    with (tmp_path / "victim.err").open("w") as err:
        victim = subprocess.Popen(
            points.argv(*broker, *args, "--lease", "2"),
            env=points.env(),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
    try:
        note = points.wait_for_note()
        assert (note["pid"], note["publishes"]) == (victim.pid, 100), note
        wait_until_stopped(victim.pid)
        # Written to the socket before it stopped: RabbitMQ routes them, unconfirmed to it.
        wait_until(
            lambda: len(drain(rabbitmq_vhost, "onion-checkout")) == 100,
            "the batch written before the stop, routed",
            every=0.1,
        )
        victim.kill()
        assert victim.wait(10) == -signal.SIGKILL
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait(10)
    assert _states(ledger) == Counter({"claimed": 100}), "claimed, its confirm never recorded"
    first = task_ids(drain(rabbitmq_vhost, "onion-checkout"))
    assert sum(first.values()) == 100 and max(first.values()) == 1
    assert task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq")) == before, "all copies back"

    held = ok_json(redrive(rabbitmq_vhost, *args), 3)
    assert (held["moved"], held["in_doubt"], held["failed"]) == (50, 100, 0), held
    assert held["in_doubt_listed"] == 100 and held["in_doubt_truncated"] is False
    assert {m["task_id"] for m in held["in_doubt_messages"]} == set(first)
    assert task_ids(drain(rabbitmq_vhost, "onion-checkout")) == before, "each task once"
    assert task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq")) == first, "held in doubt"
    assert _states(ledger) == Counter({"done": 50, "claimed": 100})
    still = ok_json(redrive(rabbitmq_vhost, *args), 3)
    assert (still["moved"], still["in_doubt"]) == (0, 100), "held again, never resent"

    # Taken over only once the dead run's ledger lease is over (its pid is gone already).
    wait_until_leases_end(ledger)

    resent = ok_json(redrive(rabbitmq_vhost, *args, "--in-doubt", "resend"))
    assert (resent["moved"], resent["in_doubt"], resent["failed"]) == (100, 0, 0), resent
    assert task_ids(drain(rabbitmq_vhost, "onion-checkout")) == before + first
    assert drain(rabbitmq_vhost, "onion-checkout-dlq") == []
    assert _states(ledger) == Counter({"done": 150})


def _states(ledger: Path) -> Counter[str]:
    if not ledger.exists():
        return Counter()
    try:
        with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True, timeout=1) as db:
            return Counter(state for (state,) in db.execute("SELECT state FROM keys"))
    except sqlite3.Error:
        return Counter()


@on_both_rabbitmq
def test_a_sigkill_between_confirm_and_ack_leaves_the_copy_and_the_rerun_only_acks_it(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    """Killed after the first batch was confirmed and recorded SENT, before its DLQ copies
    were acked."""
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families()[:1], 150)
    before = task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq"))
    ledger = tmp_path / "ledger.sqlite3"
    args = ["move", "checkout", "--execute", "--yes", "--json", "--ledger", str(ledger)]
    killed(rabbitmq_vhost, KillPoints(tmp_path / "kill", KILLED_AT_ACK), *args)
    states = _states(ledger)
    assert states == Counter({"sent": 100}), states  # one batch, confirmed
    sent = task_ids(drain(rabbitmq_vhost, "onion-checkout"))
    assert sum(sent.values()) == 100
    # The kill closed the connection: every DLQ copy is back, the sent ones too.
    assert task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq")) == before

    data = ok_json(redrive(rabbitmq_vhost, *args))
    assert data["moved"] == 50, data
    source = task_ids(drain(rabbitmq_vhost, "onion-checkout"))
    assert source == before, "each task in the source exactly once"
    assert drain(rabbitmq_vhost, "onion-checkout-dlq") == []
    assert _states(ledger) == Counter({"done": 150})
    again = ok_json(redrive(rabbitmq_vhost, *args))
    assert again["moved"] == 0


def test_an_unreachable_broker_is_one_line_before_anything_changes(tmp_path: Path) -> None:
    url = "amqp://guest:hunter2@127.0.0.1:1//"
    for args in (["status"], ["move", "checkout", "--execute", "--yes"]):
        result = subprocess.run(
            [*REDRIVE, *args, "--broker", url, "--rabbitmq-api", "http://guest:pw@127.0.0.1:1"],
            env={**os.environ, "REDRIVE_STATE_DIR": str(tmp_path)},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 1, result.stderr
        assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
        assert "hunter2" not in result.stderr and "cannot be reached" in result.stderr
    assert not (tmp_path / "ledger.sqlite3").exists()


def test_the_config_names_the_broker(tmp_path: Path) -> None:
    from redrive.config import parse_config

    layout = parse_config(
        {
            "families": {"checkout": {"queue": "onion-checkout"}},
            "broker": {"url": "amqp://h//", "rabbitmq_api": "http://h:15672"},
        },
        "test",
    )
    assert (layout.broker_url, layout.rabbitmq_api) == ("amqp://h//", "http://h:15672")


def test_with_a_celery_app_and_no_broker_the_apps_broker_url_decides(
    rabbitmq_vhost: Vhost, filled: dict[str, list[amqp.Message]], tmp_path: Path
) -> None:
    (tmp_path / "rmq_app.py").write_text(
        f"from celery import Celery\napp = Celery('shop', broker={rabbitmq_vhost.amqp_url!r})\n"
    )
    result = subprocess.run(
        [
            *REDRIVE,
            "--celery-app",
            "rmq_app:app",
            "--rabbitmq-api",
            rabbitmq_vhost.api_url,
            "status",
            "--json",
        ],
        env={
            **os.environ,
            "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    rows = ok_json(result)
    rows = rows["families"] if isinstance(rows, dict) else rows
    checkout = next(row for row in rows if row["family"] == "checkout")
    assert checkout["dlq_counts"]["visible"] == 30
