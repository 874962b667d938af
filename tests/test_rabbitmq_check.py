"""``check`` on RabbitMQ (issue 24 item 7), against a real node: a DLX that routes a
family's dead messages to no queue (they vanish), a source queue with no DLX, a quorum
queue's delivery limit and a quorum DLQ's; with --celery-app --celery, the settings that lose
messages on RabbitMQ (task_reject_on_worker_lost without acks_late, acks_late with
task_acks_on_failure, task_reject_on_worker_lost with acks_late (a dead worker's task requeued,
never dead-lettered), task_queues declaring a family's queue without its DLX or no
DLQ)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_rabbitmq_e2e import REDRIVE, ROOT, ok_json, redrive

from redrive.celery.settings_audit import acks_on_failure_setting
from redrive.sandbox.rabbitmq_layout import (
    DLX,
    RabbitFamily,
    declare_layout,
    open_connection,
    rabbit_families,
    raw_channel,
)
from redrive.sandbox.rabbitmq_node import Vhost

pytestmark = pytest.mark.e2e

# Commands and their rendering: on RabbitMQ 4.0, the version users run (issue 39); the broker's
# own behaviour is tested on both (tests/test_rabbitmq_versions.py, tests/conftest.py).
RABBITMQ_VERSIONS = ("4.0",)

APP = """
from celery import Celery
from kombu import Queue

app = Celery("shop", broker={url!r})
app.conf.task_default_queue = "onion"
app.conf.task_reject_on_worker_lost = True
app.conf.task_queues = [
    Queue("onion-checkout", queue_arguments={{"x-dead-letter-exchange": "onion-dlx"}}),
    Queue("onion"),
    Queue("onion-progress", queue_arguments={{"x-dead-letter-exchange": "onion-dlx"}}),
    Queue("onion-checkout-dlq"),
]
app.conf.task_routes = {{"shop.charge": {{"queue": "onion-checkout"}},
                        "shop.progress": {{"queue": "onion-progress"}}}}


@app.task(name="shop.charge")
def charge():
    pass


@app.task(name="shop.progress", acks_late=True, acks_on_failure_or_timeout=True)
def progress():
    pass
"""


def declare_broken_layout(vhost: Vhost) -> None:
    """checkout: a quorum queue with x-delivery-limit 3 into a quorum DLQ with a limit of its
    own (4); default (onion): no DLX at all; progress: a DLX with no queue bound for its key."""
    connection = open_connection(vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        checkout = RabbitFamily(
            "checkout",
            "onion-checkout",
            "onion-checkout-dlq",
            queue_type="quorum",
            dlq_type="quorum",
            delivery_limit=3,
            dlq_delivery_limit=4,
        )
        declare_layout(channel, [checkout])
        channel.queue_declare("onion", durable=True, auto_delete=False)
        channel.exchange_declare(DLX, "direct", durable=True, auto_delete=False)
        channel.queue_declare(
            "onion-progress",
            durable=True,
            auto_delete=False,
            arguments={
                "x-dead-letter-exchange": DLX,
                "x-dead-letter-routing-key": "onion-progress-dlq",
            },
        )
        channel.close()
    finally:
        connection.close()


def problems(findings: list[dict[str, Any]], family: str | None) -> list[str]:
    return [f["problem"] for f in findings if f["family"] == family]


def test_check_finds_what_loses_messages_on_rabbitmq(rabbitmq_vhost: Vhost) -> None:
    declare_broken_layout(rabbitmq_vhost)
    findings = ok_json(redrive(rabbitmq_vhost, "check", "--json"), code=1)["findings"]

    checkout = problems(findings, "checkout")
    # Each limit says where it comes from (issue 24).
    assert "x-delivery-limit is 3 as its own argument, expected 5" in checkout
    assert any(
        "the DLQ has x-delivery-limit 4 as its own argument: every read" in p
        and "--allow-delivery-limit" in p
        for p in checkout
    ), checkout
    assert problems(findings, "default") == ["has no x-dead-letter-exchange (no DLQ)"]
    (progress,) = problems(findings, "progress")
    assert "routes it to no queue" in progress and "vanish" in progress
    # A classic queue sets no delivery limit: nothing to compare, no finding for it.
    assert not any("x-delivery-limit is None" in p for f in findings for p in [f["problem"]])


def test_check_celery_finds_the_settings_that_lose_messages_on_rabbitmq(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    declare_broken_layout(rabbitmq_vhost)
    (tmp_path / "rmq_check_app.py").write_text(APP.format(url=rabbitmq_vhost.amqp_url))
    result = subprocess.run(
        [
            *REDRIVE,
            "--broker",
            rabbitmq_vhost.amqp_url,
            "--rabbitmq-api",
            rabbitmq_vhost.api_url,
            "--celery-app",
            "rmq_check_app:app",
            "check",
            "--celery",
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
    findings = ok_json(result, code=1)["findings"]
    by_setting: dict[str, list[dict[str, Any]]] = {}
    for finding in findings:
        by_setting.setdefault(str(finding.get("setting")), []).append(finding)

    requeued, lost = by_setting["task_reject_on_worker_lost"]
    assert lost["value"] == "True" and "shop.charge" in lost["problem"]
    assert "lost, never dead-lettered" in lost["problem"]
    # Issue 37, 5: with acks_late, the setting requeues a dead worker's task.
    assert requeued["value"] == "True" and "shop.progress" in requeued["problem"]
    assert "requeued, never dead-lettered" in requeued["problem"]
    (acked,) = by_setting[acks_on_failure_setting()]  # as the installed Celery names it
    assert "shop.progress" in acked["problem"]
    declared = {f["value"]: f["problem"] for f in by_setting["task_queues"]}
    assert "declared without x-dead-letter-exchange" in declared["onion"]
    assert "onion-checkout" not in declared  # declared with its DLX
    assert "declared by no worker" in declared["onion-progress-dlq"]
    assert "declared by no worker" in declared["onion-dlq"]
    assert "onion-checkout-dlq" not in declared
    # SQS's visibility timeout means nothing on RabbitMQ.
    assert "broker_transport_options.visibility_timeout" not in by_setting


def test_the_sandbox_app_passes_check_celery_on_the_rabbitmq_layout(
    rabbitmq_vhost: Vhost,
) -> None:
    """Issue 37, 9: the sandbox's own app failed check --celery on RabbitMQ (task_queues =
    None), and "no findings" said the layout matched "what SQS says"."""
    connection = open_connection(rabbitmq_vhost.amqp_url)
    try:
        declare_layout(raw_channel(connection), rabbit_families())
    finally:
        connection.close()
    app = ("--celery-app", "redrive.sandbox.celery_app:app")
    result = redrive(rabbitmq_vhost, *app, "check", "--celery")
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert result.stdout.startswith("no findings: the layout matches what RabbitMQ says, and the ")
    plain = redrive(rabbitmq_vhost, "check")
    assert plain.returncode == 0, (plain.stdout, plain.stderr)
    first, broker = plain.stdout.splitlines()
    assert first == "no findings: the layout matches what RabbitMQ says"
    assert broker.startswith("broker: RabbitMQ 4.0."), broker
