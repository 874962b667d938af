"""The ``localstack_endpoint`` fixture: a real LocalStack SQS on 127.0.0.1, driven through
redrive's own SQS broker (``redrive.broker.sqs.SqsBroker``), as the moto server tests drive moto."""

from __future__ import annotations

import uuid

import pytest
from conftest import Family, make_family
from localstack_server import ACCOUNT, VERSION, LocalStackServer, reset_sqs

from redrive.broker.base import Header, SendEntry
from redrive.broker.sqs import SqsBroker as Sqs
from redrive.broker.sqs.calls import request_entry

pytestmark = pytest.mark.e2e


@pytest.fixture
def family(localstack_endpoint: LocalStackServer) -> Family:
    """A source queue and its DLQ (maxReceiveCount 1) of this test's own on LocalStack."""
    name = f"ls-{uuid.uuid4().hex[:12]}"
    return make_family(localstack_endpoint.client(), name, max_receive=1)


@pytest.fixture
def sqs(localstack_endpoint: LocalStackServer) -> Sqs:
    """The adapter on a client of its own (it checks every answer its client gets)."""
    return Sqs(localstack_endpoint.client())


def entries(count: int) -> list[SendEntry]:
    return [
        SendEntry(
            id=str(i),
            body=f'{{"n": {i}}}',
            headers={"task": Header.text(f"t.{i}")},
        )
        for i in range(count)
    ]


def test_it_is_localstack_on_127_0_0_1_with_queue_urls_there(
    localstack_endpoint: LocalStackServer, family: Family
) -> None:
    import json
    import urllib.request

    url = f"{localstack_endpoint.endpoint_url}/_localstack/health"
    with urllib.request.urlopen(url, timeout=10) as response:
        health = json.load(response)
    assert health["version"] == VERSION
    assert health["services"]["sqs"] == "running"
    assert localstack_endpoint.endpoint_url.startswith("http://127.0.0.1:")
    prefix = f"{localstack_endpoint.endpoint_url}/{ACCOUNT}/"
    assert family.queue_url == prefix + family.queue_url.rsplit("/", 1)[1]
    assert family.dlq_url.startswith(prefix)
    assert family.dlq_arn == f"arn:aws:sqs:us-east-1:{ACCOUNT}:{family.dlq_url.rsplit('/', 1)[1]}"


def seed(family: Family, url: str, count: int) -> None:
    """``count`` messages sent with boto3 itself (the adapter's send_batch: see below)."""
    response = family.client.send_message_batch(
        QueueUrl=url, Entries=[request_entry(entry) for entry in entries(count)]
    )
    assert len(response["Successful"]) == count


def test_the_adapter_receives_hides_again_and_deletes_a_batch(family: Family, sqs: Sqs) -> None:
    seed(family, family.dlq_url, 10)
    assert family.depth() == (10, 0)

    got = sqs.receive(family.dlq_url, hold=300)
    assert len(got) == 10  # LocalStack hands out a full batch of a 10-message queue
    assert {m.body for m in got} == {f'{{"n": {i}}}' for i in range(10)}
    assert {m.headers["task"].as_text for m in got} == {f"t.{i}" for i in range(10)}
    assert {m.receive_count for m in got} == {1}
    assert family.depth() == (0, 10)

    # Back in sight at once (timeout 0), and received again: a second receive of each.
    handles = {str(i): m.tag for i, m in enumerate(got)}
    shown = sqs.change_visibility_batch(family.dlq_url, handles, 0)
    assert sorted(shown.ok, key=int) == sorted(handles, key=int)
    assert not shown.failed
    again = sqs.receive(family.dlq_url, hold=300)
    assert {m.message_id for m in again} == {m.message_id for m in got}
    assert {m.receive_count for m in again} == {2}

    deleted = sqs.delete_batch(family.dlq_url, {str(i): m.tag for i, m in enumerate(again)})
    assert len(deleted.ok) == 10
    assert not deleted.failed
    assert family.depth() == (0, 0)


def test_the_adapter_sends_a_batch(family: Family, sqs: Sqs) -> None:
    sent = sqs.send_batch(family.dlq_url, entries(10))
    assert sorted(sent.ok, key=int) == [str(i) for i in range(10)]
    assert family.depth() == (10, 0)


def test_localstack_leaves_out_an_empty_failed_list(family: Family) -> None:
    """What the xfail above meets: a clean SendMessageBatch answers without Failed."""
    raw: list[bytes] = []
    family.client.meta.events.register(
        "after-call.sqs.SendMessageBatch",
        lambda http_response, **_: raw.append(http_response.content),
    )
    seed(family, family.dlq_url, 1)
    assert b'"Successful"' in raw[0]
    assert b'"Failed"' not in raw[0]


def test_a_bad_receipt_handle_fails_its_entry_only(family: Family, sqs: Sqs) -> None:
    seed(family, family.dlq_url, 2)
    got = sqs.receive(family.dlq_url, hold=300)
    assert len(got) == 2
    result = sqs.delete_batch(family.dlq_url, {"good": got[0].tag, "bad": "garbage"})
    assert set(result.ok) == {"good"}
    assert result.failed["bad"].startswith("ReceiptHandleIsInvalid")
    assert family.depth() == (0, 1)


def test_a_message_past_max_receive_count_is_dead_lettered_and_purge_empties(
    family: Family, sqs: Sqs
) -> None:
    seed(family, family.queue_url, 1)
    first = sqs.receive(family.queue_url, hold=300)
    assert len(first) == 1
    sqs.change_visibility_batch(family.queue_url, {"0": first[0].tag}, 0)
    # Its second receive is past maxReceiveCount 1: LocalStack moves it to the DLQ instead.
    assert sqs.receive(family.queue_url, hold=300, wait_seconds=0) == []
    assert family.depth(family.dlq_url) == (1, 0)
    assert sqs.dead_letter_sources(family.dlq_url) == [family.queue_url]
    assert sqs.attributes(family.queue_url, ["RedrivePolicy"])["RedrivePolicy"]
    sqs.purge(family.dlq_url)
    assert family.depth(family.dlq_url) == (0, 0)


def test_reset_deletes_every_queue(localstack_endpoint: LocalStackServer) -> None:
    client = localstack_endpoint.client()
    client.create_queue(QueueName=f"ls-reset-{uuid.uuid4().hex[:12]}")
    reset_sqs(localstack_endpoint)
    assert client.list_queues().get("QueueUrls", []) == []
