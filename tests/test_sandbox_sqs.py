"""The sandbox's extensions of moto answer exactly as stock moto does, without walking queues.

Each differential test runs the same calls against stock moto and against moto with
``redrive.sandbox.moto_sqs.extended()``, in process (``mock_aws``), and compares every answer
after naming message ids and receipt handles by their first appearance (both are random).
The one deliberate difference, the 12-hour visibility ceiling counted from the receive, has
tests of its own.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import botocore.exceptions
import moto
import moto.backends
import pytest
from moto import mock_aws
from moto.core.utils import unix_time_millis
from moto.sqs.models import Message, Queue, SQSBackend, sqs_backends

from redrive.sandbox import moto_sqs

REGION = "us-east-1"
ACCOUNT = "123456789012"


class Names:
    """Random ids and handles, named in the order they first appear."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def __call__(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self(v) for k, v in value.items() if k not in _VOLATILE}
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, str):
            for known, name in self.names.items():
                value = value.replace(known, name)
        return value

    def learn(self, kind: str, value: str) -> None:
        self.names.setdefault(value, f"<{kind}{len(self.names)}>")


# Clock readings, random sequence numbers, request ids and HTTP headers differ between any
# two runs.
_VOLATILE = {
    "ResponseMetadata",
    "SequenceNumber",
    "SentTimestamp",
    "ApproximateFirstReceiveTimestamp",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
}


class Script:
    """A random sequence of SQS calls on a standard queue with a DLQ and a FIFO queue."""

    def __init__(self, client: Any, rng: random.Random) -> None:
        self.client, self.rng, self.names = client, rng, Names()
        self.handles: list[tuple[str, str]] = []
        dlq = client.create_queue(QueueName="diff-dlq")["QueueUrl"]
        arn = client.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])
        policy = {"deadLetterTargetArn": arn["Attributes"]["QueueArn"], "maxReceiveCount": 2}
        source = client.create_queue(
            QueueName="diff-source", Attributes={"RedrivePolicy": json.dumps(policy)}
        )["QueueUrl"]
        fifo = client.create_queue(QueueName="diff.fifo", Attributes={"FifoQueue": "true"})[
            "QueueUrl"
        ]
        self.queues = [source, dlq, fifo]

    def run(self, steps: int) -> list[Any]:
        calls: list[Callable[[], Any]] = [
            self.send,
            self.send,
            self.send_batch,
            self.receive,
            self.receive,
            self.receive,
            self.change_visibility,
            self.change_visibility_batch,
            self.delete,
            self.delete_batch,
            self.attributes,
            self.dead_letter_sources,
        ]
        out = []
        for step in range(steps):
            call = self.rng.choice(calls) if step % 97 else self.purge
            try:
                answer = call()
            except botocore.exceptions.ClientError as exc:
                error = exc.response["Error"]
                answer = ("error", error.get("Code"), error.get("Message"))
            out.append((call.__name__, self.names(answer)))
            # A visibility of 0 makes a message visible from the next millisecond on.
            time.sleep(0.002)
        return out

    def queue(self) -> str:
        return self.rng.choice(self.queues)

    def handle(self) -> tuple[str, str]:
        if not self.handles or self.rng.random() < 0.05:
            return self.queue(), "not-a-receipt-handle"
        url, handle = self.rng.choice(self.handles)
        # Now and then on another queue than the one that issued it.
        return (self.queue() if self.rng.random() < 0.1 else url), handle

    def entry(self, url: str, index: int) -> dict[str, Any]:
        entry: dict[str, Any] = {"Id": str(index), "MessageBody": f"body {self.rng.random()}"}
        if self.rng.random() < 0.3:
            entry["MessageAttributes"] = {
                "n": {"DataType": "Number", "StringValue": str(self.rng.randint(1, 9))}
            }
        if url.endswith(".fifo"):
            entry["MessageGroupId"] = self.rng.choice("ab")
            # A small pool: some sends are duplicates FIFO drops.
            entry["MessageDeduplicationId"] = str(self.rng.randint(1, 12))
        return entry

    def learn_sent(self, answer: dict[str, Any]) -> dict[str, Any]:
        for sent in [answer, *answer.get("Successful", [])]:
            if "MessageId" in sent:
                self.names.learn("id", sent["MessageId"])
        return answer

    def send(self) -> Any:
        url = self.queue()
        entry = self.entry(url, 0)
        entry.pop("Id")
        return self.learn_sent(self.client.send_message(QueueUrl=url, **entry))

    def send_batch(self) -> Any:
        url = self.queue()
        entries = [self.entry(url, i) for i in range(self.rng.randint(1, 10))]
        return self.learn_sent(self.client.send_message_batch(QueueUrl=url, Entries=entries))

    def receive(self) -> Any:
        url = self.queue()
        answer = self.client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=self.rng.randint(1, 10),
            VisibilityTimeout=self.rng.choice((0, 30, 120)),
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
        )
        for message in answer.get("Messages", []):
            self.names.learn("id", message["MessageId"])
            self.names.learn("handle", message["ReceiptHandle"])
            self.handles.append((url, message["ReceiptHandle"]))
        return answer

    def change_visibility(self) -> Any:
        url, handle = self.handle()
        return self.client.change_message_visibility(
            QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=self.rng.choice((0, 30, 120))
        )

    def change_visibility_batch(self) -> Any:
        url = self.queue()
        entries = [
            {"Id": str(i), "ReceiptHandle": self.handle()[1], "VisibilityTimeout": 0}
            for i in range(self.rng.randint(1, 4))
        ]
        return self.client.change_message_visibility_batch(QueueUrl=url, Entries=entries)

    def delete(self) -> Any:
        url, handle = self.handle()
        return self.client.delete_message(QueueUrl=url, ReceiptHandle=handle)

    def delete_batch(self) -> Any:
        url = self.queue()
        handles = list(dict.fromkeys(self.handle()[1] for _ in range(self.rng.randint(1, 4))))
        entries = [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(handles)]
        return self.client.delete_message_batch(QueueUrl=url, Entries=entries)

    def attributes(self) -> Any:
        return self.client.get_queue_attributes(QueueUrl=self.queue(), AttributeNames=["All"])

    def dead_letter_sources(self) -> Any:
        return self.client.list_dead_letter_source_queues(QueueUrl=self.queues[1])

    def purge(self) -> Any:
        return self.client.purge_queue(QueueUrl=self.rng.choice(self.queues[:2]))


def run_script(seed: int, *, extended: bool, steps: int = 300) -> list[Any]:
    with mock_aws(), moto_sqs.extended() if extended else contextlib.nullcontext():
        client = boto3.client("sqs", region_name=REGION)
        return Script(client, random.Random(seed)).run(steps)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_calls_answer_exactly_as_stock_moto(seed: int) -> None:
    stock = run_script(seed, extended=False)
    extended = run_script(seed, extended=True)
    assert [name for name, _ in extended] == [name for name, _ in stock]
    for step, (mine, theirs) in enumerate(zip(extended, stock, strict=True)):
        assert mine == theirs, f"step {step}"
    # The scripts did what they are for: messages dead-lettered, handles refused.
    flat = json.dumps(stock)
    assert '"ApproximateReceiveCount": "3"' in flat
    assert "ReceiptHandleIsInvalid" in flat


# -- no walks of the queue --------------------------------------------------------------------


class CountingList(list[Message]):
    """A queue's messages, counting how often something walks them."""

    walks = 0

    def __iter__(self) -> Iterator[Message]:
        CountingList.walks += 1
        return super().__iter__()


@contextlib.contextmanager
def deep_queue(depth: int, *, extended: bool) -> Iterator[tuple[Any, str, Queue]]:
    with mock_aws(), moto_sqs.extended() if extended else contextlib.nullcontext():
        client = boto3.client("sqs", region_name=REGION)
        url = client.create_queue(QueueName="deep")["QueueUrl"]
        for start in range(0, depth, 10):
            client.send_message_batch(
                QueueUrl=url,
                Entries=[{"Id": str(i), "MessageBody": f"m{start + i}"} for i in range(10)],
            )
        yield client, url, sqs_backends[ACCOUNT][REGION].queues["deep"]


@pytest.mark.parametrize("extended", [False, True], ids=["stock", "extended"])
def test_receive_change_and_delete_do_not_walk_the_queue_per_message(
    extended: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stock moto walks the queue for each message handed out (the retention check reads
    every queue attribute) and compares a handle with every handle of every message to find
    one; the extensions do neither."""
    compared = []
    had = Message.had_receipt_handle

    def counting(self: Message, receipt_handle: str) -> bool:
        compared.append(receipt_handle)
        return had(self, receipt_handle)

    monkeypatch.setattr(Message, "had_receipt_handle", counting)
    with deep_queue(200, extended=extended) as (client, url, queue):
        got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60)
        handles = [m["ReceiptHandle"] for m in got["Messages"]]
        queue._messages = CountingList(queue._messages)
        CountingList.walks = 0
        client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60)
        receive_walks = CountingList.walks
        compared.clear()
        client.change_message_visibility_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": h, "VisibilityTimeout": 0}
                for i, h in enumerate(handles)
            ],
        )
        client.delete_message(QueueUrl=url, ReceiptHandle=handles[0])
        comparisons = len(compared)
    if extended:
        # One walk to find what is visible, no handle compared with another.
        assert (receive_walks, comparisons) == (1, 0)
    else:
        assert receive_walks > 10 and comparisons > 200


# -- the deliberate change: 12 hours from the receive -----------------------------------------


def backdate(url: str, hours: float) -> None:
    queue = sqs_backends[ACCOUNT][REGION].queues[url.rsplit("/", 1)[1]]
    for message in queue._messages:
        message.sent_timestamp = int(unix_time_millis() - hours * 3_600_000)


@pytest.mark.parametrize("extended", [False, True], ids=["stock", "extended"])
def test_visibility_ceiling_counts_from_the_receive(extended: bool) -> None:
    with mock_aws(), moto_sqs.extended() if extended else contextlib.nullcontext():
        client = boto3.client("sqs", region_name=REGION)
        url = client.create_queue(QueueName="old")["QueueUrl"]
        client.send_message(QueueUrl=url, MessageBody="sent 13 hours ago")
        backdate(url, 13)
        [message] = client.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"]

        def change(seconds: int) -> str:
            try:
                client.change_message_visibility(
                    QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=seconds
                )
            except botocore.exceptions.ClientError as exc:
                return str(exc.response["Error"]["Code"])
            return "ok"

        time.sleep(0.005)
        # SQS: a message received a moment ago can be hidden for 30 s (moto: sent 13 h ago).
        assert change(30) == ("ok" if extended else "InvalidParameterValue")
        # ... but not for 12 hours from now: that ends after 12 hours from its receive.
        assert change(43_200) == "InvalidParameterValue"


# -- installing and leaving -------------------------------------------------------------------


def test_leaving_restores_stock_moto_and_messages_keep_working() -> None:
    before = {
        name: Queue.__dict__[name]
        for name in ("messages", "add_message", "delete_message", "pending_message_groups")
    }
    backend_before = SQSBackend.__dict__["change_message_visibility"]
    listing_before = moto.backends.list_of_moto_modules
    with mock_aws():
        client = boto3.client("sqs", region_name=REGION)
        url = client.create_queue(QueueName="round-trip")["QueueUrl"]
        with moto_sqs.extended():
            with moto_sqs.extended():  # nested: one installation
                assert moto_sqs.installed()
                client.send_message(QueueUrl=url, MessageBody="x")
                [got] = client.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"]
            assert moto_sqs.installed()
            assert Queue.__dict__["messages"] is not before["messages"]
        assert not moto_sqs.installed()
        assert {name: Queue.__dict__[name] for name in before} == before
        assert SQSBackend.__dict__["change_message_visibility"] is backend_before
        assert "reset" not in SQSBackend.__dict__
        assert "__new__" not in Message.__dict__
        assert moto.backends.list_of_moto_modules is listing_before
        # Stock moto finds the message the extensions handled, by its own search.
        client.delete_message(QueueUrl=url, ReceiptHandle=got["ReceiptHandle"])
        attrs = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert attrs["ApproximateNumberOfMessages"] == "0"
        assert attrs["ApproximateNumberOfMessagesNotVisible"] == "0"


def test_messages_handed_out_do_not_pile_up_in_motos_instance_list() -> None:
    """moto deep-copies every message a receive hands out, and its BaseModel keeps every
    instance ever made: a scan of 10,000 held on to 11 MB more, every time."""
    with mock_aws(), moto_sqs.extended():
        client = boto3.client("sqs", region_name=REGION)
        url = client.create_queue(QueueName="copies")["QueueUrl"]
        before = len(Message.instances_tracked)
        client.send_message(QueueUrl=url, MessageBody="x")
        for _ in range(20):
            client.receive_message(QueueUrl=url, VisibilityTimeout=0)
        assert len(Message.instances_tracked) == before
        assert moto.backends.list_of_moto_modules() == tuple(
            sorted(moto.backends.list_of_moto_modules())
        )


def test_another_moto_series_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(moto, "__version__", "5.3.0")
    with pytest.raises(RuntimeError, match=r"moto 5\.2\.x, not 5\.3\.0"), moto_sqs.extended():
        pass
    assert not moto_sqs.installed()


def test_delayed_and_in_flight_counts_match_stock() -> None:
    def counts(extended: bool) -> dict[str, str]:
        with mock_aws(), moto_sqs.extended() if extended else contextlib.nullcontext():
            client = boto3.client("sqs", region_name=REGION)
            url = client.create_queue(QueueName="counts")["QueueUrl"]
            for i in range(5):
                client.send_message(QueueUrl=url, MessageBody=str(i))
            client.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=60)
            client.receive_message(QueueUrl=url, MaxNumberOfMessages=2, VisibilityTimeout=60)
            attrs = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
            return {k: v for k, v in attrs["Attributes"].items() if "Number" in k}

    assert (
        counts(True)
        == counts(False)
        == {
            "ApproximateNumberOfMessages": "3",
            "ApproximateNumberOfMessagesDelayed": "1",
            # moto counts a delayed message as not visible too.
            "ApproximateNumberOfMessagesNotVisible": counts(False)[
                "ApproximateNumberOfMessagesNotVisible"
            ],
        }
    )
