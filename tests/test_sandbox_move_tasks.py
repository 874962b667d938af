"""The sandbox's message move tasks (StartMessageMoveTask, ListMessageMoveTasks, Cancel...),
through its HTTP server, as redrive's ``--native`` path and ``tasks`` command call them.

Each test makes queues with names of its own: moto's state is shared by the process.
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import botocore.exceptions
import pytest

from redrive import sandbox
from redrive.broker.base import DlqTarget, QueueRef
from redrive.broker.sqs import SqsBroker
from redrive.broker.sqs.native import cancel_move_task, follow_native_move, list_move_tasks
from redrive.config import Family, Layout


@pytest.fixture(scope="module")
def server() -> Iterator[sandbox.SandboxServer]:
    with sandbox.start_server() as running:
        yield running


@pytest.fixture
def client(server: sandbox.SandboxServer) -> Iterator[Any]:
    made = sandbox.client_for(server)
    yield made
    made.close()


@dataclass
class Dlq:
    client: Any
    queue_url: str
    dlq_url: str

    def arn(self, url: str | None = None) -> str:
        attrs = self.client.get_queue_attributes(
            QueueUrl=url or self.dlq_url, AttributeNames=["QueueArn"]
        )
        return str(attrs["Attributes"]["QueueArn"])

    def peek(self, url: str) -> collections.Counter[str]:
        """Every body in a queue, left there (received, then made visible again)."""
        got: list[dict[str, Any]] = []
        while batch := self.client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=30, WaitTimeSeconds=0
        ).get("Messages", []):
            got.extend(batch)
        for message in got:
            self.client.change_message_visibility(
                QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
            )
        time.sleep(0.01)  # visible from the next millisecond on
        return collections.Counter(m["Body"] for m in got)

    def bodies(self, url: str) -> collections.Counter[str]:
        """Every body in a queue (received and deleted)."""
        out: collections.Counter[str] = collections.Counter()
        while got := self.client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=30, WaitTimeSeconds=0
        ).get("Messages", []):
            for message in got:
                out[message["Body"]] += 1
                self.client.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        return out

    def tasks(self, limit: int = 10) -> list[dict[str, Any]]:
        return list(
            self.client.list_message_move_tasks(SourceArn=self.arn(), MaxResults=limit)["Results"]
        )


def make_dlq(client: Any, count: int, *, seeded: bool = True) -> Dlq:
    """A source queue and its DLQ, with ``count`` messages dead-lettered by moto (or, without
    ``seeded``, sent to the DLQ directly)."""
    name = f"mt-{uuid.uuid4().hex[:8]}"
    layout = Layout(families=(Family(name, name),), source="t")
    if seeded:
        [family] = sandbox.seed(client, layout, per_family=count)
        return Dlq(client, family.queue_url, family.dlq_url)
    [(_, queue_url, dlq_url)] = sandbox.create_layout(client, layout)
    for i in range(count):
        client.send_message(QueueUrl=dlq_url, MessageBody=f"direct {i}")
    return Dlq(client, queue_url, dlq_url)


def wait_for(condition: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return result


def error_of(call: Callable[[], Any]) -> tuple[str, str]:
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        call()
    error = caught.value.response["Error"]
    return str(error["Code"]), str(error["Message"])


def test_a_task_moves_every_message_back_to_its_source_byte_identical(client: Any) -> None:
    dlq = make_dlq(client, 25)
    expected = dlq.peek(dlq.dlq_url)
    assert sum(expected.values()) == 25
    started = time.time() * 1000
    handle = client.start_message_move_task(SourceArn=dlq.arn())["TaskHandle"]
    [task] = wait_for(lambda: [t for t in dlq.tasks() if t["Status"] == "COMPLETED"])
    assert task == {
        "Status": "COMPLETED",
        "SourceArn": dlq.arn(),
        "ApproximateNumberOfMessagesMoved": 25,
        "ApproximateNumberOfMessagesToMove": 25,
        "StartedTimestamp": task["StartedTimestamp"],
    }
    assert started - 1000 <= task["StartedTimestamp"] <= time.time() * 1000
    assert handle and "TaskHandle" not in task  # SQS lists the handle only while RUNNING
    assert dlq.bodies(dlq.dlq_url) == collections.Counter()
    assert dlq.bodies(dlq.queue_url) == expected


def test_message_attributes_travel_with_the_message(client: Any) -> None:
    dlq = make_dlq(client, 0)
    attributes = {
        "trace-id": {"DataType": "String", "StringValue": "abc"},
        "n": {"DataType": "Number", "StringValue": "7"},
    }
    client.send_message(QueueUrl=dlq.dlq_url, MessageBody="with", MessageAttributes=attributes)
    client.start_message_move_task(SourceArn=dlq.arn())
    wait_for(lambda: dlq.tasks()[0]["Status"] == "COMPLETED")
    [moved] = client.receive_message(QueueUrl=dlq.queue_url, MessageAttributeNames=["All"])[
        "Messages"
    ]
    assert moved["Body"] == "with"
    assert moved["MessageAttributes"] == attributes


def test_a_destination_and_a_rate(client: Any) -> None:
    dlq = make_dlq(client, 30)
    elsewhere = client.create_queue(QueueName=f"mt-elsewhere-{uuid.uuid4().hex[:6]}")["QueueUrl"]
    began = time.monotonic()
    client.start_message_move_task(
        SourceArn=dlq.arn(), DestinationArn=dlq.arn(elsewhere), MaxNumberOfMessagesPerSecond=20
    )
    [running] = dlq.tasks()
    elapsed = time.monotonic() - began
    assert running["Status"] == "RUNNING"
    assert running["DestinationArn"] == dlq.arn(elsewhere)
    assert running["MaxNumberOfMessagesPerSecond"] == 20
    assert running["ApproximateNumberOfMessagesMoved"] <= 20 * elapsed + 1
    wait_for(lambda: dlq.tasks()[0]["Status"] == "COMPLETED")
    assert sum(dlq.bodies(elsewhere).values()) == 30
    assert not dlq.bodies(dlq.queue_url)


def test_cancel_stops_the_task_and_what_moved_stays_moved(client: Any) -> None:
    dlq = make_dlq(client, 40)
    handle = client.start_message_move_task(SourceArn=dlq.arn(), MaxNumberOfMessagesPerSecond=5)[
        "TaskHandle"
    ]
    moved_when_cancelled = client.cancel_message_move_task(TaskHandle=handle)[
        "ApproximateNumberOfMessagesMoved"
    ]
    assert moved_when_cancelled < 40
    assert dlq.tasks()[0]["Status"] in ("CANCELLING", "CANCELLED")
    [task] = wait_for(lambda: [t for t in dlq.tasks() if t["Status"] == "CANCELLED"])
    moved = task["ApproximateNumberOfMessagesMoved"]
    in_source = sum(dlq.bodies(dlq.queue_url).values())
    in_dlq = sum(dlq.bodies(dlq.dlq_url).values())
    assert (in_source, in_dlq) == (moved, 40 - moved)
    code, _ = error_of(lambda: client.cancel_message_move_task(TaskHandle=handle))
    assert code == "InvalidParameterValue"


def test_one_active_task_per_queue_and_the_listing_keeps_ten(client: Any) -> None:
    dlq = make_dlq(client, 20)
    client.start_message_move_task(SourceArn=dlq.arn(), MaxNumberOfMessagesPerSecond=1)
    code, message = error_of(lambda: client.start_message_move_task(SourceArn=dlq.arn()))
    assert code == "AWS.SimpleQueueService.UnsupportedOperation"
    assert "already a task running" in message
    handle = dlq.tasks()[0]["TaskHandle"]
    client.cancel_message_move_task(TaskHandle=handle)
    for _ in range(11):
        wait_for(lambda: dlq.tasks()[0]["Status"] not in ("RUNNING", "CANCELLING"))
        client.start_message_move_task(SourceArn=dlq.arn())
    wait_for(lambda: dlq.tasks()[0]["Status"] == "COMPLETED")
    listed = dlq.tasks()
    assert len(listed) == 10
    assert [t["StartedTimestamp"] for t in listed] == sorted(
        (t["StartedTimestamp"] for t in listed), reverse=True
    )
    assert len(dlq.tasks(limit=1)) == 1
    assert len(client.list_message_move_tasks(SourceArn=dlq.arn())["Results"]) == 1


def test_a_message_sent_to_the_dlq_directly_goes_to_its_only_source(client: Any) -> None:
    dlq = make_dlq(client, 3, seeded=False)
    client.start_message_move_task(SourceArn=dlq.arn())
    wait_for(lambda: dlq.tasks()[0]["Status"] == "COMPLETED")
    assert dlq.bodies(dlq.queue_url) == collections.Counter(f"direct {i}" for i in range(3))


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (
            {"SourceArn": "arn:aws:sqs:us-east-1:123456789012:mt-no-such-queue"},
            "ResourceNotFoundException",
        ),
        ({"SourceArn": "not-an-arn"}, "ResourceNotFoundException"),
        ({"MaxNumberOfMessagesPerSecond": 501}, "InvalidParameterValue"),
        ({"MaxNumberOfMessagesPerSecond": 0}, "InvalidParameterValue"),
        (
            {"DestinationArn": "arn:aws:sqs:us-east-1:123456789012:mt-gone"},
            "ResourceNotFoundException",
        ),
        ({"DestinationArn": "itself"}, "InvalidParameterValue"),
        ({"SourceArn": "the source queue"}, "InvalidParameterValue"),
    ],
)
def test_refusals(client: Any, request_: dict[str, Any], code: str) -> None:
    dlq = make_dlq(client, 1)
    request = {"SourceArn": dlq.arn(), **request_}
    if request.get("DestinationArn") == "itself":
        request["DestinationArn"] = dlq.arn()
    if request["SourceArn"] == "the source queue":  # not any queue's DLQ
        request["SourceArn"] = dlq.arn(dlq.queue_url)
    assert error_of(lambda: client.start_message_move_task(**request))[0] == code


def test_listing_and_cancelling_refusals(client: Any) -> None:
    dlq = make_dlq(client, 1)
    assert (
        error_of(lambda: client.list_message_move_tasks(SourceArn=dlq.arn(), MaxResults=11))[0]
        == "InvalidParameterValue"
    )
    assert (
        error_of(lambda: client.list_message_move_tasks(SourceArn=dlq.arn() + "-gone"))[0]
        == "ResourceNotFoundException"
    )
    assert error_of(lambda: client.cancel_message_move_task(TaskHandle="nope"))[0] == (
        "ResourceNotFoundException"
    )


def test_fifo_dlqs_are_not_supported(client: Any) -> None:
    name = f"mt-{uuid.uuid4().hex[:8]}.fifo"
    layout = Layout(families=(Family("f", name),), source="t")
    [(_, _, dlq_url)] = sandbox.create_layout(client, layout)
    arn = client.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])
    code, _ = error_of(
        lambda: client.start_message_move_task(SourceArn=arn["Attributes"]["QueueArn"])
    )
    assert code == "AWS.SimpleQueueService.UnsupportedOperation"


def test_redrives_native_calls_follow_and_cancel_a_sandbox_task(client: Any) -> None:
    dlq = make_dlq(client, 12)
    ref = QueueRef(url=dlq.dlq_url, name=dlq.dlq_url.rsplit("/", 1)[1], ident=dlq.arn(), fifo=False)
    source = QueueRef(
        url=dlq.queue_url,
        name=dlq.queue_url.rsplit("/", 1)[1],
        ident=dlq.arn(dlq.queue_url),
        fifo=False,
    )
    target = DlqTarget(label="mt", family=None, dlq=ref, sources=(source,))
    sqs = SqsBroker(client)
    client.start_message_move_task(SourceArn=ref.ident, MaxNumberOfMessagesPerSecond=1)
    cancelled = cancel_move_task(sqs, target)
    assert cancelled is not None and cancelled.status == "CANCELLING"
    [stopped] = wait_for(
        lambda: [t for t in list_move_tasks(sqs, target) if t.status == "CANCELLED"]
    )
    handle = client.start_message_move_task(SourceArn=ref.ident, MaxNumberOfMessagesPerSecond=50)[
        "TaskHandle"
    ]
    seen: list[str] = []
    task = follow_native_move(
        sqs,
        target,
        handle,
        poll_seconds=0.05,
        stop=threading.Event(),
        on_progress=lambda t: seen.append(t.status),
    )
    assert (task.status, task.to_move) == ("COMPLETED", 12 - stopped.moved)
    assert task.moved == task.to_move
    assert seen[-1] == "COMPLETED"
    assert [t.status for t in list_move_tasks(sqs, target)] == ["COMPLETED", "CANCELLED"]
    assert sum(dlq.bodies(dlq.queue_url).values()) == 12
