"""Issue 37, 9: RabbitMQ's wording and errors, each as a newcomer met it: a missing vhost, a
wrong AMQP password, amqps:// to a plain port, no broker named, a source queue whose DLQ is
not found, and the help of ``ledger in-doubt`` (which named SQS alone)."""

from __future__ import annotations

import json
import time

import amqp
import pytest
from conftest import Cli
from test_rabbitmq_e2e import ok_json, redrive

from redrive.sandbox.rabbitmq_layout import (
    declare_layout,
    open_connection,
    publish_confirmed,
    queue_depth,
    rabbit_families,
    raw_channel,
    sample_celery_messages,
)
from redrive.sandbox.rabbitmq_node import Vhost

# Commands and their rendering: on RabbitMQ 4.0, the version users run (issue 39); the broker's
# own behaviour is tested on both (tests/test_rabbitmq_versions.py, tests/conftest.py).
RABBITMQ_VERSIONS = ("4.0",)


def declared(vhost: Vhost) -> None:
    connection = open_connection(vhost.amqp_url)
    try:
        declare_layout(raw_channel(connection), rabbit_families())
    finally:
        connection.close()


def on_vhost(vhost: Vhost, name: str) -> str:
    """The vhost's AMQP URL with its vhost replaced by ``name``."""
    return vhost.amqp_url.rsplit("/", 1)[0] + "/" + name


def one_line_error(result: object, code: int = 1) -> str:
    returncode, stdout, stderr = (
        getattr(result, "returncode", None),
        getattr(result, "stdout", ""),
        getattr(result, "stderr", ""),
    )
    assert returncode == code, (returncode, stdout, stderr)
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_ledger_in_doubt_help_names_no_one_broker(cli: Cli) -> None:
    text = " ".join(cli.ok("ledger", "in-doubt", "--help").output.split())
    assert "before SQS confirmed" not in text
    assert "before the broker (SQS or RabbitMQ) confirmed its send" in text


def test_no_region_and_no_broker_says_how_to_name_a_rabbitmq_broker(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "REDRIVE_BROKER", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    result = cli("inspect", "checkout")
    assert result.exit_code == 1, result.output
    assert "no AWS region" in result.stderr
    assert "--broker amqp://USER:PASS@HOST:5672/VHOST" in result.stderr, result.stderr


def test_a_missing_vhost_is_said_as_such(rabbitmq_vhost: Vhost) -> None:
    url = on_vhost(rabbitmq_vhost, "nosuchvhost")
    result = redrive_at(url, rabbitmq_vhost, "inspect", "checkout")
    line = one_line_error(result)
    # It said "queue onion-checkout does not exist on vhost 'nosuchvhost'".
    assert line.startswith("Error: vhost 'nosuchvhost' does not exist on RabbitMQ"), line
    assert "onion-checkout" not in line and "the broker URL's path" in line


def test_a_wrong_amqp_password_says_which_credential_failed(rabbitmq_vhost: Vhost) -> None:
    declared(rabbitmq_vhost)
    url = rabbitmq_vhost.amqp_url.replace("guest:guest@", "guest:wrong@")
    result = redrive_at(url, rabbitmq_vhost, "inspect", "checkout")
    line = one_line_error(result)
    # It said "management API ... refused the credentials (401)", as if the API's were wrong.
    assert line.startswith(
        "Error: RabbitMQ refused user 'guest': wrong user or password in the broker URL (--broker)"
    ), line
    assert "check USER:PASS in it" in line
    # The API given its own (right) credentials: AMQP's login is refused, said alike.
    api = rabbitmq_vhost.api_url.replace("http://", "http://guest:guest@")
    amqp_only = one_line_error(redrive_at(url, rabbitmq_vhost, "inspect", "checkout", api=api))
    assert "refused user 'guest': wrong user or password (ACCESS_REFUSED)" in amqp_only
    assert "check USER:PASS in the broker URL" in amqp_only
    # The API's own credentials wrong: said as the API's.
    api = rabbitmq_vhost.api_url.replace("http://", "http://guest:nope@")
    wrong_api = one_line_error(
        redrive_at(rabbitmq_vhost.amqp_url, rabbitmq_vhost, "inspect", "checkout", api=api)
    )
    assert "wrong user or password in the management API's URL (--rabbitmq-api)" in wrong_api


def test_amqps_to_a_plain_port_says_the_port_does_not_speak_tls(rabbitmq_vhost: Vhost) -> None:
    declared(rabbitmq_vhost)
    url = rabbitmq_vhost.amqp_url.replace("amqp://", "amqps://")
    result = redrive_at(url, rabbitmq_vhost, "inspect", "checkout")
    line = one_line_error(result)
    assert "WRONG_VERSION_NUMBER" not in line, line
    port = rabbitmq_vhost.amqp_url.rsplit(":", 1)[1].split("/", 1)[0]
    assert f"port {port} does not speak TLS: use amqp:// for it" in line, line


def redrive_at(url: str, vhost: Vhost, *args: str, api: str | None = None) -> object:
    """``redrive`` with ``url`` as the broker and ``vhost``'s management API (no
    credentials of its own: the broker URL's)."""
    import os
    import subprocess

    from test_rabbitmq_e2e import REDRIVE, ROOT

    return subprocess.run(
        [*REDRIVE, "--broker", url, "--rabbitmq-api", api or vhost.api_url, *args],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_status_says_a_source_queue_whose_dlq_is_not_found(rabbitmq_vhost: Vhost) -> None:
    declared(rabbitmq_vhost)
    connection = open_connection(rabbitmq_vhost.amqp_url)
    try:
        raw_channel(connection).queue_delete("onion-checkout-dlq")
    finally:
        connection.close()
    with_messages = open_connection(rabbitmq_vhost.amqp_url)
    try:
        channel = raw_channel(with_messages)
        for _ in range(3):
            channel.basic_publish(amqp.Message(b"x"), routing_key="onion-checkout")
    finally:
        with_messages.close()
    result = redrive(rabbitmq_vhost, "status", "--wide")
    assert result.returncode == 1, result.stderr
    (row,) = [line for line in result.stdout.splitlines() if line.startswith("checkout ")]
    # It read "checkout  onion-checkout  -  -  -  -  queue onion-checkout dead-letters...".
    cells = [cell for cell in row.split("  ") if cell.strip()]
    assert [c.strip() for c in cells[:4]] == [
        "checkout",
        "onion-checkout",
        "3 / 0 / 0",
        "not found",
    ]
    assert "routes it to no queue" in row
    data = json.loads(redrive(rabbitmq_vhost, "status", "--json").stdout)
    (checkout,) = [f for f in data["families"] if f["family"] == "checkout"]
    assert checkout["queue_counts"] == {"visible": 3, "in_flight": 0, "delayed": 0}
    assert checkout["dlq"] is None and checkout["error"]


def test_a_task_dead_lettered_past_the_delivery_limit_shows_its_deliveries(
    rabbitmq_vhost: Vhost,
) -> None:
    """A quorum source with x-delivery-limit 5 delivers a message 6 times before it
    dead-letters it (reason delivery_limit), and the dead-lettered message no longer carries
    x-delivery-count: inspect said `consumer receives 0`. Each delivery here is a consumer's
    get and requeue, counted; the DLQ is classic (it counts nothing)."""
    families = rabbit_families(queue_type="quorum", dlq_type="classic", delivery_limit=5)
    checkout = next(f for f in families if f.name == "checkout")
    connection = open_connection(rabbitmq_vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        declare_layout(channel, families)
        publish_confirmed(channel, checkout.queue, sample_celery_messages("checkout", 2, seed=3))
        deliveries = 0
        deadline = time.monotonic() + 120  # a bound for a hang, not a pace
        while queue_depth(channel, checkout.dlq) < 2:
            got = channel.basic_get(checkout.queue, no_ack=False)
            if got is not None:
                deliveries += 1
                channel.basic_reject(got.delivery_tag, requeue=True)
            assert time.monotonic() < deadline, deliveries
    finally:
        connection.close()
    assert deliveries == 12  # 6 each: the limit + 1

    data = ok_json(redrive(rabbitmq_vhost, "inspect", "checkout", "--json"))
    assert {g["max_consumer_receives"] for g in data["groups"]} == {6}, data["groups"]
    assert sum(g["death_reasons"].get("delivery_limit", 0) for g in data["groups"]) == 2
    matched = ok_json(
        redrive(
            rabbitmq_vhost, "inspect", "checkout", "--where", "consumer_receives == `6`", "--json"
        )
    )
    assert matched["matched"] == 2, matched
