"""Per group, why and where RabbitMQ dead-lettered the messages (issue 24 item 3): x-death's
reason, queue and time of each message's last death, through ``Delivery.death_reason`` /
``died_in`` / ``died_at``; inspect's and report's JSON and text. On real 3.10.8 and 4.0.5 nodes
(4.0's dead-lettering adds ``x-last-death-*``; x-death is read on both)."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from conftest import on_both_rabbitmq
from test_rabbitmq_e2e import ok_json, redrive

from redrive.sandbox.rabbitmq_layout import (
    fill_layout,
    open_connection,
    publish_confirmed,
    queue_depth,
    rabbit_families,
    raw_channel,
    sample_celery_messages,
)
from redrive.sandbox.rabbitmq_node import Vhost

pytestmark = [pytest.mark.e2e, on_both_rabbitmq]


def expire_into_dlq(vhost: Vhost, queue: str, dlq: str, count: int) -> None:
    """Dead-letter ``count`` tasks by expiry: published to the unconsumed source queue with a
    1 ms per-message TTL; waits (bounded) until the DLQ holds them."""
    connection = open_connection(vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        before = queue_depth(channel, dlq)
        messages = sample_celery_messages("checkout", count, seed=11)
        for message in messages:
            message.properties["expiration"] = "1"
        publish_confirmed(channel, queue, messages)
        deadline = time.monotonic() + 120
        while queue_depth(channel, dlq) < before + count:
            assert time.monotonic() < deadline, "expired messages never reached the DLQ"
            time.sleep(0.05)
    finally:
        connection.close()


def test_groups_say_why_and_where_their_messages_died(rabbitmq_vhost: Vhost) -> None:
    families = rabbit_families()
    checkout = next(f for f in families if f.name == "checkout")
    fill_layout(rabbitmq_vhost.amqp_url, families, 4)
    expire_into_dlq(rabbitmq_vhost, checkout.queue, checkout.dlq, 3)

    result = ok_json(redrive(rabbitmq_vhost, "inspect", "checkout", "--json"))
    reasons: Counter[str] = Counter()
    died_in: Counter[str] = Counter()
    for group in result["groups"]:
        assert sum(group["death_reasons"].values()) == group["count"]
        reasons.update(group["death_reasons"])
        died_in.update(group["died_in"])
        assert group["died_oldest"] <= group["died_newest"]
    assert reasons == {"rejected": 4, "expired": 3}
    assert died_in == {checkout.queue: 7}

    text = redrive(rabbitmq_vhost, "inspect", "checkout", "--wide")
    assert text.returncode == 0, text.stderr
    assert "died of" in text.stdout and f"in {checkout.queue}" in text.stdout
    assert "expired" in text.stdout and "rejected" in text.stdout

    report = ok_json(redrive(rabbitmq_vhost, "report", "--format", "json"))
    by_family = {q["family"]: q for q in report["queues"]}
    groups = by_family["checkout"]["groups"]
    assert sum(sum(g["death_reasons"].values()) for g in groups) == 7
    shown = redrive(rabbitmq_vhost, "report", "--wide")
    assert "died of" in shown.stdout, shown.stdout
