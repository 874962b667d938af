"""Inspect's holds on RabbitMQ (issue 24): a scan holds every delivery it reads (unacked) and
gives them all back at its end, from every lane its workers used, before the command returns:
the runbook's next step (a move right after the inspect) sees every message, in its order.
On a private node, in this process (the links stay open after the command: what the test sees
is the scan's giving back, not the connections closing at exit)."""

from __future__ import annotations

from collections.abc import Iterator

import amqp
import pytest
from conftest import Cli, as_json
from test_rabbitmq_e2e import drain

from redrive.broker.rabbitmq.link import close_links
from redrive.sandbox.rabbitmq_layout import (
    fill_layout,
    open_connection,
    queue_depth,
    rabbit_families,
    raw_channel,
)
from redrive.sandbox.rabbitmq_node import Vhost

pytestmark = pytest.mark.e2e

DLQ = "onion-checkout-dlq"
#: Several batches (of 100) for each of the 4 workers' lanes.
MESSAGES = 1_000


@pytest.fixture
def filled(rabbitmq_vhost: Vhost) -> Iterator[list[amqp.Message]]:
    """checkout's classic DLQ holding MESSAGES dead-lettered tasks, as they are."""
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families()[:1], MESSAGES)
    yield drain(rabbitmq_vhost, DLQ)
    close_links()  # this process's lanes to the vhost, before the fixture deletes it


def ready_now(vhost: Vhost) -> int:
    """The DLQ's ready count, by a passive declare on a connection of the test's own."""
    connection = open_connection(vhost.amqp_url)
    try:
        return queue_depth(raw_channel(connection), DLQ)
    finally:
        connection.close()


def test_an_inspect_with_four_workers_gives_every_hold_back_before_it_returns(
    rabbitmq_vhost: Vhost, filled: list[amqp.Message], cli: Cli
) -> None:
    args = ["--broker", rabbitmq_vhost.amqp_url, "--rabbitmq-api", rabbitmq_vhost.api_url]
    data = as_json(cli.ok(*args, "inspect", "checkout", "--workers", "4", "--json"))
    assert data["total"] == MESSAGES
    # At once, no waiting: every message is ready again (none still held by a lane).
    assert ready_now(rabbitmq_vhost) == MESSAGES
    after = drain(rabbitmq_vhost, DLQ)
    assert [m.body for m in after] == [m.body for m in filled]
    assert [m.properties for m in after] == [m.properties for m in filled]

    # The runbook's next step in the same process sees them all too.
    plan = as_json(cli.ok(*args, "move", "checkout", "--workers", "4", "--json"))
    assert plan["dry_run"] is True and plan["moved"] == MESSAGES
    assert ready_now(rabbitmq_vhost) == MESSAGES
    assert [m.body for m in drain(rabbitmq_vhost, DLQ)] == [m.body for m in filled]
