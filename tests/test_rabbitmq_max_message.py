"""RabbitMQ 4.0's largest message (issue 39): 16 MiB by default where 3.x took 128 MiB. A
message can sit in a DLQ above it (it came in under 3.13 before an upgrade, or while the
limit was set higher); the broker refuses it when sent back (406: the channel closes). redrive
sends no body over the version's default, and says which and why; a lower limit set by the
operator is the broker's refusal, said as clearly, the rest of the batch neither lost nor
doubled.

On a private 4.0.5 node: its limit is changed as the node holds it (``max_message_size`` in
``persistent_term``, read when a channel opens), where a shared node's would change every
test's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import amqp
import pytest
from rabbitmq_shared import RABBITMQ4_ROOT, require_rabbitmq4
from test_rabbitmq_e2e import drain, redrive, task_ids

from redrive.broker.rabbitmq.broker import default_max_message, too_large
from redrive.sandbox.rabbitmq_layout import (
    celery_message,
    dead_letter,
    declare_layout,
    open_connection,
    rabbit_families,
    raw_channel,
)
from redrive.sandbox.rabbitmq_node import ChrootRabbitMQNode

MIB = 1024 * 1024


def test_the_default_largest_message_by_version() -> None:
    assert default_max_message("3.10.8") == 128 * MIB
    assert default_max_message("3.13.7") == 128 * MIB
    assert default_max_message("4.0.5") == 16 * MIB
    assert default_max_message("4.1.0-rc.2") == 16 * MIB
    assert default_max_message(None) is None and default_max_message("") is None
    assert too_large(16 * MIB, "4.0.5") is None
    assert too_large(20 * MIB, "3.10.8") is None
    assert too_large(16 * MIB + 1, None) is None  # unknown: the broker's refusal says it
    assert "over RabbitMQ 4.0.5's default largest message of 16 MiB" in str(
        too_large(16 * MIB + 1, "4.0.5")
    )


@pytest.fixture(scope="module")
def node4() -> Iterator[ChrootRabbitMQNode]:
    require_rabbitmq4()
    node = ChrootRabbitMQNode(RABBITMQ4_ROOT)
    try:
        node.start()
        yield node
    finally:
        node.stop()
        node.remove()


def set_limit(node: ChrootRabbitMQNode, size: int) -> None:
    # rabbitmqctl starts an Erlang VM of its own: slow on a loaded machine (a bound for a hang).
    said = node.rabbitmqctl("eval", f"persistent_term:put(max_message_size, {size}).", timeout=300)
    assert said.strip() == "ok", said


def task_of(task_id: str, padding: int) -> amqp.Message:
    """A Celery task message whose body is ``padding`` bytes bigger (a kwarg)."""
    message = celery_message("apps.payments.tasks.capture_payment", [1], {}, task_id=task_id)
    args, kwargs, embed = json.loads(message.body)
    message.body = json.dumps([args, {**kwargs, "blob": "x" * padding}, embed]).encode()
    return message


@pytest.mark.e2e
def test_a_body_over_4_0s_16_mib_is_left_said_and_a_lower_limit_refused_cleanly(
    node4: ChrootRabbitMQNode, tmp_path: Path
) -> None:
    vhost = node4.create_vhost("largest")
    family = rabbit_families()[0]
    set_limit(node4, 128 * MIB)  # as 3.x took them: in they come
    connection = open_connection(vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        declare_layout(channel, [family])
        channel.close()
        # The 2 MiB one first: the small one after it in the batch is discarded with the
        # closed channel (refused, not in doubt), whatever the confirms' timing.
        messages = [task_of("t-2mib", 2 * MIB), task_of("t-small", 0), task_of("t-17mib", 17 * MIB)]
        assert dead_letter(connection, family, messages) == 3
    finally:
        connection.close()
    ledger = str(tmp_path / "ledger.sqlite3")
    move = ["move", "checkout", "--include-unknown", "--execute", "--yes", "--ledger", ledger]

    # An operator's limit of 1 MiB: the 17 MiB one is not sent (over 4.0's default), the
    # 2 MiB one is refused by the broker; neither is in doubt, nothing else is lost.
    set_limit(node4, MIB)
    first = redrive(vhost, *move)
    assert first.returncode == 3, (first.stdout, first.stderr)
    assert "Traceback" not in first.stderr and ", 0 in doubt," in first.stdout, first.stdout
    text = " ".join(first.stdout.split())
    assert "over RabbitMQ 4.0.5's default largest message of 16 MiB (max_message_size)" in text
    assert "RabbitMQ refused its body of 2,0" in text and "of 1,048,576 bytes" in text

    # 4.0's default back: the 2 MiB one goes; the 17 MiB one stays, said again.
    set_limit(node4, 16 * MIB)
    second = redrive(vhost, *move)
    assert second.returncode == 3, (second.stdout, second.stderr)
    assert "default largest message of 16 MiB" in " ".join(second.stdout.split())
    assert task_ids(drain(vhost, family.queue)) == {"t-2mib": 1, "t-small": 1}
    assert task_ids(drain(vhost, family.dlq)) == {"t-17mib": 1}
