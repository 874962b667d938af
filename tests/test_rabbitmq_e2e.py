"""End to end on RabbitMQ: the real ``redrive`` command as a subprocess against a private
node (``rabbitmq_vhost``), its DLQs filled by RabbitMQ's own dead-lettering of Celery-exact
messages (redrive/sandbox/rabbitmq_layout.py), as tests/test_e2e.py does for SQS."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import amqp
import pytest

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


def test_a_sigkill_mid_move_loses_nothing_and_the_rerun_sends_nothing_twice(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    """As tests/test_e2e.py's SIGKILL test: the ledger is watched and the run killed once
    some keys are sent; after the rerun each task is in the source once (or, in doubt, still
    in the DLQ): nothing lost, nothing doubled."""
    families = rabbit_families()[:1]
    fill_layout(rabbitmq_vhost.amqp_url, families, 600)
    before = task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq"))
    ledger = tmp_path / "ledger.sqlite3"
    args = ["move", "checkout", "--execute", "--yes", "--json", "--ledger", str(ledger)]
    victim = subprocess.Popen(
        [
            *REDRIVE,
            "--broker",
            rabbitmq_vhost.amqp_url,
            "--rabbitmq-api",
            rabbitmq_vhost.api_url,
            *args,
            "--rate",
            "200",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and victim.poll() is None:
            if _states(ledger)["done"] + _states(ledger)["sent"] >= 100:
                break
            time.sleep(0.005)
        assert victim.poll() is None, "the run ended before it could be killed"
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait(10)
    killed_at = _states(ledger)
    assert 0 < killed_at["done"] + killed_at["sent"] < 600, killed_at

    rerun = redrive(rabbitmq_vhost, *args, "--in-doubt", "skip")
    assert rerun.returncode in (0, 3), (rerun.stdout, rerun.stderr)
    assert "Traceback" not in rerun.stderr
    source = task_ids(drain(rabbitmq_vhost, "onion-checkout"))
    left = task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq"))
    assert max(source.values()) == 1, "a task was sent twice"
    assert set(source) | set(left) == set(before), "a task was lost"
    assert not set(source) & set(left) or killed_at["claimed"], "a sent task's copy is left"


def _states(ledger: Path) -> Counter[str]:
    if not ledger.exists():
        return Counter()
    try:
        with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True, timeout=1) as db:
            return Counter(state for (state,) in db.execute("SELECT state FROM keys"))
    except sqlite3.Error:
        return Counter()


#: A ``redrive`` whose first acknowledgement SIGKILLs it: the batch in flight is confirmed
#: and recorded SENT in the ledger, its DLQ copies not yet acked (the step after "recorded").
KILLED_AT_ACK = (
    "import os, signal, sys\n"
    "from redrive.broker.rabbitmq.broker import RabbitBroker\n"
    "RabbitBroker.ack = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
    "from redrive.cli import main\n"
    "sys.argv[0] = 'redrive'\n"
    "main()\n"
)


def test_a_sigkill_between_confirm_and_ack_leaves_the_copy_and_the_rerun_only_acks_it(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families()[:1], 150)
    before = task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq"))
    ledger = tmp_path / "ledger.sqlite3"
    args = ["move", "checkout", "--execute", "--yes", "--json", "--ledger", str(ledger)]
    broker = ["--broker", rabbitmq_vhost.amqp_url, "--rabbitmq-api", rabbitmq_vhost.api_url]
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AT_ACK, *broker, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert killed.returncode == -signal.SIGKILL, (killed.stdout, killed.stderr)
    states = _states(ledger)
    assert states["sent"] == 100 and states["done"] == 0, states  # one batch, confirmed
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
