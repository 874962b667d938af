"""``move --native`` and ``tasks`` on RabbitMQ: a dynamic shovel moves the whole DLQ back,
on a private node (``rabbitmq_vhost``, the shovel plugins on), its DLQs filled by RabbitMQ's
own dead-lettering of Celery-exact messages."""

from __future__ import annotations

import json
import shlex
import time
from typing import Any

import amqp
import pytest
from conftest import Cli, on_both_rabbitmq
from test_rabbitmq_e2e import drain, ok_json, redrive, task_ids

from redrive.broker.base import DlqTarget
from redrive.broker.rabbitmq import RabbitBroker, open_rabbitmq
from redrive.broker.rabbitmq.shovel import Shovels, shovel_name
from redrive.sandbox.rabbitmq_layout import (
    DLX,
    fill_layout,
    open_connection,
    publish_confirmed,
    rabbit_families,
    raw_channel,
)
from redrive.sandbox.rabbitmq_node import Vhost

pytestmark = pytest.mark.e2e

DLQ = "onion-checkout-dlq"
SOURCE = "onion-checkout"
NAME = shovel_name(DLQ)


def broker_of(vhost: Vhost) -> RabbitBroker:
    return open_rabbitmq(vhost.amqp_url, api_url=vhost.api_url, mask=lambda url: url)


def checkout(broker: RabbitBroker) -> DlqTarget:
    return DlqTarget(
        label="checkout",
        family=None,
        dlq=broker.describe(DLQ),
        sources=(broker.describe(SOURCE),),
    )


def parameters(broker: RabbitBroker) -> list[dict[str, Any]]:
    return broker.queues.api.get("parameters", "shovel", broker.queues.vhost) or []


def wait_gone(broker: RabbitBroker, name: str, seconds: float = 60) -> None:
    """The shovel's parameter is deleted (by itself at queue-length, or by a cancel)."""
    deadline = time.monotonic() + seconds
    while any(p["name"] == name for p in parameters(broker)):
        assert time.monotonic() < deadline, f"shovel {name} is still there after {seconds}s"
        time.sleep(0.05)


def cli_args(vhost: Vhost, *args: str) -> list[str]:
    return ["--broker", vhost.amqp_url, "--rabbitmq-api", vhost.api_url, *args]


@pytest.fixture
def filled(rabbitmq_vhost: Vhost) -> list[amqp.Message]:
    """The built-in layout, checkout's DLQ holding 30 dead-lettered tasks (as they are)."""
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families()[:1], 30)
    return drain(rabbitmq_vhost, DLQ)


def test_the_dry_run_shows_the_shovel_and_creates_nothing(
    rabbitmq_vhost: Vhost, filled: list[amqp.Message]
) -> None:
    plan = ok_json(redrive(rabbitmq_vhost, "move", "checkout", "--native", "--json"))
    assert plan["dry_run"] is True and plan["native"] is True
    assert plan["approximate_messages"] == 30 and plan["destination"] == SOURCE
    assert plan["shovel"] == NAME
    # Issue 37, 9: a RabbitMQ queue has no ARN (its ident read "//onion-dlq" on vhost /).
    assert plan["dlq_arn"] is None and plan["destination_arn"] is None
    vhost_uri = "amqp:///" + rabbitmq_vhost.vhost.replace("/", "%2F")
    assert plan["definition"] == {
        "src-protocol": "amqp091",
        "src-uri": vhost_uri,
        "src-queue": DLQ,
        "src-delete-after": "queue-length",
        "dest-protocol": "amqp091",
        "dest-uri": vhost_uri,
        "dest-queue": SOURCE,
        "ack-mode": "on-confirm",
    }
    text = redrive(rabbitmq_vhost, "move", "checkout", "--native")
    assert text.returncode == 0, text.stderr
    assert f"RabbitMQ dynamic shovel {NAME}" in text.stdout
    # Issue 37, 9: the command that starts it, not "rerun with --execute".
    assert text.stdout.endswith(
        "Nothing was started; to start it, run:\n  redrive --broker "
        f"{shlex.quote(rabbitmq_vhost.amqp_url)} --rabbitmq-api "
        f"{shlex.quote(rabbitmq_vhost.api_url)} move checkout --native --execute --yes\n"
    ), text.stdout
    assert parameters(broker_of(rabbitmq_vhost)) == []
    assert [m.body for m in drain(rabbitmq_vhost, DLQ)] == [m.body for m in filled]
    assert drain(rabbitmq_vhost, SOURCE) == []


@on_both_rabbitmq
def test_the_shovel_moves_the_whole_dlq_back_byte_identical_and_deletes_itself(
    rabbitmq_vhost: Vhost, filled: list[amqp.Message]
) -> None:
    done = ok_json(
        redrive(rabbitmq_vhost, "move", "checkout", "--native", "--execute", "--yes", "--json")
    )
    assert done["status"] == "COMPLETED" and done["moved"] == 30, done
    assert done["task_handle"] == NAME and done["destination"] is None
    assert parameters(broker_of(rabbitmq_vhost)) == []  # deleted itself at queue-length
    assert drain(rabbitmq_vhost, DLQ) == []
    moved = drain(rabbitmq_vhost, SOURCE)
    assert sorted(m.body for m in moved) == sorted(m.body for m in filled)
    assert task_ids(moved) == task_ids(filled)
    before = {m.properties["application_headers"]["id"]: m for m in filled}
    for message in moved:
        headers = message.properties["application_headers"]
        original = before[headers["id"]].properties["application_headers"]
        assert headers["x-death"] == original["x-death"]  # kept, not re-counted
        assert message.properties["delivery_mode"] == 2
    # Nothing of redrive's own: the broker moved them, not redrive's engine.
    assert all("redrive-count" not in m.properties["application_headers"] for m in moved)


def test_tasks_lists_a_running_shovel_and_it_ends_with_everything_moved(
    rabbitmq_vhost: Vhost, cli: Cli
) -> None:
    """A large DLQ so the shovel is likely still running when ``tasks`` reads it; if it is
    already done, the listing is empty: either is right, nothing waits on a clock."""
    family = rabbit_families()[:1]
    fill_layout(rabbitmq_vhost.amqp_url, family, 0)
    connection = open_connection(rabbitmq_vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        messages = [amqp.Message(b"x" * 64, delivery_mode=2) for _ in range(20_000)]
        publish_confirmed(channel, DLQ, messages)
    finally:
        connection.close()
    broker = broker_of(rabbitmq_vhost)
    handle = Shovels(broker).start(checkout(broker), destination=None, rate=None)
    assert handle == NAME
    listed = json.loads(cli.ok(*cli_args(rabbitmq_vhost, "tasks", DLQ, "--json")).stdout)
    assert listed["dlq"] == DLQ and listed["dlq_arn"] is None
    for task in listed["tasks"]:
        assert task["task_handle"] == NAME and task["status"] in ("RUNNING", "FAILED")
        assert task["destination_arn"].endswith(f"/{SOURCE}")
    table = cli.ok(*cli_args(rabbitmq_vhost, "tasks", DLQ)).output
    assert "move tasks of DLQ" in table or "no move tasks" in table
    wait_gone(broker, NAME)
    counts = broker.counts(DLQ), broker.counts(SOURCE)
    assert (counts[0].ready, counts[1].ready) == (0, 20_000)


def test_cancel_deletes_the_shovel_and_leaves_the_rest_in_the_dlq(
    rabbitmq_vhost: Vhost, filled: list[amqp.Message], cli: Cli
) -> None:
    """An exclusive consumer on the DLQ keeps the shovel from consuming (it cannot finish
    by itself), so the cancel always finds it."""
    broker = broker_of(rabbitmq_vhost)
    holder = open_connection(rabbitmq_vhost.amqp_url)
    try:
        channel = raw_channel(holder)
        channel.basic_qos(0, 1, False)
        channel.basic_consume(DLQ, exclusive=True, callback=lambda message: None)
        Shovels(broker).start(checkout(broker), destination=None, rate=None)
        listed = json.loads(cli.ok(*cli_args(rabbitmq_vhost, "tasks", "checkout", "--json")).stdout)
        assert [t["task_handle"] for t in listed["tasks"]] == [NAME]
        again = redrive(rabbitmq_vhost, "move", "checkout", "--native", "--execute", "--yes")
        assert again.returncode != 0 and "already moves DLQ" in again.stderr, again.stderr
        cancelled = cli.ok(*cli_args(rabbitmq_vhost, "tasks", "checkout", "--cancel"))
        assert "cancelling" in cancelled.output
        assert parameters(broker) == []
    finally:
        holder.close()
    nothing = cli(*cli_args(rabbitmq_vhost, "tasks", "checkout", "--cancel"))
    assert nothing.exit_code != 0 and "nothing to cancel" in nothing.output
    assert task_ids(drain(rabbitmq_vhost, DLQ)) == task_ids(filled)
    assert drain(rabbitmq_vhost, SOURCE) == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--where", "task == 'x'"], "cannot filter"),
        (["--task", "apps.*"], "cannot filter"),
        (["--limit", "5"], "cannot filter"),
        (["--ledger", "x.sqlite3"], "bypasses redrive's ledger"),
        (["--workers", "4"], "no workers or leases"),
        (["--route", "task"], "cannot route by task"),
        (["--set", 'kwargs.currency="EUR"'], "edits need a move without it"),
        (["--rate", "10"], "a shovel has no rate limit"),
    ],
)
def test_native_refuses_what_a_shovel_cannot_honour(
    rabbitmq_vhost: Vhost, filled: list[amqp.Message], cli: Cli, args: list[str], says: str
) -> None:
    result = cli(*cli_args(rabbitmq_vhost, "move", "checkout", "--native", "--execute", *args))
    assert result.exit_code != 0, result.output
    assert says in result.output and "Traceback" not in result.output
    assert parameters(broker_of(rabbitmq_vhost)) == []
    assert len(drain(rabbitmq_vhost, DLQ)) == 30


def test_a_dlq_with_several_sources_needs_to(
    rabbitmq_vhost: Vhost, filled: list[amqp.Message], cli: Cli
) -> None:
    connection = open_connection(rabbitmq_vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        channel.queue_declare(
            "onion-checkout-eu",
            durable=True,
            auto_delete=False,
            arguments={"x-dead-letter-exchange": DLX, "x-dead-letter-routing-key": DLQ},
        )
    finally:
        connection.close()
    refused = cli(*cli_args(rabbitmq_vhost, "move", DLQ, "--native", "--execute", "--yes"))
    assert refused.exit_code != 0
    assert "choose it with --to" in refused.output and "onion-checkout-eu" in refused.output
    assert parameters(broker_of(rabbitmq_vhost)) == []
    plan = json.loads(
        cli.ok(*cli_args(rabbitmq_vhost, "move", DLQ, "--native", "--to", SOURCE, "--json")).stdout
    )
    assert plan["definition"]["dest-queue"] == SOURCE
    assert sorted(plan["sources"]) == ["onion-checkout", "onion-checkout-eu"]
