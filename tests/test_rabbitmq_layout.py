"""The layout on RabbitMQ (redrive/sandbox/rabbitmq_layout.py): queues with their DLX and
DLQs, Celery's messages as Celery publishes them, and DLQs filled by the broker's own
dead-lettering (a real x-death)."""

from __future__ import annotations

import json
import time
import urllib.parse
from datetime import UTC, datetime, timedelta
from typing import Any

import celery
import pytest

from redrive.errors import RabbitMQNodeError
from redrive.sandbox.rabbitmq_layout import (
    DLX,
    Confirms,
    celery_message,
    dead_letter,
    declare_layout,
    fill_layout,
    open_connection,
    publish_confirmed,
    queue_depth,
    rabbit_families,
    raw_channel,
    sample_celery_messages,
)
from redrive.sandbox.rabbitmq_node import Vhost, management_request

pytestmark = pytest.mark.e2e


def api(vhost: Vhost, path: str) -> Any:
    return management_request(
        vhost.api_url, "GET", path.format(vhost=urllib.parse.quote(vhost.vhost, safe=""))
    )


def take_all(vhost: Vhost, queue: str) -> list[Any]:
    """Every message of ``queue`` (removing them), for assertions."""
    connection = open_connection(vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        out = []
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            out.append(message)
        return out
    finally:
        connection.close()


def get_one(channel: Any, queue: str) -> Any:
    """The next message of ``queue``, waiting for it: Celery publishes without a confirm, on
    another connection, so it may not be there yet."""
    deadline = time.monotonic() + 60
    while (message := channel.basic_get(queue, no_ack=True)) is None:
        assert time.monotonic() < deadline, f"nothing arrived in {queue}"
        time.sleep(0.02)
    return message


def test_the_built_in_families_and_their_dlqs() -> None:
    families = {f.name: f for f in rabbit_families()}
    assert {name: (f.queue, f.dlq) for name, f in families.items()} == {
        "checkout": ("onion-checkout", "onion-checkout-dlq"),
        "default": ("onion", "onion-dlq"),
        "progress": ("onion-progress", "onion-progress-dlq"),
    }
    assert families["checkout"].queue_arguments() == {
        "x-dead-letter-exchange": DLX,
        "x-dead-letter-routing-key": "onion-checkout-dlq",
    }
    quorum = rabbit_families(queue_type="quorum", delivery_limit=3)[0]
    assert quorum.queue_arguments()["x-queue-type"] == "quorum"
    assert quorum.queue_arguments()["x-delivery-limit"] == 3
    assert quorum.dlq_arguments() == {"x-queue-type": "quorum"}
    with pytest.raises(RabbitMQNodeError, match="quorum"):
        rabbit_families(delivery_limit=3)


def test_declared_queues_dead_letter_through_the_dlx_to_their_dlq(rabbitmq_vhost: Vhost) -> None:
    families = rabbit_families()
    connection = open_connection(rabbitmq_vhost.amqp_url)
    try:
        declare_layout(raw_channel(connection), families)
        declare_layout(raw_channel(connection), families)  # again: the same, no 406
    finally:
        connection.close()
    queues = {q["name"]: q for q in api(rabbitmq_vhost, "/api/queues/{vhost}")}
    assert set(queues) == {name for f in families for name in (f.queue, f.dlq)}
    for family in families:
        assert queues[family.queue]["arguments"] == family.queue_arguments()
        assert queues[family.queue]["durable"] is True
        assert queues[family.queue]["type"] == "classic"
    exchange = api(rabbitmq_vhost, f"/api/exchanges/{{vhost}}/{DLX}")
    assert (exchange["type"], exchange["durable"]) == ("direct", True)
    bindings = api(rabbitmq_vhost, f"/api/exchanges/{{vhost}}/{DLX}/bindings/source")
    assert sorted((b["destination"], b["routing_key"]) for b in bindings) == sorted(
        (f.dlq, f.dlq) for f in families
    )


#: What the installed Celery's ``send_task`` writes in ``ignore_result`` when not told: 5.7
#: leaves it None (the worker applies the task's own setting), 5.5 and 5.6 write False.
SEND_TASK_IGNORE_RESULT = None if tuple(celery.VERSION[:2]) >= (5, 7) else False


def test_messages_are_the_ones_celery_publishes(rabbitmq_vhost: Vhost) -> None:
    app = celery.Celery(broker=rabbitmq_vhost.amqp_url, set_as_current=False)
    # A queue Celery declares itself (it declares the queue it sends to without arguments:
    # on the layout's onion-checkout it would fail with 406).
    queue = "probe"
    connection = open_connection(rabbitmq_vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        eta = datetime.now(UTC) + timedelta(hours=1)
        expires = datetime.now(UTC) + timedelta(days=1)
        args, kwargs = [12, "x"], {"amount_cents": 5}
        for task, with_times in (("apps.payments.tasks.capture_payment", True), ("t.plain", False)):
            times: dict[str, Any] = {"eta": eta, "expires": expires} if with_times else {}
            sent = app.send_task(task, args=args, kwargs=kwargs, queue=queue, **times)
            ours = celery_message(task, args, kwargs, task_id=sent.id, **times)
            theirs = get_one(channel, queue)
            assert theirs.body == ours.body
            assert json.loads(theirs.body) == [args, kwargs, json.loads(ours.body)[2]]
            mine, celerys = dict(ours.properties), dict(theirs.properties)
            assert set(mine) == set(celerys)
            headers, celery_headers = (
                mine.pop("application_headers"),
                celerys.pop("application_headers"),
            )
            assert list(headers) == list(celery_headers)  # the same fields, in Celery's order
            for key in ("origin", "eta", "expires"):
                headers.pop(key), celery_headers.pop(key)
            # The sandbox writes Celery 5.7's messages: an older Celery's differ in this alone.
            assert headers["ignore_result"] is None
            assert celery_headers.pop("ignore_result") is SEND_TASK_IGNORE_RESULT
            headers.pop("ignore_result")
            assert headers == celery_headers
            assert mine.pop("reply_to") and celerys.pop("reply_to")
            if with_times:  # milliseconds left until expires: both about a day
                assert abs(int(mine.pop("expiration")) - int(celerys.pop("expiration"))) < 600_000
            assert mine == celerys
            assert "message_id" not in celerys and "timestamp" not in celerys
    finally:
        connection.close()
        app.close()


def test_filled_dlqs_hold_really_dead_lettered_celery_tasks(rabbitmq_vhost: Vhost) -> None:
    families = rabbit_families()
    depths = fill_layout(rabbitmq_vhost.amqp_url, families, 7, seed=3)
    assert depths == {"checkout": 7, "default": 7, "progress": 7}
    for family in families:
        messages = take_all(rabbitmq_vhost, family.dlq)
        assert len(messages) == 7
        expected = sample_celery_messages(family.name, 7, seed=3)
        assert [m.body for m in messages] == [m.body for m in expected]  # order kept
        for message in messages:
            headers = message.properties["application_headers"]
            (death,) = headers["x-death"]
            assert death["reason"] == "rejected"
            assert death["queue"] == family.queue
            assert death["count"] == 1
            assert death["exchange"] == ""
            assert death["routing-keys"] == [family.queue]
            assert headers["x-first-death-queue"] == family.queue
            assert headers["x-first-death-reason"] == "rejected"
            assert message.properties["correlation_id"] == headers["id"]
            assert message.properties["delivery_mode"] == 2
            assert headers["task"].startswith("apps.")
        with open_connection(rabbitmq_vhost.amqp_url) as connection:
            assert queue_depth(raw_channel(connection), family.queue) == 0


def test_quorum_queues_and_dlqs_dead_letter_the_same(rabbitmq_vhost: Vhost) -> None:
    family = rabbit_families(queue_type="quorum", delivery_limit=2)[0]
    assert fill_layout(rabbitmq_vhost.amqp_url, [family], 4) == {"checkout": 4}
    queues = {q["name"]: q for q in api(rabbitmq_vhost, "/api/queues/{vhost}")}
    assert queues[family.queue]["type"] == queues[family.dlq]["type"] == "quorum"
    assert queues[family.queue]["arguments"]["x-delivery-limit"] == 2
    messages = take_all(rabbitmq_vhost, family.dlq)
    assert [m.properties["application_headers"]["x-death"][0]["reason"] for m in messages] == [
        "rejected"
    ] * 4
    # Dead-lettering more into a DLQ that holds some adds to it.
    with open_connection(rabbitmq_vhost.amqp_url) as connection:
        more = sample_celery_messages("checkout", 2, seed=9)
        assert dead_letter(connection, family, more) == 2


def test_pipelined_confirms_settle_every_tag_and_a_return_comes_before_its_ack(
    rabbitmq_vhost: Vhost,
) -> None:
    """What the RabbitMQ backend relies on, seen on the real broker: with confirms
    pipelined, every publish is settled by its own ack or a multiple one (not in tag order:
    an unroutable one is acked at once, a persistent routed one after the disk write), and
    an unroutable mandatory publish's basic.return arrives before the ack that settles it."""
    connection = open_connection(rabbitmq_vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        channel.queue_declare("real", durable=True, auto_delete=False)
        channel.confirm_select()
        confirms = Confirms()
        returned_before_settled: list[bool] = []

        def on_return(exc: Any, exchange: str, routing_key: str, message: Any) -> None:
            assert exc.reply_code == 312  # NO_ROUTE
            tag = message.properties["application_headers"]["tag"]
            returned_before_settled.append(tag in confirms.pending)

        channel.events["basic_ack"].add(lambda t, m: confirms.settle(t, m, ok=True))
        channel.events["basic_return"].add(on_return)
        for _ in range(300):
            tag = confirms.next_tag
            key = "nowhere" if tag % 7 == 0 else "real"
            message = celery_message("t.task", [tag])
            message.properties["application_headers"]["tag"] = tag
            channel.basic_publish(message, exchange="", routing_key=key, mandatory=True)
            confirms.published()
        while confirms.pending:
            connection.drain_events(timeout=60)
        assert (confirms.acked, confirms.nacked) == (300, 0)
        assert returned_before_settled == [True] * (300 // 7)
        assert queue_depth(channel, "real") == 300 - 300 // 7
        with pytest.raises(RabbitMQNodeError, match="0 nacked, 1 unroutable"):
            publish_confirmed(raw_channel(connection), "nowhere", [celery_message("t.x")])
    finally:
        connection.close()


def test_dead_lettering_moves_celerys_expiration_into_x_death(rabbitmq_vhost: Vhost) -> None:
    """Celery turns ``expires`` into the AMQP expiration (a per-message TTL); dead-lettering
    removes it, so the DLQ copy never expires there, and keeps it in x-death's
    ``original-expiration`` (the ``expires`` header stays as Celery wrote it)."""
    family = rabbit_families()[0]
    expires = datetime.now(UTC) + timedelta(days=1)
    message = celery_message("t.expiring", [1], expires=expires)
    connection = open_connection(rabbitmq_vhost.amqp_url)
    try:
        declare_layout(raw_channel(connection), [family])
        assert dead_letter(connection, family, [message]) == 1
        got = raw_channel(connection).basic_get(family.dlq, no_ack=True)
    finally:
        connection.close()
    assert "expiration" not in got.properties
    (death,) = got.properties["application_headers"]["x-death"]
    assert death["original-expiration"] == message.properties["expiration"]
    assert got.properties["application_headers"]["expires"] == expires.isoformat()
