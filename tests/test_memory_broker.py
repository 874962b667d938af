"""The in-memory broker (redrive/broker/memory): what the contract suite does not say of it.
It dead-letters as SQS's redrive policy does, a tag names one receive only, ``memory://NAME``
opens it through the scheme table, and the usage error for an unknown scheme never offers
it (it is for tests only)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from redrive.aws.session import AwsSettings
from redrive.broker import BrokerSettings, broker_scheme, open_broker
from redrive.broker.base import SendEntry
from redrive.broker.memory import MemoryBroker, MemoryStore, forget_store, memory_store
from redrive.config import Family, Layout
from redrive.errors import QueueNotFound, UsageProblem


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    made = memory_store(name)
    made.create_queue("onion-dlq")
    made.create_queue("onion", dead_letter_queue="onion-dlq", max_receive_count=2)
    yield made
    forget_store(name)


def send(broker: MemoryBroker, queue: str, body: str) -> str:
    return broker.send(queue, [SendEntry(id="0", body=body, headers={})]).ok["0"]


def test_a_message_past_its_receive_limit_moves_to_the_dlq(store: MemoryStore) -> None:
    broker = MemoryBroker(store)
    sent = send(broker, "onion", "a task")
    for _ in range(2):
        (got,) = broker.receive("onion", hold=60, wait_seconds=0)
        assert broker.release("onion", {"0": got.tag}).ok == {"0": ""}
    assert broker.receive("onion", hold=60, wait_seconds=0) == []
    (dead,) = broker.receive("onion-dlq", hold=60, wait_seconds=0)
    assert (dead.message_id, dead.body, dead.receive_count) == (sent, "a task", 3)
    assert dead.died_in == broker.describe("onion").ident
    target = broker.resolve(Layout((), "test"), "onion-dlq", lambda region: broker)
    assert (target.dlq.name, [s.name for s in target.sources]) == ("onion-dlq", ["onion"])


def test_a_tag_of_an_earlier_receive_changes_nothing(store: MemoryStore) -> None:
    broker = MemoryBroker(store)
    send(broker, "onion-dlq", "x")
    (first,) = broker.receive("onion-dlq", hold=60, wait_seconds=0)
    broker.release("onion-dlq", {"0": first.tag})
    (second,) = broker.receive("onion-dlq", hold=60, wait_seconds=0)
    assert list(broker.ack("onion-dlq", {"0": first.tag}).failed) == ["0"]
    assert broker.ack("onion-dlq", {"0": second.tag}).ok == {"0": ""}
    assert broker.counts("onion-dlq").ready == broker.counts("onion-dlq").held == 0


def test_a_family_resolves_through_the_source_queues_dlq(store: MemoryStore) -> None:
    broker = MemoryBroker(store)
    layout = Layout((Family(name="onion", queue="onion"),), "test")
    target = broker.resolve(layout, "onion", lambda region: broker)
    assert (target.label, target.dlq.name) == ("onion", "onion-dlq")
    with pytest.raises(QueueNotFound):
        broker.describe("nowhere")


def test_a_restored_copy_keeps_the_metadata_an_archive_kept(store: MemoryStore) -> None:
    broker = MemoryBroker(store)
    send(broker, "onion-dlq", "x")
    (got,) = broker.receive("onion-dlq", hold=60, wait_seconds=0)
    kept = {
        k: got.attributes[k] for k in broker.capabilities.archived_attributes if k in got.attributes
    }
    again = broker.restored(got.message_id, got.body, kept, got.headers)
    assert (again.receive_count, again.enqueued_at, again.tag) == (1, got.enqueued_at, "")


def test_the_scheme_table_opens_it_and_never_offers_it(store: MemoryStore) -> None:
    url = f"memory://{store.name}"
    assert broker_scheme(url) == BrokerSettings(url).backend == "memory"
    opened = open_broker(url, aws=AwsSettings())
    assert isinstance(opened, MemoryBroker) and opened.store is store
    with pytest.raises(UsageProblem) as caught:
        broker_scheme("redis://h")
    assert str(caught.value).endswith(
        "redrive speaks SQS (sqs://, or none) and RabbitMQ (amqp://, amqps://, pyamqp://)"
    )
