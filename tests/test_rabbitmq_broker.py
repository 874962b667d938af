"""What is RabbitMQ's own in its backend (redrive/broker/rabbitmq/), on a private node: the
envelope round trip, routing and confirms, discovery by DLX bindings and policies, holds that
leave a classic queue's order intact, and a quorum queue's delivery count. What every broker
does is tests/test_broker_contract.py's."""

from __future__ import annotations

import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import amqp
import pytest
from amqp import spec
from conftest import missing_component, on_both_rabbitmq, wait_until

from redrive.aws.session import AwsSettings
from redrive.broker import broker_scheme, open_broker
from redrive.broker.base import Header, QueueCounts, SendEntry
from redrive.broker.rabbitmq.broker import RabbitBroker
from redrive.broker.rabbitmq.envelope import envelope_of, unpacked
from redrive.broker.rabbitmq.link import Lane, nack_plan
from redrive.config import Family, built_in_layout
from redrive.errors import (
    BrokerUnavailable,
    HoldsTimedOut,
    NoDeadLetterQueue,
    QueueNotFound,
    UsageProblem,
)
from redrive.ledger import SqliteLedger
from redrive.messages import decode
from redrive.operations.move import MoveEngine, MoveOptions
from redrive.runs.observer import Callbacks
from redrive.sandbox.rabbitmq_layout import (
    celery_message,
    fill_layout,
    open_connection,
    queue_depth,
    rabbit_families,
    raw_channel,
)
from redrive.sandbox.rabbitmq_node import (
    RABBITMQ_SERVER,
    RabbitMQNode,
    Vhost,
    management_request,
    server_installed,
)

pytestmark = pytest.mark.e2e


@pytest.fixture
def channel(rabbitmq_vhost: Vhost) -> Iterator[amqp.Channel]:
    connection = open_connection(rabbitmq_vhost.amqp_url)
    try:
        yield raw_channel(connection)
    finally:
        connection.close()


@pytest.fixture
def broker(rabbitmq_vhost: Vhost) -> RabbitBroker:
    opened = open_broker(
        rabbitmq_vhost.amqp_url, aws=AwsSettings(), rabbitmq_api=rabbitmq_vhost.api_url
    )
    assert isinstance(opened, RabbitBroker)
    return opened


def declare(channel: amqp.Channel, name: str, **arguments: Any) -> None:
    channel.queue_declare(name, durable=True, auto_delete=False, arguments=arguments or None)


def publish(channel: amqp.Channel, queue: str, message: amqp.Message) -> None:
    channel.basic_publish(message, exchange="", routing_key=queue)


def drain(channel: amqp.Channel, queue: str) -> list[amqp.Message]:
    got = []
    while (message := channel.basic_get(queue, no_ack=True)) is not None:
        got.append(message)
    return got


# -- choosing the broker ------------------------------------------------------------------------


def test_celerys_url_forms_are_rabbitmq_and_others_a_usage_error() -> None:
    for url in ("amqp://u:p@h//", "amqps://h/v", "pyamqp://h"):
        assert broker_scheme(url) == "rabbitmq"
    assert broker_scheme(None) == broker_scheme("sqs://") == "sqs"
    with pytest.raises(UsageProblem) as caught:
        broker_scheme("redis://u:secret@h")
    assert "secret" not in str(caught.value)


def test_an_unreachable_broker_is_one_line_with_the_password_masked() -> None:
    broker = open_broker(
        "amqp://guest:hunter2@127.0.0.1:1//", aws=AwsSettings(), rabbitmq_api="http://127.0.0.1:1"
    )
    with pytest.raises(BrokerUnavailable) as caught:
        broker.counts("anything")
    assert "hunter2" not in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(BrokerUnavailable):
        broker.describe("anything")


# -- the envelope --------------------------------------------------------------------------------


@on_both_rabbitmq
def test_a_dead_lettered_celery_task_round_trips_byte_identical_with_typed_headers(
    rabbitmq_vhost: Vhost, channel: amqp.Channel, broker: RabbitBroker
) -> None:
    """Through RabbitMQ's own dead-lettering (x-death with its timestamps), with headers JSON
    cannot carry: the envelope decodes as a Celery task, and a send gives the same message."""
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families()[:1], 0)
    message = celery_message("shop.capture", [1, "€"], {"x": 2}, task_id="t-1")
    message.properties["application_headers"].update(
        {"when": datetime(2024, 5, 1, 12, 0, 0), "price": Decimal("1.50"), "raw": b"\xff\x00"}
    )
    publish(channel, "onion-checkout", message)
    got = channel.basic_get("onion-checkout", no_ack=False)
    channel.basic_reject(got.delivery_tag, requeue=False)
    declare(channel, "elsewhere")

    wait = [broker.receive("onion-checkout-dlq", hold=60) for _ in range(3)]
    (delivery,) = [d for batch in wait for d in batch]
    info = decode(delivery.body)
    assert (info.task, info.task_id, info.delivery_tag) == ("shop.capture", "t-1", None)
    assert delivery.died_in == f"{rabbitmq_vhost.vhost}/onion-checkout"
    assert delivery.enqueued_at is not None and delivery.headers == {}
    body, properties = unpacked(delivery.body, {})
    assert body == message.body
    assert properties["application_headers"]["x-death"][0]["queue"] == "onion-checkout"

    result = broker.send("elsewhere", [SendEntry("0", delivery.body, {})])
    assert result.outcome("0") == "sent"
    (copy,) = drain(channel, "elsewhere")
    assert copy.body == message.body
    headers = copy.properties["application_headers"]
    assert headers["when"] == datetime(2024, 5, 1, 12, 0, 0)
    assert headers["price"] == Decimal("1.50") and headers["raw"] == b"\xff\x00"
    assert headers["id"] == "t-1" and headers["x-death"][0]["reason"] == "rejected"
    assert copy.properties["correlation_id"] == "t-1"
    assert copy.properties["delivery_mode"] == 2
    # Every delivery of one message gives the same envelope (no per-delivery fact in it).
    assert envelope_of(copy.body, copy.properties) == delivery.body


# -- routing and confirms -------------------------------------------------------------------------


def entry(entry_id: str = "0", text: str = '{"n": 1}') -> SendEntry:
    return SendEntry(entry_id, envelope_of(text.encode(), {"content_type": "application/json"}), {})


def test_a_send_to_a_queue_that_does_not_exist_is_returned_so_refused(
    broker: RabbitBroker,
) -> None:
    result = broker.send("no-such-queue", [entry("0"), entry("1")])
    assert result.outcome("0") == result.outcome("1") == "refused"
    assert "NO_ROUTE" in result.failed["0"] or "Returned" in result.failed["0"]


def test_a_nacked_publish_is_refused_and_the_others_sent(
    channel: amqp.Channel, broker: RabbitBroker
) -> None:
    declare(channel, "full", **{"x-max-length": 1, "x-overflow": "reject-publish"})
    result = broker.send("full", [entry("0"), entry("1", '{"n": 2}')])
    assert result.outcome("0") == "sent" and result.outcome("1") == "refused"
    assert "Nacked" in result.failed["1"]


def test_a_publish_whose_confirm_never_comes_is_unconfirmed(
    channel: amqp.Channel, broker: RabbitBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The confirms are lost (the fault: the channel's ack listener is gone): the entries
    may be queued, so they are unconfirmed (in doubt), never sent."""
    declare(channel, "target")
    monkeypatch.setattr("redrive.broker.rabbitmq.link.CONFIRM_TIMEOUT", 1.0)
    broker.sending.work().events["basic_ack"].clear()
    result = broker.send("target", [entry("0"), entry("1"), entry("2")])
    assert result.ok == {} and result.unconfirmed == frozenset("012")
    assert {result.outcome(i) for i in "012"} == {"unconfirmed"}


def test_an_ack_after_the_channel_was_lost_fails_for_that_entry(
    channel: amqp.Channel, broker: RabbitBroker
) -> None:
    declare(channel, "q")
    broker.send("q", [entry("0")])
    (delivery,) = broker.receive("q", hold=60)
    broker.link.close()  # the connection is gone: its delivery is back in the queue
    result = broker.ack("q", {"0": delivery.tag})
    assert result.ok == {} and "StaleTag" in result.failed["0"]
    assert broker.counts("q").ready == 1


# -- discovery ----------------------------------------------------------------------------------


def test_a_family_dlq_is_found_through_the_dlx_bindings(
    rabbitmq_vhost: Vhost, broker: RabbitBroker
) -> None:
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families(), 0)
    target = broker.resolve_family(built_in_layout({}).families[0])
    assert (target.dlq.name, target.sources[0].name) == ("onion-checkout-dlq", "onion-checkout")
    assert target.dlq.ident == f"{rabbitmq_vhost.vhost}/onion-checkout-dlq"
    # The DLQ named as a TARGET finds its source by the same bindings.
    by_dlq = broker.resolve(built_in_layout({}), "onion-progress-dlq", lambda _: broker)
    assert by_dlq.label == "progress"
    with pytest.raises(QueueNotFound):
        broker.describe("nowhere")


def test_a_queue_dead_letters_by_its_policy_and_a_dlx_with_no_queue_says_so(
    rabbitmq_vhost: Vhost, channel: amqp.Channel, broker: RabbitBroker
) -> None:
    channel.exchange_declare("pdlx", "topic", durable=True, auto_delete=False)
    declare(channel, "jobs")
    declare(channel, "jobs-dead")
    channel.queue_bind("jobs-dead", "pdlx", routing_key="jobs.#")
    vhost = urllib.parse.quote(rabbitmq_vhost.vhost, safe="")
    management_request(
        rabbitmq_vhost.api_url,
        "PUT",
        f"/api/policies/{vhost}/dl",
        {
            "pattern": "^jobs$",
            "apply-to": "queues",
            "definition": {"dead-letter-exchange": "pdlx", "dead-letter-routing-key": "jobs.x"},
        },
    )
    family = Family(name="jobs", queue="jobs")

    def resolved() -> str:
        return broker.resolve_family(family).dlq.name

    wait_until(lambda: _quiet(resolved) == "jobs-dead", "the policy applies")
    channel.queue_unbind("jobs-dead", "pdlx", routing_key="jobs.#")
    with pytest.raises(NoDeadLetterQueue) as caught:
        broker.resolve_family(family)
    assert "routes it to no queue" in str(caught.value)


def _quiet(call: Any) -> Any:
    try:
        return call()
    except Exception:
        return None


# -- holds ------------------------------------------------------------------------------------


@on_both_rabbitmq
def test_holding_and_releasing_every_message_leaves_a_classic_queue_in_order(
    channel: amqp.Channel, broker: RabbitBroker
) -> None:
    declare(channel, "ordered")
    broker.send("ordered", [entry(str(i), f'{{"n": {i}}}') for i in range(250)])
    held = []
    while batch := broker.receive("ordered", hold=60, max_messages=100):
        held += batch
    assert len(held) == 250 and broker.counts("ordered").held == 250
    # Released in another order than received: the queue keeps its own.
    result = broker.release("ordered", {str(i): d.tag for i, d in reversed(list(enumerate(held)))})
    assert len(result.ok) == 250
    # A release has no reply, and goes by the broker's next call or count: the requeue
    # lands a moment after that.
    broker.counts("ordered")
    wait_until(lambda: queue_depth(channel, "ordered") == 250, "every copy is back")
    assert [m.body for m in drain(channel, "ordered")] == [
        f'{{"n": {i}}}'.encode() for i in range(250)
    ]


@on_both_rabbitmq
def test_a_quorum_queue_counts_deliveries(channel: amqp.Channel, broker: RabbitBroker) -> None:
    declare(channel, "qq", **{"x-queue-type": "quorum", "x-delivery-limit": 5})
    assert broker.describe("qq").max_receive_count == 5
    broker.send("qq", [entry()])
    (first,) = broker.receive("qq", hold=60)
    broker.release("qq", {"0": first.tag})
    (second,) = broker.receive("qq", hold=60)
    assert (first.receive_count, second.receive_count) == (0, 1)
    # The count is the delivery's, not the message's: the envelope and id stay the same.
    assert (first.body, first.message_id) == (second.body, second.message_id)


# -- keys ----------------------------------------------------------------------------------------


def test_a_reused_task_id_gets_a_key_per_publish_and_a_redelivery_keeps_its_key(
    rabbitmq_vhost: Vhost, channel: amqp.Channel, broker: RabbitBroker
) -> None:
    """Celery on RabbitMQ stamps no per-publish delivery_tag: the key names the publish by
    a digest of the envelope (body and headers, x-death included). Two publishes of one task
    id with other arguments get two keys; the same message delivered again keeps its own."""
    from redrive.keys import key_for

    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families()[:1], 0)
    for args in ([1], [2]):
        publish(channel, "onion-checkout", celery_message("shop.capture", args, task_id="same"))
    for _ in range(2):
        got = channel.basic_get("onion-checkout", no_ack=False)
        channel.basic_reject(got.delivery_tag, requeue=False)

    def keys() -> list[str]:
        held = [d for _ in range(3) for d in broker.receive("onion-checkout-dlq", hold=60)]
        broker.release("onion-checkout-dlq", {str(i): d.tag for i, d in enumerate(held)})
        return [
            key_for(
                decode(d.body),
                message_id=d.message_id,
                generation=0,
                body=d.body,
                namespace=broker.capabilities.key_namespace,
            )
            for d in held
        ]

    first = keys()
    assert len(first) == 2 and len(set(first)) == 2
    assert all(k.startswith("celery:same:") for k in first)
    # Released copies come back (rejects have no reply): the same keys, redelivered or not.
    wait_until(lambda: sorted(keys()) == sorted(first), "the same keys on redelivery")


# -- lanes: a connection per broker, acks on the channel a copy came on ---------------------------


def test_each_broker_has_its_own_lane_and_a_copy_settles_on_the_lane_it_came_on(
    channel: amqp.Channel, rabbitmq_vhost: Vhost
) -> None:
    """Two brokers of one URL (two workers) hold on connections of their own; either one
    acks or releases any copy, on the channel it came on. Once one lane's connection is gone,
    its copies fail per entry in a batch that settles the other lane's, and nothing raises."""
    declare(channel, "lanes")
    first, second = (
        open_broker(rabbitmq_vhost.amqp_url, aws=AwsSettings(), rabbitmq_api=rabbitmq_vhost.api_url)
        for _ in range(2)
    )
    assert isinstance(first, RabbitBroker) and isinstance(second, RabbitBroker)
    assert first.lane is not second.lane and first.link is second.link
    first.send("lanes", [entry(str(i), f'{{"n": {i}}}') for i in range(6)])
    mine = first.receive("lanes", hold=60, max_messages=3)
    theirs = second.receive("lanes", hold=60, max_messages=3)
    assert len(mine) == len(theirs) == 3
    assert {d.tag.split(".")[0] for d in mine} != {d.tag.split(".")[0] for d in theirs}
    assert first.counts("lanes").held == 6

    result = second.ack("lanes", {"m0": mine[0].tag, "t0": theirs[0].tag})
    assert set(result.ok) == {"m0", "t0"} and not result.failed
    first.lane.close()  # first's connection is gone: its two held copies are back
    tags = {"m1": mine[1].tag, "m2": mine[2].tag, "t1": theirs[1].tag, "t2": theirs[2].tag}
    result = first.release("lanes", tags)
    assert set(result.ok) == {"t1", "t2"}
    assert set(result.failed) == {"m1", "m2"} and "StaleTag" in result.failed["m1"]
    assert first.counts("lanes") == QueueCounts(ready=4, held=0)
    assert sorted(m.body for m in drain(channel, "lanes")) == sorted(
        f'{{"n": {i}}}'.encode() for i in (1, 2, 4, 5)
    )


def hold_thirty(channel: amqp.Channel, broker: RabbitBroker, queue: str) -> list[Any]:
    """30 copies sent to a new ``queue`` (bodies ``{"n": i}``), every one received and held."""
    declare(channel, queue)
    broker.send(queue, [entry(str(i), f'{{"n": {i}}}') for i in range(30)])
    held = []
    while batch := broker.receive(queue, hold=60, max_messages=10):
        held += batch
    assert len(held) == 30
    return held


def test_a_batch_of_a_channels_lowest_tags_is_one_multiple_ack_that_takes_no_other(
    channel: amqp.Channel, broker: RabbitBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acks go as one ``multiple`` ack only for a batch that is exactly the channel's lowest
    unacked tags: a later batch, with copies still held below it, is acked one by one, and
    those held copies stay held (then released, they are all back)."""
    held = hold_thirty(channel, broker, "multi")
    work = broker.lane.work()
    acks: list[tuple[int, bool]] = []
    real_ack = work.basic_ack

    def recorded(delivery_tag: int, multiple: bool = False) -> None:
        acks.append((delivery_tag, multiple))
        real_ack(delivery_tag, multiple=multiple)

    monkeypatch.setattr(work, "basic_ack", recorded)

    def ack(copies: list[Any]) -> None:
        result = broker.ack("multi", {str(i): d.tag for i, d in enumerate(copies)})
        assert len(result.ok) == len(copies) and not result.failed

    ack(held[20:30])  # held[0:20] are below: one by one
    assert len(acks) == 10 and not any(multiple for _, multiple in acks)
    acks.clear()
    ack(list(reversed(held[0:10])))  # the lowest ten, in any order: one multiple ack
    assert len(acks) == 1 and acks[0][1]
    assert broker.counts("multi") == QueueCounts(ready=0, held=10)
    result = broker.release("multi", {str(i): d.tag for i, d in enumerate(held[10:20])})
    assert len(result.ok) == 10
    broker.counts("multi")  # what sends the release
    wait_until(lambda: queue_depth(channel, "multi") == 10, "the released copies are back")
    assert [m.body for m in drain(channel, "multi")] == [
        f'{{"n": {i}}}'.encode() for i in range(10, 20)
    ]
    # Acked once, a tag is stale: it fails for its entry and closes nothing.
    again = broker.ack("multi", {"0": held[0].tag})
    assert "StaleTag" in again.failed["0"] and broker.lane.work() is work


def test_a_release_of_a_channels_lowest_tags_is_one_multiple_nack_that_takes_no_other(
    channel: amqp.Channel, broker: RabbitBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Released copies go back by the broker's next count (or call): those below the lowest
    copy still held as one ``multiple`` nack with requeue (a scan's end gives a lane's holds
    back in one frame), those above it rejected one by one (a nack would take the held ones,
    which stay held). The queue keeps its order either way."""
    held = hold_thirty(channel, broker, "nacked")
    work = broker.lane.work()
    frames: list[tuple[Any, Any]] = []
    real_send = work.send_method

    def recorded(method: Any, signature: Any = None, args: Any = None, **more: Any) -> Any:
        if method in (spec.Basic.Nack, spec.Basic.Reject):
            frames.append((method, args))
        return real_send(method, signature, args, **more)

    monkeypatch.setattr(work, "send_method", recorded)

    def release(copies: list[Any]) -> None:
        result = broker.release("nacked", {str(i): d.tag for i, d in enumerate(copies)})
        assert len(result.ok) == len(copies) and not result.failed

    release(held[20:30])  # held[0:20] are below: one by one
    assert frames == []  # given back by the next count, or the lane's next call
    assert broker.counts("nacked").held == 20
    assert [m for m, _ in frames] == [spec.Basic.Reject] * 10
    frames.clear()
    release(list(reversed(held[0:10])))  # the lowest ten, in any order: one multiple nack
    last = int(held[9].tag.rsplit(":", 1)[1])
    assert broker.counts("nacked").held == 10  # held[10:20] stay held
    assert frames == [(spec.Basic.Nack, (last, True, True))]
    wait_until(lambda: queue_depth(channel, "nacked") == 20, "the released copies are back")
    release(held[10:20])
    broker.counts("nacked")
    wait_until(lambda: queue_depth(channel, "nacked") == 30, "every copy is back")
    assert [m.body for m in drain(channel, "nacked")] == [
        f'{{"n": {i}}}'.encode() for i in range(30)
    ]


def test_releases_of_a_lanes_lowest_tags_wait_as_one_nack_that_no_ack_can_take(
    channel: amqp.Channel, broker: RabbitBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch after batch released, in any order, is one nack, sent when the lane next does
    anything (a count, a receive, an ack): RabbitMQ's cost per nack grows with the queue, and
    a scan's end of 100,000 holds was 70 s of it in batches of 100. A ``multiple`` ack after
    such releases sends the nack first, so it takes none of them (they are back), and a lane
    closed first gives them back all the same."""
    held = hold_thirty(channel, broker, "waiting")
    work = broker.lane.work()
    frames: list[tuple[Any, Any]] = []
    real_send = work.send_method

    def recorded(method: Any, signature: Any = None, args: Any = None, **more: Any) -> Any:
        if method in (spec.Basic.Nack, spec.Basic.Reject, spec.Basic.Ack):
            frames.append((method, args))
        return real_send(method, signature, args, **more)

    monkeypatch.setattr(work, "send_method", recorded)
    for start in (10, 0, 5):
        result = broker.release("waiting", {str(i): held[i].tag for i in range(start, start + 5)})
        assert len(result.ok) == 5
    assert frames == []
    tag = [int(d.tag.rsplit(":", 1)[1]) for d in held]
    # The lowest unacked now are held[15:]: a multiple ack of five, after the nack.
    acked = broker.ack("waiting", {str(i): held[i].tag for i in range(15, 20)})
    assert len(acked.ok) == 5
    assert [m for m, _ in frames] == [spec.Basic.Nack, spec.Basic.Ack]
    assert frames[0][1] == (tag[14], True, True)
    wait_until(lambda: queue_depth(channel, "waiting") == 15, "the released copies are back")
    assert [m.body for m in drain(channel, "waiting")] == [
        f'{{"n": {i}}}'.encode() for i in range(15)
    ]
    # Held back, then the lane closes: the broker gives them back with the rest.
    broker.release("waiting", {str(i): held[i].tag for i in range(20, 25)})
    broker.lane.close()
    wait_until(lambda: queue_depth(channel, "waiting") == 10, "every held copy is back")
    assert [m.body for m in drain(channel, "waiting")] == [
        f'{{"n": {i}}}'.encode() for i in range(20, 30)
    ]


def test_an_unedited_copy_sent_as_received_is_the_message_its_envelope_gives(
    rabbitmq_vhost: Vhost, channel: amqp.Channel, broker: RabbitBroker
) -> None:
    """A move that edits nothing sends the delivery's own body and properties (``native``),
    never decoding the envelope: the same message on the wire as the envelope's round trip
    (typed headers, x-death, redrive's marks), under the same id."""
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families()[:1], 0)
    message = celery_message("shop.capture", [1, "€"], {"x": 2}, task_id="t-n")
    message.properties["application_headers"].update(
        {"when": datetime(2024, 5, 1, 12, 0, 0), "price": Decimal("1.50"), "raw": b"\xff\x00"}
    )
    message.properties["delivery_mode"] = 1  # the copy is persistent all the same
    publish(channel, "onion-checkout", message)
    got = channel.basic_get("onion-checkout", no_ack=False)
    channel.basic_reject(got.delivery_tag, requeue=False)
    declare(channel, "as-received")
    declare(channel, "from-envelope")
    wait = [broker.receive("onion-checkout-dlq", hold=60) for _ in range(3)]
    (delivery,) = [d for batch in wait for d in batch]
    assert delivery.native is not None
    marks = {"redrive-key": Header.text("celery:t-n:g0")}
    native = broker.send(
        "as-received", [SendEntry("0", delivery.body, marks, native=delivery.native)]
    )
    decoded = broker.send("from-envelope", [SendEntry("0", delivery.body, marks)])
    assert native.ok == decoded.ok and native.outcome("0") == "sent"
    (one,) = drain(channel, "as-received")
    (other,) = drain(channel, "from-envelope")
    assert one.body == other.body == message.body
    assert one.properties == other.properties
    assert one.properties["delivery_mode"] == 2
    assert one.properties["application_headers"]["redrive-key"] == "celery:t-n:g0"
    assert one.properties["application_headers"]["x-death"][0]["queue"] == "onion-checkout"


def test_a_nack_plan_gives_back_below_the_lowest_held_tag_in_one_frame() -> None:
    assert nack_plan([5, 3, 9, 1], None) == (9, [])
    assert nack_plan([5, 3, 9, 1], 4) == (3, [5, 9])
    assert nack_plan([7, 6], 2) == (0, [6, 7])
    assert nack_plan([], None) == (0, [])


# -- a hold past consumer_timeout, on the node itself (issue 24) -------------------------------


def set_consumer_timeout(node: RabbitMQNode, value: str) -> None:
    """Set the node's consumer_timeout (ms, or ``undefined``) for channels opened from now
    on. RabbitMQ 3.10 reads it when a channel opens and has no per-queue setting (3.12's
    x-consumer-timeout): a node-wide setting, so the test takes a node of its own (the run's
    shared node serves every worker's tests at once)."""
    ctl = RABBITMQ_SERVER.with_name("rabbitmqctl")
    script = f"application:set_env(rabbit, consumer_timeout, {value})."
    done = subprocess.run(
        [str(ctl), "eval", script], env=node.env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-1000:]


@pytest.fixture
def short_timeout_vhost(tmp_path: Path) -> Iterator[Vhost]:
    """A vhost on a node of this test's own whose consumer_timeout is 1 s."""
    if not server_installed():
        missing_component(
            f"no RabbitMQ ({RABBITMQ_SERVER} is missing): apt-get install rabbitmq-server"
        )
    with RabbitMQNode(tmp_path / "rabbitmq").start() as node:
        set_consumer_timeout(node, "1000")
        yield node.create_vhost("timed")


@pytest.fixture
def timed_channel(short_timeout_vhost: Vhost) -> Iterator[amqp.Channel]:
    connection = open_connection(short_timeout_vhost.amqp_url)
    try:
        yield raw_channel(connection)
    finally:
        connection.close()


def test_a_hold_past_the_nodes_consumer_timeout_is_one_error_and_every_copy_comes_back(
    short_timeout_vhost: Vhost, timed_channel: amqp.Channel
) -> None:
    """The broker closes the channel holding a delivery past consumer_timeout (3.10 checks
    on its channel tick, about once a minute): the next call on it raises HoldsTimedOut (one
    line, exit 1), never a bare AMQP error, and every copy the lane held is back in its
    queue, in order. The lane is connected again on its next call."""
    rabbitmq_vhost, channel = short_timeout_vhost, timed_channel
    declare(channel, "timed")
    for i in range(20):
        publish(channel, "timed", amqp.Message(f'{{"n": {i}}}'.encode()))
    broker = open_broker(
        rabbitmq_vhost.amqp_url, aws=AwsSettings(), rabbitmq_api=rabbitmq_vhost.api_url
    )
    held = broker.receive("timed", hold=60, max_messages=5)
    assert len(held) == 5
    deadline = time.monotonic() + 180  # a bound for a hang: the tick comes within ~60 s
    with pytest.raises(HoldsTimedOut) as raised:
        while time.monotonic() < deadline:
            held += broker.receive("timed", hold=60, max_messages=1)
            time.sleep(0.5)  # one receive a half second until the broker closes the channel
    (line,) = str(raised.value).splitlines()
    assert "consumer_timeout" in line and "back in its queue" in line
    wait_until(lambda: queue_depth(channel, "timed") == 20, "every held copy is back")
    # The API's unacked count lags by its statistics interval.
    wait_until(lambda: broker.counts("timed") == QueueCounts(ready=20, held=0), "none held")
    assert [m.body for m in drain(channel, "timed")] == [
        f'{{"n": {i}}}'.encode() for i in range(20)
    ]


def recorded_writes(lane: Lane, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """What the lane's socket is given from now on, one item a write (its work channel
    connected, open and confirming first)."""
    lane.work()
    connection = lane._connection
    assert connection is not None
    written: list[bytes] = []
    real_write = connection.transport.write

    def recorded(data: Any) -> None:
        written.append(bytes(data))
        real_write(data)

    monkeypatch.setattr(connection.transport, "write", recorded)
    return written


def test_a_batch_of_publishes_is_one_write_and_the_same_messages(
    channel: amqp.Channel, broker: RabbitBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """py-amqp's frame writer, corked (redrive/broker/rabbitmq/frames.py): a batch's 50
    publishes reach the socket in one write (not 50), every one confirmed and queued as
    sent; frames outside a batch (a receive's) are written at once as before."""
    declare(channel, "corked")
    writes = recorded_writes(broker.sending, monkeypatch)
    result = broker.send("corked", [entry(str(i), f'{{"n": {i}}}') for i in range(50)])
    assert len(result.ok) == 50 and not result.failed
    assert len(writes) == 1
    receiving = recorded_writes(broker.lane, monkeypatch)
    got = broker.receive("corked", hold=60, max_messages=50)
    assert len(receiving) > 1  # the receive's qos and consume went out uncorked
    assert [unpacked(d.body, {})[0] for d in got] == [f'{{"n": {i}}}'.encode() for i in range(50)]


def test_publishes_before_one_that_fails_to_frame_are_on_the_wire_all_the_same(
    channel: amqp.Channel, broker: RabbitBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cork writes what the batch framed even when a later publish fails to frame (py-amqp
    raises a connection error, and the lane drops its connection): the earlier messages go on
    the wire as they would uncorked, and the whole batch is in doubt (the broker may or may
    not have queued them before the connection went), never refused: the ledger never
    resends them blindly."""
    declare(channel, "half")
    written = recorded_writes(broker.lane, monkeypatch)
    good = [(str(i), f'{{"n": {i}}}'.encode(), {"delivery_mode": 2}) for i in range(3)]
    bad = ("3", b"{}", {"application_headers": {"x": object()}})  # py-amqp cannot frame it
    refused, unconfirmed = broker.lane.publish("half", [*good, bad])
    assert refused == {} and unconfirmed == {"0", "1", "2", "3"}
    (flushed,) = written  # one write, after the failure
    assert all(body in flushed for _, body, _ in good)
    assert broker.lane._connection is None  # dropped: its next call connects again


def test_a_batch_of_deliveries_is_read_in_few_recvs_and_a_timeout_loses_nothing(
    channel: amqp.Channel, broker: RabbitBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lane reads its frames buffered (redrive/broker/rabbitmq/frames.py): 50 deliveries,
    150 frames and more, come in at most a recv each (py-amqp's own reads are three a
    frame), the same messages and headers; a drain that times out with nothing to read
    leaves the connection as it was, for the next receive."""
    declare(channel, "buffered")
    for i in range(60):
        headers = {"i": i, "when": datetime(2024, 5, 1, 12, 0, i % 60), "raw": b"\xff"}
        message = amqp.Message(f'{{"n": {i}}}'.encode(), application_headers=headers)
        publish(channel, "buffered", message)
    broker.lane.work()
    connection = broker.lane._connection
    assert connection is not None
    reader = connection.transport.frames
    recvs: list[int] = []
    real_recv = reader._recv

    def recorded(n: int) -> bytes:
        data: bytes = real_recv(n)
        recvs.append(len(data))
        return data

    monkeypatch.setattr(reader, "_recv", recorded)
    got = broker.receive("buffered", hold=60, max_messages=50)
    assert 0 < len(recvs) <= 50
    assert [unpacked(d.body, {}) for d in got] == [
        (
            f'{{"n": {i}}}'.encode(),
            {
                "application_headers": {
                    "i": i,
                    "when": datetime(2024, 5, 1, 12, 0, i % 60),
                    "raw": b"\xff",
                },
            },
        )
        for i in range(50)
    ]
    with pytest.raises(TimeoutError):
        connection.drain_events(timeout=0.05)  # nothing is coming: a timeout, not an error
    rest = broker.receive("buffered", hold=60, max_messages=50)
    assert [unpacked(d.body, {})[0] for d in rest] == [
        f'{{"n": {i}}}'.encode() for i in range(50, 60)
    ]


def test_a_receive_promised_more_than_is_left_ends_when_none_are_ready(
    channel: amqp.Channel, broker: RabbitBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receive's window comes from a count, and a second worker (or process) may take part
    of it first: once no delivery comes for a moment and none is ready, the receive ends
    with what it got, instead of waiting out its delivery timeout (made ten minutes here,
    so that a receive that waited it out would show)."""
    monkeypatch.setattr("redrive.broker.rabbitmq.link.DELIVERY_TIMEOUT", 600.0)
    declare(channel, "promised")
    broker.send("promised", [entry(str(i), f'{{"n": {i}}}') for i in range(10)])
    started = time.monotonic()
    got = broker.lane.get("promised", 20, 20)  # a count of 20: ten of them taken already
    assert len(got) == 10
    assert time.monotonic() - started < 600
    settled = broker.ack("promised", {str(i): d.tag for i, d in enumerate(got)})
    assert len(settled.ok) == 10
    assert drain(channel, "promised") == []


def test_receives_counts_and_acks_never_open_the_publishing_lane(
    channel: amqp.Channel, broker: RabbitBroker
) -> None:
    """A broker publishes on a lane of its own, connected on its first send: an inspect
    (receives, counts, acks and releases) never opens that second connection."""
    declare(channel, "quiet")
    publish(channel, "quiet", amqp.Message(b'{"n": 1}'))
    (delivery,) = broker.receive("quiet", hold=60)
    broker.counts("quiet")
    assert len(broker.ack("quiet", {"0": delivery.tag}).ok) == 1
    assert broker.lane._connection is not None and broker.sending._connection is None
    assert len(broker.send("quiet", [entry("0")]).ok) == 1
    assert broker.sending._connection is not None


def test_a_send_that_cannot_connect_is_refused_whole_none_of_it_in_doubt() -> None:
    """Nothing of a batch is written when the (re)connect fails (a host whose broker link was
    cut): each entry is refused as not published, so its claim is released, never held in
    doubt (raised, the whole batch stayed claimed: a second batch per worker in doubt after
    the one the lost connection left unconfirmed, tests/test_partition_hosts.py)."""
    broker = open_broker(
        "amqp://guest:hunter2@127.0.0.1:1//", aws=AwsSettings(), rabbitmq_api="http://127.0.0.1:1"
    )
    result = broker.send("q", [entry("0"), entry("1")])
    assert result.ok == {} and result.unconfirmed == frozenset()
    assert set(result.failed) == {"0", "1"} and "NotPublished" in result.failed["0"]


@on_both_rabbitmq
def test_a_move_declares_no_target_and_a_target_deleted_mid_run_is_refused(
    rabbitmq_vhost: Vhost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The passive declares of a move, counted on the node: none of the target (a publish is
    mandatory, so a target that is gone comes back returned, refused, and stays in the DLQ),
    and two of the DLQ per batch, each for its own count: the receive's (how many are ready:
    its consumer window) and the returns check's (the DLQ's exact count after it)."""
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families(), 150)
    declared: list[str] = []
    real_declare = amqp.Channel.queue_declare

    def counted(channel: amqp.Channel, queue: str = "", passive: bool = False, **kw: Any) -> Any:
        if passive:
            declared.append(queue)
        return real_declare(channel, queue, passive, **kw)

    monkeypatch.setattr(amqp.Channel, "queue_declare", counted)
    events: list[str] = []

    def step(name: str) -> None:
        events.extend(f"declare {queue}" for queue in declared)
        declared.clear()
        events.append(name)
        if name == "deleted" and events.count("deleted") == 1:
            connection = open_connection(rabbitmq_vhost.amqp_url)
            raw_channel(connection).queue_delete("onion-checkout")
            connection.close()

    def opened() -> Any:
        url, api = rabbitmq_vhost.amqp_url, rabbitmq_vhost.api_url
        return open_broker(url, aws=AwsSettings(), rabbitmq_api=api)

    target = opened().resolve_family(built_in_layout({}).family("checkout"))
    options = MoveOptions(execute=True, pipelined=False)
    with SqliteLedger(tmp_path / "l.sqlite3") as ledger:
        engine = MoveEngine(
            target, ledger, options, broker_factory=opened, observer=Callbacks(on_step=step)
        )
        result = engine.run()
    batches = "|".join(events).split("|received|")[1:]
    assert len(batches) >= 2, events
    assert not any("declare onion-checkout|" in f"{e}|" for e in events), events
    for batch in batches:
        assert batch.count("declare onion-checkout-dlq") <= 2, batch
    # The batch after the target was deleted: returned, refused, left in the DLQ.
    assert result.moved + result.failed == 150 and result.failed > 0, result
    assert all("Returned" in m.detail for m in result.failed_messages), result
    connection = open_connection(rabbitmq_vhost.amqp_url)
    assert queue_depth(raw_channel(connection), "onion-checkout-dlq") == result.failed
    connection.close()
