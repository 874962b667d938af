"""The move engine's guarantees, each shown on a queue rather than argued.

In-process moto (``family`` fixture) unless two processes must share one SQS: then a moto
server that serves one request at a time, so a double could only be the engine's. Crashes
are simulated by raising a BaseException subclass from the engine's ``fault`` hook, which
the engine deliberately does not clean up after (like SIGKILL); such runs get ``lease=1``, so
the crashed batch's messages come back after a second of real time.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import pytest
from conftest import (
    REGION,
    Cli,
    Family,
    ParkOneWorker,
    Redelivery,
    SqsClock,
    make_family,
    start_moto_server,
)

from redrive import attributes
from redrive.broker import resolve_target
from redrive.broker.base import Delivery, DlqTarget
from redrive.broker.sqs import SqsBroker
from redrive.broker.sqs.calls import MAX_BATCH_BYTES, clean_attribute
from redrive.broker.sqs.calls import message as sqs_message
from redrive.broker.sqs.headers import attributes_of
from redrive.broker.sqs.queues import describe_queue, resolve_family
from redrive.config import built_in_layout
from redrive.errors import AwsUnavailable, SendInDoubt
from redrive.keys import key_for
from redrive.ledger import Claim, KeyState, SqliteLedger
from redrive.messages import decode
from redrive.operations.move import (
    AMBIGUOUS,
    EXPIRED,
    IN_DOUBT,
    LEASE_LIVE,
    NO_TARGET,
    NOT_CELERY,
    POISON,
    RESOLVED_SKIP,
    STEPS,
    MoveEngine,
    MoveOptions,
    MoveResult,
)
from redrive.render.move import move_text
from redrive.runs.observer import Callbacks
from redrive.sandbox.encoder import encode
from redrive.selection import Selection

TASK = "apps.webhooks.tasks.save_checkout"
LEASE = 1


class Crash(BaseException):
    """A simulated SIGKILL: not an Exception, so the engine gives nothing back."""


# -- helpers ----------------------------------------------------------------------------------


_PUBLISHED: dict[tuple[Any, ...], str] = {}


def body(task_id: str, task: str = TASK, **kwargs: Any) -> str:
    """The body of one publish of a task: asked again, the very same bytes (so a copy of
    that publish, as SQS duplicates and redrive's own copies are). A second publish of the
    task id, with kombu's fresh delivery tag, is :func:`republish`."""
    published = (task_id, task, tuple(sorted(kwargs.items())))
    if published not in _PUBLISHED:
        _PUBLISHED[published] = republish(task_id, task, **kwargs)
    return _PUBLISHED[published]


def republish(task_id: str, task: str = TASK, **kwargs: Any) -> str:
    """A new publish of the task id (the same arguments): another delivery tag."""
    return encode(task, [task_id], {"note": "Zoë ✓"}, task_id=task_id, **kwargs)


def put(
    client: Any,
    url: str,
    messages: Sequence[str | tuple[str, Mapping[str, Any]]],
    **extra: Any,
) -> list[str]:
    """Send bodies (or (body, message attributes)) to a queue in order; their MessageIds."""
    ids: list[str] = []
    for start in range(0, len(messages), 10):
        chunk = messages[start : start + 10]
        entries = []
        for i, item in enumerate(chunk):
            text, attrs = (item, {}) if isinstance(item, str) else item
            entry: dict[str, Any] = {"Id": str(i), "MessageBody": text, **extra}
            if attrs:
                entry["MessageAttributes"] = dict(attrs)
            entries.append(entry)
        response = client.send_message_batch(QueueUrl=url, Entries=entries)
        assert not response.get("Failed")
        by_id = {item["Id"]: item["MessageId"] for item in response["Successful"]}
        ids.extend(by_id[str(i)] for i in range(len(chunk)))
    return ids


def task_id_of(text: str) -> str | None:
    return decode(text).task_id


def drain(client: Any, url: str) -> list[dict[str, Any]]:
    """Every message of a queue, deleting them (in batches: fewer requests to a server)."""
    out: list[dict[str, Any]] = []
    while True:
        messages = client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
            VisibilityTimeout=30,
        ).get("Messages", [])
        if not messages:
            return out
        out.extend(messages)
        entries = [
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
        ]
        assert not client.delete_message_batch(QueueUrl=url, Entries=entries).get("Failed")


def arrived(family: Family, url: str | None = None) -> Counter[str | None]:
    """Task ids in a queue (draining it), each with how many copies arrived."""
    return Counter(task_id_of(m["Body"]) for m in drain(family.client, url or family.queue_url))


def wait_for_leases(clock: SqsClock) -> None:
    """Let the leases of a crashed run run out (visibility and the run's ledger lease): on
    ``clock``, the runs' and SQS's, wound on by far more than a hold can be (a whole lease
    unless renewing was slow: see hold_seconds), not slept through on a clock a loaded
    machine may outlast or fall short of."""
    clock.advance(LEASE + 120)
    client = boto3.client("sqs", region_name=REGION)
    for url in client.list_queues().get("QueueUrls", []):
        hidden = client.get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
        )["Attributes"]["ApproximateNumberOfMessagesNotVisible"]
        assert hidden == "0", f"{url}: {hidden} still hidden after the crashed run's holds"


def checkout(client: Any) -> DlqTarget:
    family = built_in_layout({}).family("checkout")
    assert family is not None
    return resolve_family(SqsBroker(client), family)


@dataclass
class Spy:
    """What an engine received, sent and deleted, in order."""

    received: list[list[Delivery]] = field(default_factory=list)
    events: list[tuple[str, frozenset[str]]] = field(default_factory=list)
    sends: int = 0

    def message_ids(self) -> dict[str, str]:
        return {m.tag: m.message_id for batch in self.received for m in batch}


class SpySqs(SqsBroker):
    """An SqsBroker that records its calls and may rewrite received messages (``patch``)."""

    def __init__(
        self,
        client: Any,
        spy: Spy,
        *,
        send_client: Any | None = None,
        patch: Callable[[Delivery], Delivery] | None = None,
    ) -> None:
        super().__init__(client, send_client=send_client)
        self.spy = spy
        self.patch = patch

    def receive(self, url: str, **kwargs: Any) -> list[Delivery]:
        messages = super().receive(url, **kwargs)
        if self.patch is not None:
            messages = [self.patch(m) for m in messages]
        if messages:
            self.spy.received.append(messages)
        return messages

    def send_batch(self, url: str, entries: Sequence[Any]) -> Any:
        self.spy.sends += 1
        result = super().send_batch(url, entries)
        by_id = {e.id: e for e in entries}
        confirmed = frozenset(str(task_id_of(by_id[i].body)) for i in result.ok)
        self.spy.events.append(("sent", confirmed))
        return result

    def delete_batch(self, url: str, handles: Mapping[str, str]) -> Any:
        ids = self.spy.message_ids()
        self.spy.events.append(("delete", frozenset(ids[h] for h in handles.values())))
        return super().delete_batch(url, handles)


class Proxy:
    """A boto3 client with some operations replaced, to inject what SQS may answer."""

    def __init__(self, client: Any, **operations: Callable[..., Any]) -> None:
        self._client = client
        self._operations = operations

    def __getattr__(self, name: str) -> Any:
        if name in self._operations:
            return self._operations[name]
        return getattr(self._client, name)


def move(
    client: Any,
    ledger_path: Path | None,
    *,
    target: DlqTarget | None = None,
    sqs: Callable[[], SqsBroker] | None = None,
    fault: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
    on_progress: Callable[[MoveResult], None] | None = None,
    now: Callable[[], float] | None = None,
    pipelined: bool = True,
    ledger_clock: Callable[[], float] = time.time,
    clock: SqsClock | None = None,
    **options: Any,
) -> MoveResult:
    """One engine run on the checkout family (or ``target``), its ledger opened and closed
    (on ``ledger_clock``: an earlier time makes the run one of days ago). ``clock``, SQS's
    hand-wound one, is then the engine's and the ledger's too (leases end when it says)."""
    if clock is not None:
        now, ledger_clock = clock, clock
    options.setdefault("execute", ledger_path is not None)
    # A run that dies keeps its batch hidden for its lease, so those are short; the others
    # get a long one, which a slow (loaded) test machine cannot outlast mid-batch.
    options.setdefault("lease", LEASE if fault is not None else 30)
    extra: dict[str, Any] = {"clock": now} if now is not None else {}
    ledger = SqliteLedger(ledger_path, clock=ledger_clock) if ledger_path is not None else None
    try:
        return MoveEngine(
            target or checkout(client),
            ledger,
            MoveOptions(pipelined=pipelined, **options),
            broker_factory=sqs or (lambda: SqsBroker(client)),
            observer=Callbacks(on_step=fault, on_progress=on_progress),
            stop=stop,
            **extra,
        ).run()
    finally:
        if ledger is not None:
            ledger.close()


def keys_in(ledger_path: Path) -> dict[str, tuple[KeyState, str, str | None]]:
    """key -> (state, task, sent MessageId) for every key in a ledger."""
    import sqlite3

    conn = sqlite3.connect(ledger_path)
    try:
        rows = conn.execute("SELECT key, state, task, sent_message_id FROM keys").fetchall()
    finally:
        conn.close()
    return {key: (KeyState(state), task, sent) for key, state, task, sent in rows}


def crash_at(step: str, batch: int) -> Callable[[str], None]:
    seen: Counter[str] = Counter()

    def hook(name: str) -> None:
        seen[name] += 1
        if name == step and seen[name] == batch:
            raise Crash(f"{step} in batch {batch}")

    return hook


def attribute_size(attrs: Mapping[str, Mapping[str, Any]]) -> int:
    total = 0
    for name, value in attrs.items():
        total += len(name.encode()) + len(str(value["DataType"]).encode())
        if "StringValue" in value:
            total += len(str(value["StringValue"]).encode())
        if "BinaryValue" in value:
            total += len(value["BinaryValue"])
    return total


# -- 1. byte-identical ------------------------------------------------------------------------

ORIGINAL_ATTRIBUTES: dict[str, dict[str, Any]] = {
    "text": {"DataType": "String", "StringValue": "Zoë ✓ 日本語"},
    "count": {"DataType": "Number", "StringValue": "-1.50e3"},
    "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xff\x80 not utf-8"},
    "custom": {"DataType": "String.x-tenant", "StringValue": "acme"},
    "float": {"DataType": "Number.float", "StringValue": "3.14"},
    "gz": {"DataType": "Binary.gzip", "BinaryValue": b"\x1f\x8b\x08"},
}


def test_body_and_every_attribute_arrive_unchanged_plus_the_stamp(
    family: Family, tmp_path: Path
) -> None:
    bodies = [
        body("t-1"),
        encode(TASK, ["ü"], task_id="t-2", base64_envelope=False),  # raw JSON, non-ASCII
        "plain text, not Celery: Zoë ✓ 日本語",
    ]
    ids = put(family.client, family.dlq_url, [(b, ORIGINAL_ATTRIBUTES) for b in bodies])
    ledger = tmp_path / "l.sqlite3"

    # The plain-text body goes too: asked for (a Celery worker could not decode it).
    result = move(family.client, ledger, include_unknown=True)

    assert (result.moved, result.failed) == (3, 0)
    out = {m["Body"]: m for m in drain(family.client, family.queue_url)}
    assert sorted(out) == sorted(bodies)
    keys = keys_in(ledger)
    for text, message_id in zip(bodies, ids, strict=True):
        got = {k: clean_attribute(v) for k, v in out[text]["MessageAttributes"].items()}
        expected_key = key_for(
            decode(text), message_id=message_id, generation=0, body=text, namespace="sqs"
        )
        assert got == {
            **ORIGINAL_ATTRIBUTES,
            attributes.COUNT: {"DataType": "Number", "StringValue": "1"},
            attributes.KEY: {"DataType": "String", "StringValue": expected_key},
            attributes.SOURCE_DLQ: {"DataType": "String", "StringValue": "onion-checkout-dlq"},
        }
        assert keys[expected_key][0] == KeyState.DONE
    assert family.depth() == (0, 0)


@pytest.mark.parametrize(
    ("originals", "ours"),
    [
        (7, [attributes.COUNT, attributes.KEY, attributes.SOURCE_DLQ]),
        (8, [attributes.COUNT, attributes.KEY]),
        (9, [attributes.COUNT]),
        (10, []),
    ],
)
def test_stamp_only_where_there_is_room_and_originals_never_dropped(
    family: Family, tmp_path: Path, originals: int, ours: list[str]
) -> None:
    attrs = {f"a{i}": {"DataType": "String", "StringValue": f"v{i}"} for i in range(originals)}
    put(family.client, family.dlq_url, [(body("t-1"), attrs)])

    assert move(family.client, tmp_path / "l.sqlite3").moved == 1

    (message,) = drain(family.client, family.queue_url)
    got = message["MessageAttributes"]
    assert {k: clean_attribute(v) for k, v in got.items() if k in attrs} == attrs
    assert sorted(set(got) - set(attrs)) == sorted(ours)


def test_real_celery_samples_arrive_byte_identical(
    family: Family, tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    bodies = [s["Body"] for s in samples]
    put(family.client, family.dlq_url, bodies)
    ledger = tmp_path / "l.sqlite3"

    # Real samples, whatever their dates: their expiry has its own test below.
    result = move(family.client, ledger, include_expired=True)

    assert result.moved == len(samples)
    assert sorted(m["Body"] for m in drain(family.client, family.queue_url)) == sorted(bodies)
    # Every sample is a Celery task: each has a key of its task id, none of its MessageId.
    task_ids = {task_id_of(b) for b in bodies}
    assert None not in task_ids
    assert {k.split(":")[1] for k in keys_in(ledger)} == task_ids
    assert sum(result.by_task.values()) == len(samples)


# The samples' own dates (real Celery output, kept as they are): one task expires at
# 12:00 UTC and one has an eta an hour later, each in protocol 1 and 2.
SAMPLES_EXPIRE = datetime(2026, 11, 30, 12, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("clock", "expected_skips"),
    [
        (SAMPLES_EXPIRE - 3600, 0),  # before every date: every sample moves
        (SAMPLES_EXPIRE + 1, 2),  # just past `expires`: the two expired ones stay
        (SAMPLES_EXPIRE + 2 * 365 * 86400, 2),  # long after: still exactly those two
    ],
)
def test_the_samples_dates_decide_which_expire(
    family: Family,
    tmp_path: Path,
    samples: list[dict[str, Any]],
    clock: float,
    expected_skips: int,
) -> None:
    bodies = [s["Body"] for s in samples]
    put(family.client, family.dlq_url, bodies)
    expiring = {
        task_id_of(b) for b in bodies if (e := decode(b).expires) and e.timestamp() <= clock
    }
    assert len(expiring) == expected_skips

    result = move(family.client, tmp_path / "l.sqlite3", now=lambda: clock)

    assert result.moved == len(samples) - expected_skips
    assert dict(result.skipped) == ({EXPIRED: expected_skips} if expected_skips else {})
    moved = {task_id_of(m["Body"]) for m in drain(family.client, family.queue_url)}
    assert moved == {task_id_of(b) for b in bodies} - expiring
    assert family.depth() == (expected_skips, 0)


def test_fifo_keeps_message_group_and_uses_the_key_as_deduplication_id(
    sqs_client: Any, tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    fifo = make_family(sqs_client, "onion-checkout.fifo")
    target = resolve_target(
        built_in_layout({}), "onion-checkout.fifo", lambda _: SqsBroker(sqs_client)
    )
    sample = next(s for s in samples if s["queue"].endswith(".fifo"))
    sent = {
        sample["Body"]: sample["Attributes"]["MessageGroupId"],
        body("t-1"): "user-1",
        body("t-2"): "user-2",
        body("t-3"): "user-1",
    }
    ids = {}
    for i, (text, group) in enumerate(sent.items()):
        response = sqs_client.send_message(
            QueueUrl=fifo.dlq_url,
            MessageBody=text,
            MessageGroupId=group,
            MessageDeduplicationId=f"dlq-{i}",
        )
        ids[text] = response["MessageId"]

    result = move(sqs_client, tmp_path / "l.sqlite3", target=target)

    assert result.moved == 4
    out = drain(sqs_client, fifo.queue_url)
    assert sorted(m["Body"] for m in out) == sorted(sent)
    for message in out:
        text = message["Body"]
        assert message["Attributes"]["MessageGroupId"] == sent[text]
        key = key_for(decode(text), message_id=ids[text], generation=0, body=text, namespace="sqs")
        assert message["Attributes"]["MessageDeduplicationId"] == key
    assert fifo.depth() == (0, 0)


def test_fifo_resend_of_an_in_doubt_send_is_dropped_by_sqs(
    sqs_client: Any, tmp_path: Path, sqs_clock: SqsClock
) -> None:
    fifo = make_family(sqs_client, "onion-checkout.fifo")
    target = resolve_target(
        built_in_layout({}), "onion-checkout.fifo", lambda _: SqsBroker(sqs_client)
    )
    for i in range(5):
        sqs_client.send_message(
            QueueUrl=fifo.dlq_url,
            MessageBody=body(f"t-{i}"),
            MessageGroupId=f"g{i % 2}",
            MessageDeduplicationId=f"d{i}",
        )
    ledger = tmp_path / "l.sqlite3"
    with pytest.raises(Crash):
        move(sqs_client, ledger, clock=sqs_clock, target=target, fault=crash_at("sent", 1))
    wait_for_leases(sqs_clock)

    result = move(sqs_client, ledger, clock=sqs_clock, target=target, in_doubt="resend")

    # The engine resent all five (it cannot know); SQS's deduplication kept one of each.
    assert result.moved == 5
    assert arrived(fifo, fifo.queue_url) == {f"t-{i}": 1 for i in range(5)}
    assert fifo.depth() == (0, 0)


def test_the_stamp_never_makes_a_message_too_big_to_send(family: Family, tmp_path: Path) -> None:
    limit = 262_144

    # What SQS does for a queue whose MaximumMessageSize is 256 KiB: attributes count.
    def send_message_batch(QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        too_big = [
            e
            for e in Entries
            if len(e["MessageBody"].encode()) + attribute_size(e.get("MessageAttributes", {}))
            > limit
        ]
        fine = [e for e in Entries if e not in too_big]
        response: dict[str, Any] = {"Successful": [], "Failed": []}
        if fine:
            response = family.client.send_message_batch(QueueUrl=QueueUrl, Entries=fine)
        response.setdefault("Failed", []).extend(
            {"Id": e["Id"], "SenderFault": True, "Code": "InvalidParameterValue"} for e in too_big
        )
        return response

    custom = {"tenant": {"DataType": "String", "StringValue": "acme"}}
    text = "x" * (limit - attribute_size(custom) - 20)  # fits, but not with redrive's stamp
    small = body("t-small")
    put(family.client, family.dlq_url, [(text, custom), small])
    ledger = tmp_path / "l.sqlite3"
    proxy = Proxy(family.client, send_message_batch=send_message_batch)

    result = move(
        family.client,
        ledger,
        sqs=lambda: SqsBroker(family.client, send_client=proxy),
        include_unknown=True,  # the big body is not a Celery task
    )

    assert (result.moved, result.failed) == (2, 0)
    out = {m["Body"]: m["MessageAttributes"] for m in drain(family.client, family.queue_url)}
    assert {k: clean_attribute(v) for k, v in out[text].items()} == custom
    assert attributes.COUNT in out[small]


# -- 2. nothing lost --------------------------------------------------------------------------


def failing_sends(client: Any, fail: set[str], *, unanswered: set[str] = frozenset()) -> Proxy:
    """SendMessageBatch that reports the entries of task ids in ``fail`` as Failed (and does
    not send them) and leaves those in ``unanswered`` out of both lists (not sent either)."""

    def send_message_batch(QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        skip = fail | unanswered
        good = [e for e in Entries if task_id_of(e["MessageBody"]) not in skip]
        response: dict[str, Any] = {"Successful": [], "Failed": []}
        if good:
            response = client.send_message_batch(QueueUrl=QueueUrl, Entries=good)
            response.setdefault("Failed", [])
        response["Failed"].extend(
            {"Id": e["Id"], "SenderFault": False, "Code": "InternalError", "Message": "injected"}
            for e in Entries
            if task_id_of(e["MessageBody"]) in fail
        )
        return response

    return Proxy(client, send_message_batch=send_message_batch)


def test_failed_sends_stay_in_the_dlq_with_their_keys_released(
    family: Family, tmp_path: Path
) -> None:
    ids = [f"t-{i}" for i in range(12)]
    message_ids = dict(
        zip(put(family.client, family.dlq_url, [body(t) for t in ids]), ids, strict=True)
    )
    bad = {"t-3", "t-10"}
    proxy = failing_sends(family.client, bad)
    ledger = tmp_path / "l.sqlite3"

    result = move(family.client, ledger, sqs=lambda: SqsBroker(family.client, send_client=proxy))

    assert (result.moved, result.failed) == (10, 2)
    assert {m.task_id for m in result.failed_messages} == bad
    assert {m.detail for m in result.failed_messages} == {"InternalError: injected"}
    assert family.depth() == (2, 0)  # released at once, not left hidden
    remaining = drain(family.client, family.dlq_url)
    assert {message_ids[m["MessageId"]] for m in remaining} == bad
    states = {k.split(":")[1]: v[0] for k, v in keys_in(ledger).items()}
    assert states == {t: KeyState.DONE for t in ids if t not in bad}
    assert arrived(family) == {t: 1 for t in ids if t not in bad}


def test_sends_sqs_neither_confirms_nor_refuses_are_in_doubt_not_resent(
    family: Family, tmp_path: Path
) -> None:
    """An entry missing from both lists of the response may have been queued: its claim is
    kept, the message stays in the DLQ, and the next run reports it in doubt."""
    ids = [f"t-{i}" for i in range(12)]
    put(family.client, family.dlq_url, [body(t) for t in ids])
    bad = {"t-3", "t-10"}
    proxy = failing_sends(family.client, set(), unanswered=bad)
    ledger = tmp_path / "l.sqlite3"

    first = move(family.client, ledger, sqs=lambda: SqsBroker(family.client, send_client=proxy))

    assert (first.moved, first.failed, first.in_doubt) == (10, 0, 2)
    assert {m.task_id for m in first.in_doubt_messages} == bad
    assert family.depth() == (2, 0)
    states = {k.split(":")[1]: v[0] for k, v in keys_in(ledger).items()}
    assert {t: states[t] for t in bad} == {t: KeyState.CLAIMED for t in bad}

    second = move(family.client, ledger)
    assert (second.moved, second.in_doubt) == (0, 2)
    assert {m.task_id for m in second.in_doubt_messages} == bad
    assert family.depth() == (2, 0)


def test_failed_sends_succeed_on_the_next_run(family: Family, tmp_path: Path) -> None:
    put(family.client, family.dlq_url, [body(f"t-{i}") for i in range(5)])
    ledger = tmp_path / "l.sqlite3"
    proxy = failing_sends(family.client, {"t-1"})
    first = move(family.client, ledger, sqs=lambda: SqsBroker(family.client, send_client=proxy))
    second = move(family.client, ledger)

    assert (first.moved, first.failed, second.moved, second.duplicates) == (4, 1, 1, 0)
    assert arrived(family) == {f"t-{i}": 1 for i in range(5)}
    assert family.depth() == (0, 0)


def test_a_failed_delete_leaves_the_key_sent_and_the_next_run_only_deletes(
    family: Family, tmp_path: Path
) -> None:
    ids = [f"t-{i}" for i in range(6)]
    put(family.client, family.dlq_url, [body(t) for t in ids])
    undeletable = {"t-2", "t-4"}

    def delete_message_batch(QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        held = {e["ReceiptHandle"]: e for e in Entries}
        bodies = {m.tag: m.body for batch in spy.received for m in batch}
        refuse = [e for h, e in held.items() if task_id_of(bodies[h]) in undeletable]
        rest = [e for e in Entries if e not in refuse]
        response = family.client.delete_message_batch(QueueUrl=QueueUrl, Entries=rest)
        response.setdefault("Failed", []).extend(
            {"Id": e["Id"], "SenderFault": False, "Code": "InternalError"} for e in refuse
        )
        return response

    spy = Spy()
    proxy = Proxy(family.client, delete_message_batch=delete_message_batch)
    ledger = tmp_path / "l.sqlite3"

    first = move(family.client, ledger, sqs=lambda: SpySqs(proxy, spy))

    assert first.moved == 6
    assert family.depth() == (2, 0)
    states = {k.split(":")[1]: v[0] for k, v in keys_in(ledger).items()}
    assert {t for t, s in states.items() if s == KeyState.SENT} == undeletable

    spy2 = Spy()
    second = move(family.client, ledger, sqs=lambda: SpySqs(family.client, spy2))

    assert (second.moved, second.duplicates, spy2.sends) == (0, 2, 0)
    assert family.depth() == (0, 0)
    assert set(v[0] for v in keys_in(ledger).values()) == {KeyState.DONE}
    assert arrived(family) == {t: 1 for t in ids}


def test_a_send_timeout_leaves_only_its_own_request_in_doubt(
    family: Family, tmp_path: Path, sqs_clock: SqsClock
) -> None:
    # Ten ~100 KB messages: one batch received, sent in five requests of two.
    big = "x" * 56_000
    ids = [f"t-{i}" for i in range(10)]
    put(family.client, family.dlq_url, [encode(TASK, [big], task_id=t) for t in ids])
    calls: list[set[str | None]] = []

    def send_message_batch(QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        calls.append({task_id_of(e["MessageBody"]) for e in Entries})
        response = family.client.send_message_batch(QueueUrl=QueueUrl, Entries=Entries)
        if len(calls) == 2:  # it reached SQS, but its answer is lost
            raise botocore.exceptions.ReadTimeoutError(endpoint_url="http://127.0.0.1:1/")
        return dict(response)

    proxy = Proxy(family.client, send_message_batch=send_message_batch)
    ledger = tmp_path / "l.sqlite3"

    with pytest.raises(SendInDoubt):
        move(
            family.client,
            ledger,
            clock=sqs_clock,
            lease=LEASE,
            sqs=lambda: SqsBroker(family.client, send_client=proxy),
        )

    assert len(calls) == 2 and all(len(c) == 2 for c in calls)
    states = {k.split(":")[1]: v[0] for k, v in keys_in(ledger).items()}
    assert {t for t, s in states.items() if s == KeyState.SENT} == calls[0]
    assert {t for t, s in states.items() if s == KeyState.CLAIMED} == calls[1]
    assert len(states) == 4  # the six never tried were released

    wait_for_leases(sqs_clock)
    rerun = move(family.client, ledger, clock=sqs_clock)

    assert {m.task_id for m in rerun.in_doubt_messages} == calls[1]
    assert (rerun.moved, rerun.duplicates, rerun.in_doubt) == (6, 2, 2)
    assert arrived(family) == {t: 1 for t in ids}
    assert family.depth() == (2, 0)


# -- 3. nothing doubled: a crash at every step ------------------------------------------------

# 25 tasks, then four more copies (same task id and retries, another MessageId): of tasks in
# the first, second and third batch of ten. Two of them share the third batch with their twin.
DUPLICATED = ("t-0", "t-12", "t-22", "t-24")


# And two task ids published a second time (an app that chooses its own task ids): two
# tasks each, both to be moved.
REPUBLISHED = ("t-5", "t-13")


def seed_with_copies(family: Family) -> dict[str, str]:
    return {mid: task for mid, (task, _) in seed_publishes(family, republished=()).items()}


def seed_publishes(
    family: Family, *, republished: Sequence[str] = REPUBLISHED
) -> dict[str, tuple[str, str]]:
    """MessageId -> (task id, body) of the 25 tasks, the copies and the second publishes."""
    ids = [f"t-{i}" for i in range(25)]
    tasks = [*ids, *DUPLICATED, *republished]
    texts = [body(t) for t in ids] + [body(t) for t in DUPLICATED]
    texts += [republish(t) for t in republished]
    message_ids = put(family.client, family.dlq_url, texts)
    return dict(zip(message_ids, zip(tasks, texts, strict=True), strict=True))


@pytest.mark.parametrize("pipelined", [True, False], ids=["two-stage", "one-stage"])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_any_step_never_loses_or_doubles_a_task(
    family: Family,
    tmp_path: Path,
    sqs_clock: SqsClock,
    step: str,
    batch: int,
    pipelined: bool,
) -> None:
    seeded = seed_publishes(family)
    # Each publish is one task to deliver: a task id published twice arrives twice.
    publishes = Counter(task for task, _ in set(seeded.values()))
    ledger = tmp_path / "l.sqlite3"
    spy = Spy()

    with pytest.raises(Crash):
        move(
            family.client,
            ledger,
            clock=sqs_clock,
            sqs=lambda: SpySqs(family.client, spy),
            fault=crash_at(step, batch),
            pipelined=pipelined,
        )
    # The crash hit batch `batch`; the receiving stage may have taken batches after it,
    # which were never claimed and come back with their leases.
    assert len(spy.received) >= batch
    crashed = {m.body for m in spy.received[batch - 1]}
    crashed_tasks = {seeded[m.message_id][0] for m in spy.received[batch - 1]}
    wait_for_leases(sqs_clock)

    held = move(family.client, ledger, clock=sqs_clock, in_doubt="hold")

    in_doubt = step in ("claimed", "sent")  # claimed, but the send never recorded
    if not in_doubt:
        assert (held.in_doubt, held.in_doubt_messages) == (0, [])
        assert family.depth() == (0, 0)
        assert arrived(family) == publishes
        return

    # Exactly the crashed batch's publishes are in doubt: every DLQ copy of them, listed.
    expected = {mid for mid, (_, text) in seeded.items() if text in crashed}
    assert held.in_doubt == len(expected)
    assert {m.message_id for m in held.in_doubt_messages} == expected
    assert {(m.task, m.task_id) for m in held.in_doubt_messages} == {
        (TASK, t) for t in crashed_tasks
    }
    assert held.skipped[IN_DOUBT] == len(expected)
    assert family.depth() == (len(expected), 0)  # left in the DLQ, visible
    text = move_text(held)
    assert all(m in text for m in expected)

    if step == "claimed":
        # Never sent: the operator resends them.
        resent = move(family.client, ledger, clock=sqs_clock, in_doubt="resend")
        assert resent.moved == len(crashed)
        assert resent.in_doubt == 0
        assert family.depth() == (0, 0)
        assert arrived(family) == publishes
    else:
        # Sent before the crash (the operator may see them processed): skip them.
        skipped = move(family.client, ledger, clock=sqs_clock, in_doubt="skip")
        assert (skipped.moved, skipped.in_doubt) == (0, 0)
        assert skipped.skipped[RESOLVED_SKIP] == len(expected)
        assert family.depth() == (len(expected), 0)
        states = keys_in(ledger)
        assert {k.split(":")[1] for k, v in states.items() if v[0] == KeyState.SKIPPED} == (
            crashed_tasks
        )
        later = move(family.client, ledger, clock=sqs_clock)
        assert (later.moved, later.in_doubt) == (0, 0)
        assert later.skipped == Counter({RESOLVED_SKIP: len(expected)})
        assert family.depth() == (len(expected), 0)
        assert arrived(family) == publishes


HOUR = 3600.0


def crashed_with_a_lease(family: Family, ledger: Path, clock: SqsClock) -> tuple[str, set[str]]:
    """Crash a run after its first batch's send, before the ledger recorded it; its last
    heartbeat promised its lease for another hour. The SQS holds of what it received end
    (the clock wound past them) while that ledger lease runs on: as on RabbitMQ, where a
    kill gives the batch back at once. The dead run's id, and the keys it left CLAIMED."""
    put(family.client, family.dlq_url, [body(f"t-{i}") for i in range(25)])
    with pytest.raises(Crash):
        move(family.client, ledger, clock=clock, fault=crash_at("sent", 1))
    with SqliteLedger(ledger, clock=clock) as led:
        (dead,) = [r.run_id for r in led.runs() if r.ended_at is None]
        claimed = {e.key for e in led.keys_for_run(dead) if e.state is KeyState.CLAIMED}
        led.heartbeat(dead, lease_until=clock.now + HOUR)
    wait_for_leases(clock)
    assert len(claimed) == 10
    return dead, claimed


def owners_of(ledger: Path, keys: set[str]) -> Counter[tuple[KeyState, str]]:
    with SqliteLedger(ledger) as led:
        return Counter((e.state, e.run_id) for e in led.get_many(sorted(keys)).values())


def lease_end(ledger: Path, run_id: str) -> str:
    with SqliteLedger(ledger) as led:
        run = led.run(run_id)
    assert run is not None
    return datetime.fromtimestamp(run.lease_until, UTC).isoformat(timespec="seconds")


@pytest.mark.parametrize("policy", ["skip", "resend"])
def test_a_rerun_inside_a_dead_runs_lease_leaves_its_keys_in_doubt_until_it_ends(
    family: Family, tmp_path: Path, sqs_clock: SqsClock, policy: str
) -> None:
    """Issue 24/25 follow-up: the crashed run is dead to the rerun (its claims are in doubt)
    but its ledger lease runs, and the ledger resolves none of its claims before it ends. The
    rerun with --in-doubt skip or resend says so: the ten in doubt (why, until when), not
    resolved, nothing resent, the keys still the dead run's. Past the lease it resolves them."""
    ledger = tmp_path / "l.sqlite3"
    dead, claimed = crashed_with_a_lease(family, ledger, sqs_clock)
    until = lease_end(ledger, dead)

    plan = move(family.client, ledger, clock=sqs_clock, in_doubt=policy, execute=False)
    assert (plan.moved, plan.in_doubt, dict(plan.skipped)) == (15, 10, {LEASE_LIVE: 10})

    held = move(family.client, ledger, clock=sqs_clock, in_doubt=policy)
    assert (held.moved, held.in_doubt, held.failed) == (15, 10, 0)
    assert held.skipped == Counter({LEASE_LIVE: 10}), "not resolved: the ledger did not"
    assert {m.key for m in held.in_doubt_messages} == claimed
    (detail,) = {m.detail for m in held.in_doubt_messages}
    assert dead in detail and until in detail and "lease" in detail and "rerun" in detail
    assert "lease has not run out" in move_text(held)
    assert owners_of(ledger, claimed) == Counter({(KeyState.CLAIMED, dead): 10})
    assert family.depth() == (10, 0), "held in the DLQ, visible"

    sqs_clock.advance(HOUR)
    resolved = move(family.client, ledger, clock=sqs_clock, in_doubt=policy)
    assert resolved.in_doubt == 0
    published = Counter(f"t-{i}" for i in range(25))
    if policy == "skip":
        assert (resolved.moved, dict(resolved.skipped)) == (0, {RESOLVED_SKIP: 10})
        assert owners_of(ledger, claimed) == Counter({(KeyState.SKIPPED, resolved.run_id): 10})
        assert family.depth() == (10, 0)
        assert arrived(family) == published
    else:
        assert (resolved.moved, dict(resolved.skipped)) == (10, {})
        assert owners_of(ledger, claimed) == Counter({(KeyState.DONE, resolved.run_id): 10})
        assert family.depth() == (0, 0)
        crashed = Counter(k.split(":")[1] for k in claimed)
        assert arrived(family) == published + crashed, "resent once, as the operator asked"


@pytest.mark.parametrize("policy", ["skip", "resend"])
def test_what_the_ledger_refuses_to_resolve_is_reported_in_doubt_not_resolved(
    family: Family, tmp_path: Path, sqs_clock: SqsClock, policy: str
) -> None:
    """The rerun's clock is past the dead run's lease, the ledger's is not (a clock behind,
    as another machine's may be): the decision is to resolve, the ledger refuses, and the
    result says what the ledger did, not what was decided: in doubt, nothing resent."""
    ledger = tmp_path / "l.sqlite3"
    dead, claimed = crashed_with_a_lease(family, ledger, sqs_clock)
    sqs_clock.advance(HOUR + 60)

    held = move(
        family.client,
        ledger,
        now=sqs_clock,
        ledger_clock=lambda: sqs_clock.now - 2 * HOUR,
        in_doubt=policy,
    )
    assert (held.moved, held.in_doubt, held.failed) == (15, 10, 0)
    assert held.skipped == Counter({LEASE_LIVE: 10})
    assert {m.key for m in held.in_doubt_messages} == claimed
    assert all(lease_end(ledger, dead) in m.detail for m in held.in_doubt_messages)
    assert owners_of(ledger, claimed) == Counter({(KeyState.CLAIMED, dead): 10})
    assert family.depth() == (10, 0)
    assert arrived(family) == Counter(f"t-{i}" for i in range(25)), "none resent"


def test_a_live_run_in_this_process_is_busy_not_in_doubt(family: Family, tmp_path: Path) -> None:
    # While one run is between claim and send, another (same process) must not call its
    # keys in doubt: it skips them as busy.
    put(family.client, family.dlq_url, [body("t-1")])
    ledger = tmp_path / "l.sqlite3"
    seen: list[MoveResult] = []

    def during_claim(step: str) -> None:
        if step == "claimed":
            family.client.change_message_visibility_batch(
                QueueUrl=family.dlq_url,
                Entries=[
                    {
                        "Id": "0",
                        "ReceiptHandle": spy.received[-1][0].tag,
                        "VisibilityTimeout": 0,
                    }
                ],
            )
            seen.append(move(family.client, ledger))

    spy = Spy()
    # One stage: a receive ahead would take back the message made visible for the inner run.
    first = move(
        family.client,
        ledger,
        sqs=lambda: SpySqs(family.client, spy),
        fault=during_claim,
        pipelined=False,
    )

    (inner,) = seen
    assert (inner.moved, inner.in_doubt) == (0, 0)
    assert inner.skipped == Counter({"claimed-by-another-run": 1})
    assert first.moved == 1
    assert arrived(family) == {"t-1": 1}


# -- 4. reruns and copies ---------------------------------------------------------------------


def test_a_rerun_after_a_finished_move_sends_nothing(family: Family, tmp_path: Path) -> None:
    tasks_of = seed_with_copies(family)
    ledger = tmp_path / "l.sqlite3"
    first = move(family.client, ledger)
    # More copies of two of those publishes turn up (SQS delivers at least once).
    put(family.client, family.dlq_url, [body(t) for t in ("t-1", "t-7")])
    spy = Spy()

    second = move(family.client, ledger, sqs=lambda: SpySqs(family.client, spy))

    assert (first.moved, first.duplicates) == (25, len(DUPLICATED))
    assert (second.moved, second.duplicates, spy.sends) == (0, 2, 0)
    assert arrived(family) == {t: 1 for t in set(tasks_of.values())}


def test_two_copies_in_one_batch_go_once_and_the_copy_is_deleted_after_the_send(
    family: Family, tmp_path: Path
) -> None:
    ids = put(family.client, family.dlq_url, [body("t-1"), body("t-2"), body("t-1")])
    spy = Spy()

    result = move(family.client, tmp_path / "l.sqlite3", sqs=lambda: SpySqs(family.client, spy))

    assert (result.moved, result.duplicates) == (2, 1)
    assert arrived(family) == {"t-1": 1, "t-2": 1}
    assert family.depth() == (0, 0)
    sent_at = next(i for i, (kind, what) in enumerate(spy.events) if "t-1" in what)
    assert spy.events[sent_at][0] == "sent"
    deleted_at = next(i for i, (kind, what) in enumerate(spy.events) if ids[2] in what)
    assert spy.events[deleted_at][0] == "delete" and deleted_at > sent_at


def test_a_copy_is_kept_while_its_twin_failed_to_send(family: Family, tmp_path: Path) -> None:
    put(family.client, family.dlq_url, [body("t-1"), body("t-2"), body("t-1")])
    ledger = tmp_path / "l.sqlite3"
    proxy = failing_sends(family.client, {"t-1"})

    first = move(family.client, ledger, sqs=lambda: SqsBroker(family.client, send_client=proxy))

    # Both copies of t-1 fail (the twin with the copy sent), and stay: every one counted.
    assert (first.moved, first.failed, first.duplicates) == (1, 2, 0)
    assert first.scanned == first.matched == 3
    assert family.depth() == (2, 0)
    second = move(family.client, ledger)
    assert (second.moved, second.duplicates) == (1, 1)
    assert arrived(family) == {"t-1": 1, "t-2": 1}
    assert family.depth() == (0, 0)


def test_copies_in_different_batches_and_runs_go_once(family: Family, tmp_path: Path) -> None:
    texts = [body(f"t-{i}") for i in range(15)] + [body("t-0"), body("t-14")]
    ids = put(family.client, family.dlq_url, texts)
    ledger = tmp_path / "l.sqlite3"

    # First only the first copy of t-3 (by MessageId); its twin comes in a later run.
    put(family.client, family.dlq_url, [body("t-3")])
    only = move(family.client, ledger, selection=Selection(message_ids=frozenset({ids[3]})))
    rest = move(family.client, ledger)

    assert (only.moved, rest.moved, rest.duplicates) == (1, 14, 3)
    assert arrived(family) == {f"t-{i}": 1 for i in range(15)}
    assert family.depth() == (0, 0)


# -- 4b. a task id used twice: a second publish is not a copy ---------------------------------


def untagged(text: str) -> str:
    """The body as a producer writes it that stamps no delivery tag (not kombu's virtual
    transports): two publishes of one task with the same arguments are then the same bytes."""
    envelope = json.loads(base64.b64decode(text))
    del envelope["properties"]["delivery_tag"]
    return base64.b64encode(json.dumps(envelope).encode()).decode()


DAYS_AGO = time.time() - 3 * 86_400


def test_a_task_id_published_again_days_later_is_moved_not_deleted(
    family: Family, tmp_path: Path
) -> None:
    # apply_async(task_id="activate-1"): the app's own id, to deduplicate. It failed, and
    # redrive moved it three days ago.
    put(family.client, family.dlq_url, [republish("activate-1")])
    ledger = tmp_path / "l.sqlite3"
    first = move(family.client, ledger, ledger_clock=lambda: DAYS_AGO)
    assert first.moved == 1 and arrived(family) == {"activate-1": 1}
    # Now the app publishes activate-1 again, a new invocation, and it fails too.
    put(family.client, family.dlq_url, [republish("activate-1")])
    spy = Spy()

    again = move(family.client, ledger, sqs=lambda: SpySqs(family.client, spy))

    assert (again.moved, again.duplicates, again.skipped_total) == (1, 0, 0)
    assert spy.events[0] == ("sent", frozenset({"activate-1"}))
    assert arrived(family) == {"activate-1": 1}
    assert family.depth() == (0, 0)
    assert move(family.client, ledger).scanned == 0  # and it is done: nothing left


def test_two_publishes_of_one_task_id_in_one_batch_both_move(
    family: Family, tmp_path: Path
) -> None:
    texts = [republish("t-1"), body("t-2"), republish("t-1"), body("t-2")]  # and a copy
    put(family.client, family.dlq_url, texts)
    ledger = tmp_path / "l.sqlite3"

    dry = move(family.client, None)
    result = move(family.client, ledger)

    for run in (dry, result):
        assert (run.moved, run.duplicates, run.skipped_total) == (3, 1, 0)
    assert arrived(family) == {"t-1": 2, "t-2": 1}
    assert family.depth() == (0, 0)
    assert len([k for k in keys_in(ledger) if ":t-1:" in k]) == 2


def test_the_same_bytes_sent_again_after_the_move_are_a_new_invocation(
    family: Family, tmp_path: Path
) -> None:
    # Test data kept as bodies and sent again with another tool, an hour after redrive moved
    # the first copy: the delivery tag is the same, but no copy of a publish is enqueued
    # after redrive sent it (redrive's own copies carry the next generation).
    text = body("t-replayed")
    put(family.client, family.dlq_url, [text])
    ledger = tmp_path / "l.sqlite3"
    move(family.client, ledger, ledger_clock=lambda: time.time() - 3600)
    arrived(family)
    put(family.client, family.dlq_url, [text])

    again = move(family.client, ledger)

    assert (again.moved, again.duplicates) == (1, 0)
    assert arrived(family) == {"t-replayed": 1}
    keys = [k for k in keys_in(ledger) if ":t-replayed:" in k]
    assert len(keys) == 2 and sum(k.rsplit(":", 1)[-1].startswith("m") for k in keys) == 1
    assert move(family.client, ledger).moved == 0


def test_true_copies_of_a_returned_copy_go_once(family: Family, tmp_path: Path) -> None:
    # redrive's copy of t-1 came back to the DLQ twice (SQS delivered it twice, and both
    # failed): the same body and our stamp, two MessageIds.
    put(family.client, family.dlq_url, [body("t-1")])
    ledger = tmp_path / "l.sqlite3"
    move(family.client, ledger)
    (copy,) = drain(family.client, family.queue_url)
    stamp = {k: clean_attribute(v) for k, v in copy["MessageAttributes"].items()}
    assert stamp[attributes.COUNT]["StringValue"] == "1"
    ids = put(family.client, family.dlq_url, [(copy["Body"], stamp), (copy["Body"], stamp)])
    spy = Spy()

    back = move(family.client, ledger, sqs=lambda: SpySqs(family.client, spy))

    assert (back.moved, back.duplicates) == (1, 1)
    assert arrived(family) == {"t-1": 1}
    sent_at = spy.events.index(("sent", frozenset({"t-1"})))
    deleted_at = next(i for i, (kind, what) in enumerate(spy.events) if ids[1] in what)
    assert deleted_at > sent_at  # the copy went only once its twin's send was confirmed
    assert family.depth() == (0, 0)


def test_an_untagged_copy_is_held_until_the_operator_says_move(
    family: Family, tmp_path: Path
) -> None:
    same = untagged(body("t-1"))
    other_args = untagged(encode(TASK, ["other"], {}, task_id="t-1"))
    ids = put(family.client, family.dlq_url, [same, body("t-2"), same, other_args])
    ledger = tmp_path / "l.sqlite3"

    dry = move(family.client, None)
    first = move(family.client, ledger)

    for run in (dry, first):
        # The same bytes without a delivery tag: a copy, or the same task published twice.
        assert (run.moved, run.duplicates) == (3, 0)
        assert run.skipped == Counter({AMBIGUOUS: 1})
    assert [m.message_id for m in first.ambiguous_messages] == [ids[2]]
    assert ids[0] in first.ambiguous_messages[0].detail
    assert first.needs_attention
    assert "--ambiguous move" in move_text(first)
    assert family.depth() == (1, 0)  # held in the DLQ, never deleted
    later = move(family.client, ledger)  # the ledger now holds the first as done
    assert (later.moved, later.duplicates, later.ambiguous) == (0, 0, 1)

    asked = move(family.client, ledger, ambiguous="move")

    assert (asked.moved, asked.ambiguous) == (1, 0)
    assert arrived(family) == {"t-1": 3, "t-2": 1}
    assert family.depth() == (0, 0)
    assert move(family.client, ledger, ambiguous="move").scanned == 0


def test_a_ledger_from_before_keys_named_the_publish_still_decides_safely(
    family: Family, tmp_path: Path
) -> None:
    from test_ledger import schema_2_ledger

    from redrive.keys import legacy_key_for

    texts = {t: body(t) for t in ("t-sent", "t-claimed", "t-later", "t-before", "t-back")}
    full = {f"a{i}": {"DataType": "String", "StringValue": str(i)} for i in range(10)}
    ids = dict(
        zip(
            texts,
            put(
                family.client,
                family.dlq_url,
                [texts[t] for t in texts if t != "t-back"] + [(texts["t-back"], full)],
            ),
            strict=True,
        )
    )

    def legacy(task_id: str) -> str:
        return legacy_key_for(decode(texts[task_id]), message_id="-", generation=0, namespace="sqs")

    now, url = time.time(), family.queue_url
    schema_2_ledger(
        tmp_path / "l.sqlite3",
        [
            # Sent, then the delete failed: only the delete is left to do.
            (legacy("t-sent"), "sent", "old", TASK, ids["t-sent"], url, "s-1", now - 60),
            # Claimed by a run that died: in doubt, never resent silently.
            (legacy("t-claimed"), "claimed", "old", TASK, ids["t-claimed"], url, None, now - 60),
            # Done for another message days before this one was enqueued: a second publish.
            (legacy("t-later"), "done", "old", TASK, "gone-1", url, "s-3", now - 3 * 86_400),
            # Done for another message after this one was enqueued: a copy, or not?
            (legacy("t-before"), "done", "old", TASK, "gone-2", url, "s-4", now + 60),
            # Sent as this very message (unstamped: no room): it came back, a generation on.
            (legacy("t-back"), "done", "old", TASK, "orig-5", url, ids["t-back"], now - 60),
        ],
    )
    spy = Spy()

    result = move(family.client, tmp_path / "l.sqlite3", sqs=lambda: SpySqs(family.client, spy))

    assert (result.moved, result.duplicates, result.in_doubt, result.ambiguous) == (2, 1, 1, 1)
    assert [m.message_id for m in result.in_doubt_messages] == [ids["t-claimed"]]
    assert [m.message_id for m in result.ambiguous_messages] == [ids["t-before"]]
    assert "earlier form" in result.ambiguous_messages[0].detail
    assert arrived(family) == {"t-later": 1, "t-back": 1}
    assert family.depth() == (2, 0)  # t-claimed and t-before, held


# -- 5. messages that come back ---------------------------------------------------------------


def fail_in_source(family: Family) -> None:
    """Let the source queue dead-letter everything in it, as SQS does after maxReceiveCount
    receives (moto keeps the MessageId and attributes, as SQS does)."""
    for _ in range(20):
        response = family.client.receive_message(
            QueueUrl=family.queue_url, MaxNumberOfMessages=10, VisibilityTimeout=0
        )
        if not response.get("Messages"):
            return
    raise AssertionError("the source queue did not dead-letter its messages")


@pytest.mark.parametrize("stamped", [True, False], ids=["stamped", "no-room-for-stamp"])
def test_a_message_that_comes_back_moves_again_until_it_is_poison(
    family: Family, tmp_path: Path, stamped: bool
) -> None:
    full = {f"a{i}": {"DataType": "String", "StringValue": str(i)} for i in range(10)}
    put(family.client, family.dlq_url, [(body("t-1"), {} if stamped else full), body("t-2")])
    ledger = tmp_path / "l.sqlite3"

    first = move(family.client, ledger, max_redrives=2)
    assert family.depth() == (0, 0)
    fail_in_source(family)  # both fail again, back to the DLQ with their MessageIds
    second = move(family.client, ledger, max_redrives=2)
    fail_in_source(family)
    third = move(family.client, ledger, max_redrives=2)

    assert (first.moved, first.duplicates) == (2, 0)
    assert (second.moved, second.duplicates) == (2, 0)
    assert (third.moved, third.duplicates) == (0, 0)
    assert third.skipped == Counter({POISON: 2})
    assert family.depth() == (2, 0)  # poison stays in the DLQ
    generations = sorted(k.split(":")[3] for k in keys_in(ledger) if ":t-1:" in k)
    assert generations == ["g0", "g1"]

    asked = move(family.client, ledger, max_redrives=3)  # the operator raises the cap
    assert (asked.moved, asked.duplicates) == (2, 0)
    message = next(
        m for m in drain(family.client, family.queue_url) if task_id_of(m["Body"]) == "t-1"
    )
    got = message["MessageAttributes"]
    if stamped:
        assert got[attributes.COUNT]["StringValue"] == "3"
    else:
        assert {k: clean_attribute(v) for k, v in got.items()} == full


# -- 6. dry run -------------------------------------------------------------------------------


def seed_for_plan(family: Family) -> None:
    past = datetime.now(UTC) - timedelta(hours=1)
    poison = {attributes.COUNT: {"DataType": "Number", "StringValue": "3"}}
    put(
        family.client,
        family.dlq_url,
        [
            body("a-1"),
            body("a-2"),
            body("a-1"),  # a second copy
            body("b-1", task="apps.emails.tasks.send"),
            body("old", expires=past),
            (body("p-1"), poison),
        ],
    )


def test_a_dry_run_changes_nothing_and_says_what_it_would_do(
    family: Family, tmp_path: Path
) -> None:
    seed_for_plan(family)
    spy = Spy()

    result = move(family.client, None, sqs=lambda: SpySqs(family.client, spy))

    assert result.dry_run and result.run_id is None and result.ledger is None
    assert spy.sends == 0 and not any(kind == "delete" for kind, _ in spy.events)
    assert family.depth() == (6, 0)  # all back, visible
    assert family.depth(family.queue_url) == (0, 0)
    assert result.by_task == {TASK: 2, "apps.emails.tasks.send": 1}
    assert result.skipped == Counter({EXPIRED: 1, POISON: 1})
    assert result.duplicates == 1
    text = move_text(result)
    assert text.startswith("DRY RUN:")
    assert "3 would move" in text
    assert "expired: 1, poison: 1" in text
    assert "1 duplicate copy would be deleted" in text


def test_a_dry_run_reads_the_ledger_but_never_writes_it(family: Family, tmp_path: Path) -> None:
    ledger = tmp_path / "l.sqlite3"
    put(family.client, family.dlq_url, [body("a-1")])
    move(family.client, ledger)
    put(family.client, family.dlq_url, [body("a-1"), body("a-2")])  # a copy, and a new task
    with SqliteLedger(ledger) as led:
        runs_before = led.runs()
    keys_before = keys_in(ledger)

    result = move(family.client, ledger, execute=False)

    assert (result.moved, result.duplicates) == (1, 1)
    assert keys_in(ledger) == keys_before
    with SqliteLedger(ledger) as led:
        assert led.runs() == runs_before
    assert family.depth() == (2, 0)


def test_the_cli_dry_run_creates_no_ledger(family: Family, cli: Cli) -> None:

    from redrive.ledger import default_ledger_path

    seed_for_plan(family)
    outcome = cli.raising("move", "checkout", "--json")

    assert outcome.exit_code == 0, outcome.output
    plan = json.loads(outcome.stdout)
    assert plan["dry_run"] and plan["moved"] == 3
    assert not default_ledger_path().exists()
    # The state directory holds only the count of redrive's own receives (redrive.dlq.receive_log):
    # the dry run's receives raised every message's ApproximateReceiveCount.
    state = default_ledger_path().parent
    assert {p.name for p in state.iterdir() if not p.name.endswith(("-wal", "-shm"))} == {
        "receives.sqlite3"
    }
    assert family.depth() == (6, 0)


# -- 7. selection -----------------------------------------------------------------------------

NOW = 1_800_000_000.0


def test_task_globs_and_exclusions(family: Family, tmp_path: Path) -> None:
    put(
        family.client,
        family.dlq_url,
        [
            body("w-1", task="apps.webhooks.tasks.save"),
            body("w-2", task="apps.webhooks.tasks.notify"),
            body("e-1", task="apps.emails.tasks.send"),
            body("W-3", task="Apps.webhooks.tasks.save"),  # case matters
        ],
    )
    result = move(
        family.client,
        tmp_path / "l.sqlite3",
        selection=Selection(tasks=("apps.webhooks.*",), exclude_tasks=("*.notify",)),
    )
    assert (result.matched, result.moved) == (1, 1)
    assert arrived(family) == {"w-1": 1}
    assert family.depth() == (3, 0)


def test_age_filters_use_the_sent_timestamp(family: Family, tmp_path: Path) -> None:
    ages = {"h-1": 3 * 3600, "h-2": 2 * 3600, "m-1": 600, "m-2": 60}
    put(family.client, family.dlq_url, [body(t) for t in ages])

    def aged(message: Delivery) -> Delivery:
        sent = NOW - ages[str(task_id_of(message.body))]
        # As SQS would give it, with the attribute changed (the seam's fields follow).
        return sqs_message(
            message.message_id,
            message.tag,
            message.body,
            {**message.attributes, "SentTimestamp": str(int(sent * 1000))},
            attributes_of(message.headers),
            hidden_until=message.hidden_until,
        )

    ledger = tmp_path / "l.sqlite3"
    spy = Spy()

    def run(selection: Selection) -> Counter[str | None]:
        move(
            family.client,
            ledger,
            sqs=lambda: SpySqs(family.client, spy, patch=aged),
            now=lambda: NOW,
            selection=selection,
        )
        return arrived(family)

    assert run(Selection(older_than=2.5 * 3600)) == {"h-1": 1}
    assert run(Selection(newer_than=300)) == {"m-2": 1}
    assert run(Selection(older_than=300, newer_than=7200)) == {"h-2": 1, "m-1": 1}
    assert family.depth() == (0, 0)


def test_limit_caps_the_moved_count_exactly(family: Family, tmp_path: Path) -> None:
    seed_with_copies(family)
    ledger = tmp_path / "l.sqlite3"

    first = move(family.client, ledger, selection=Selection(limit=7))
    moved_first = arrived(family)
    second = move(family.client, ledger, selection=Selection(limit=13))
    moved_second = arrived(family)

    assert (first.moved, sum(moved_first.values())) == (7, 7)
    assert (second.moved, sum(moved_second.values())) == (13, 13)
    assert not set(moved_first) & set(moved_second)
    rest = move(family.client, ledger)
    assert rest.moved == 5
    assert family.depth() == (0, 0)


def test_message_id_selection(family: Family, tmp_path: Path) -> None:
    ids = put(family.client, family.dlq_url, [body(f"t-{i}") for i in range(12)])
    chosen = frozenset({ids[1], ids[11], "not-a-message-id"})

    result = move(family.client, tmp_path / "l.sqlite3", selection=Selection(message_ids=chosen))

    assert result.moved == 2
    assert arrived(family) == {"t-1": 1, "t-11": 1}
    assert family.depth() == (10, 0)


# -- 8. expiry and routing --------------------------------------------------------------------


def test_expired_tasks_are_skipped_unless_included(family: Family, tmp_path: Path) -> None:
    past = datetime.now(UTC) - timedelta(minutes=5)
    future = datetime.now(UTC) + timedelta(hours=1)
    put(
        family.client,
        family.dlq_url,
        [body("gone", expires=past), body("fresh", expires=future), body("plain")],
    )
    ledger = tmp_path / "l.sqlite3"

    first = move(family.client, ledger)
    assert first.skipped == Counter({EXPIRED: 1})
    assert arrived(family) == {"fresh": 1, "plain": 1}
    assert family.depth() == (1, 0)

    second = move(family.client, ledger, include_expired=True)
    assert second.moved == 1
    assert arrived(family) == {"gone": 1}


def test_to_sends_to_another_queue(family: Family, tmp_path: Path) -> None:
    other = family.client.create_queue(QueueName="onion-checkout-retry")["QueueUrl"]
    put(family.client, family.dlq_url, [body("t-1"), body("t-2")])
    to = describe_queue(SqsBroker(family.client), "onion-checkout-retry")

    result = move(family.client, tmp_path / "l.sqlite3", to=to)

    assert result.tasks[TASK].targets == Counter({"onion-checkout-retry": 2})
    assert arrived(family, other) == {"t-1": 1, "t-2": 1}
    assert family.depth(family.queue_url) == (0, 0)


NOT_CELERY_BODIES = ("legacy cron 4242: resync store 7", '{"event": "order.created", "id": 3}')


def test_bodies_that_are_not_celery_tasks_stay_out_of_celery_queues(
    family: Family, tmp_path: Path
) -> None:
    ids = put(family.client, family.dlq_url, [body("t-1"), *NOT_CELERY_BODIES])
    ledger = tmp_path / "l.sqlite3"

    dry = move(family.client, None)
    result = move(family.client, ledger)

    for run in (dry, result):
        assert (run.matched, run.moved) == (3, 1)
        assert run.skipped == Counter({NOT_CELERY: 2})
        assert run.to_json()["skipped_by_reason"] == {"not-celery": 2}
    assert not result.needs_attention  # reported, not a failure
    assert "--include-unknown" in move_text(result)
    assert arrived(family) == {"t-1": 1}
    assert family.depth() == (2, 0)
    asked = move(family.client, ledger, include_unknown=True)
    assert (asked.moved, asked.skipped_total) == (2, 0)
    assert sorted(m["Body"] for m in drain(family.client, family.queue_url)) == sorted(
        NOT_CELERY_BODIES
    )
    assert keys_in(ledger).keys() >= {f"sqs:{mid}:g0" for mid in ids[1:]}


def test_to_a_queue_that_is_not_a_familys_takes_every_body(family: Family, tmp_path: Path) -> None:
    # --to a quarantine queue: the operator named where the messages go, and no Celery
    # worker reads it. --to a family's queue is a Celery queue like the sources.
    quarantine = family.client.create_queue(QueueName="quarantine")["QueueUrl"]
    put(family.client, family.dlq_url, [body("t-1"), *NOT_CELERY_BODIES])
    ledger = tmp_path / "l.sqlite3"
    celery_queue = describe_queue(SqsBroker(family.client), "onion-checkout")

    kept = move(family.client, ledger, to=celery_queue, to_celery_queue=True)
    assert (kept.moved, kept.skipped) == (1, Counter({NOT_CELERY: 2}))
    to = describe_queue(SqsBroker(family.client), "quarantine")
    sent = move(family.client, ledger, to=to, to_celery_queue=False)

    assert (sent.moved, sent.skipped_total) == (2, 0)
    assert sorted(m["Body"] for m in drain(family.client, quarantine)) == sorted(NOT_CELERY_BODIES)
    assert family.depth() == (0, 0)


SEND_EMAIL = "apps.notifications.tasks.send_email"


def test_a_filter_that_matches_nothing_says_what_was_there(family: Family, tmp_path: Path) -> None:
    ids = put(
        family.client,
        family.dlq_url,
        [body(f"m-{i}", SEND_EMAIL) for i in range(3)] + [body("t-1"), body("t-2")],
    )

    missed = move(family.client, None, selection=Selection(tasks=("send_email",)))

    assert (missed.scanned, missed.matched, missed.moved) == (5, 0, 0)
    assert missed.misses is not None
    (pattern,) = missed.misses.patterns
    assert (pattern.pattern, pattern.near, pattern.suggestion) == (
        "send_email",
        (SEND_EMAIL,),
        "*.send_email",
    )
    assert missed.misses.tasks_seen == ((SEND_EMAIL, 3), (TASK, 2))
    text = move_text(missed)
    assert text.startswith(
        f"DRY RUN: DLQ {family.dlq_url.rsplit('/', 1)[-1]} (checkout): 5 scanned"
    )
    assert "did you mean --task '*.send_email'?" in text
    assert f"{SEND_EMAIL} (3)" in text
    data = missed.to_json()
    assert data["scanned"] == 5
    assert data["filter_misses"]["tasks"] == [
        {"pattern": "send_email", "near": [SEND_EMAIL], "suggestion": "*.send_email"}
    ]

    by_id = move(
        family.client, None, selection=Selection(message_ids=frozenset({ids[0], "not-an-id"}))
    )
    assert (by_id.matched, by_id.moved) == (1, 1)
    assert by_id.misses is not None and by_id.misses.ids_not_seen == ("not-an-id",)
    assert "1 of the 2 --message-id value(s) matched no message scanned: not-an-id" in (
        move_text(by_id)
    )

    found = move(family.client, None, selection=Selection(tasks=("*.send_email",)))
    assert (found.matched, found.misses) == (3, None)
    assert found.to_json()["filter_misses"] is None


def test_a_dlq_with_two_sources_routes_by_dead_letter_source_arn(
    sqs_client: Any, tmp_path: Path
) -> None:
    dlq = sqs_client.create_queue(QueueName="orders-dlq")["QueueUrl"]
    dlq_arn = sqs_client.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 3})
    sources = {
        name: sqs_client.create_queue(QueueName=name, Attributes={"RedrivePolicy": policy})[
            "QueueUrl"
        ]
        for name in ("orders-eu", "orders-us")
    }
    arn = {
        name: sqs_client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        for name, url in sources.items()
    }
    target = resolve_target(built_in_layout({}), "orders-dlq", lambda _: SqsBroker(sqs_client))
    assert sorted(s.name for s in target.sources) == sorted(sources)
    origin = {"eu-1": "orders-eu", "eu-2": "orders-eu", "us-1": "orders-us"}
    put(sqs_client, dlq, [body(t) for t in origin])
    ledger = tmp_path / "l.sqlite3"
    family = Family(sqs_client, sources["orders-eu"], dlq, dlq_arn)

    # moto does not say where a message came from: with two sources, nowhere to go.
    unknown = move(sqs_client, ledger, target=target)
    assert unknown.skipped == Counter({NO_TARGET: 3}) and unknown.moved == 0
    assert family.depth() == (3, 0)
    assert "pass --to QUEUE" in move_text(unknown)
    # Which queues it could have been, and why redrive cannot choose.
    assert unknown.no_target_candidates == ["orders-eu", "orders-us"]
    assert unknown.no_target_reason is not None
    assert "2 source queues" in unknown.no_target_reason
    assert "ListDeadLetterSourceQueues" in unknown.no_target_reason
    assert "(one of: orders-eu, orders-us)" in move_text(unknown)
    assert unknown.to_json()["no_target"] == {
        "reason": unknown.no_target_reason,
        "candidates": ["orders-eu", "orders-us"],
    }

    def with_source(message: Delivery) -> Delivery:
        source_arn = arn[origin[str(task_id_of(message.body))]]
        # As SQS would give it, with the attribute changed (the seam's fields follow).
        return sqs_message(
            message.message_id,
            message.tag,
            message.body,
            {**message.attributes, "DeadLetterQueueSourceArn": source_arn},
            attributes_of(message.headers),
            hidden_until=message.hidden_until,
        )

    routed = move(
        sqs_client, ledger, target=target, sqs=lambda: SpySqs(sqs_client, Spy(), patch=with_source)
    )
    assert routed.moved == 3
    assert arrived(family, sources["orders-eu"]) == {"eu-1": 1, "eu-2": 1}
    assert arrived(family, sources["orders-us"]) == {"us-1": 1}
    assert family.depth() == (0, 0)


# -- 9. two operators at once -----------------------------------------------------------------

OPERATOR = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path

    from redrive.dlq import scan
    from redrive.config import built_in_layout
    from redrive.ledger import SqliteLedger
    from redrive.operations.move import MoveEngine, MoveOptions
    from redrive.broker.sqs.queues import resolve_family
    from redrive.aws.session import AwsSettings
    from redrive.broker.sqs import open_sqs

    scan.RECEIVE_WAIT_SECONDS = 0  # a long poll would hold up the serial server
    endpoint, ledger, go = sys.argv[1:4]
    settings = AwsSettings(endpoint_url=endpoint, region="us-east-1")
    target = resolve_family(open_sqs(settings), built_in_layout({}).family("checkout"))
    print("ready", flush=True)
    while not Path(go).exists():
        time.sleep(0.01)
    with SqliteLedger(Path(ledger)) as led:
        result = MoveEngine(
            target, led, MoveOptions(execute=True, lease=10),
            broker_factory=lambda: open_sqs(settings),
        ).run()
    print(json.dumps(result.to_json()), flush=True)
    """
)


@pytest.fixture
def serial_server(tmp_path: Path) -> Iterator[Any]:
    server = start_moto_server(tmp_path / "moto.log", serial=True)
    try:
        yield server
    finally:
        server.process.terminate()
        server.process.wait(10)


def test_two_operators_at_once_send_each_task_once(serial_server: Any, tmp_path: Path) -> None:
    client = serial_server.client()
    try:
        family = make_family(client)
        ids = [f"t-{i}" for i in range(180)]
        # Twenty tasks have a second copy, spread through the queue.
        texts = [body(t) for t in ids] + [body(t) for t in ids[::9]]
        put(client, family.dlq_url, texts)
        ledger = tmp_path / "shared.sqlite3"
        SqliteLedger(ledger).close()  # created once, as an operator's first run would
        script = tmp_path / "operator.py"
        script.write_text(OPERATOR)
        go = tmp_path / "go"
        operators = [
            subprocess.Popen(
                [sys.executable, str(script), serial_server.endpoint_url, str(ledger), str(go)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=serial_server.env(),
                text=True,
            )
            for _ in range(2)
        ]
        for op in operators:
            assert op.stdout is not None
            assert op.stdout.readline().strip() == "ready", op.stderr and op.stderr.read()
        go.touch()
        results = []
        for op in operators:
            out, err = op.communicate(timeout=120)
            assert op.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))

        # What one operator saw as busy (the other's claim) a last run deletes as duplicate.
        cleanup = move(client, ledger, sqs=lambda: SqsBroker(client))

        assert all(r["moved"] > 0 for r in results), "both operators did some of the work"
        assert sum(r["moved"] for r in results) == len(ids)
        assert cleanup.moved == 0
        assert sum(r["duplicates_deleted"] for r in results) + cleanup.duplicates == 20
        assert cleanup.in_doubt == 0 and all(r["in_doubt"] == 0 for r in results)
        assert arrived(family) == {t: 1 for t in ids}
        assert family.depth() == (0, 0)
    finally:
        client.close()
    log = (tmp_path / "moto.log").read_text()
    assert not re.search(r'" 5\d\d ', log), log[-2000:]


# -- 10. interrupt ----------------------------------------------------------------------------


def test_an_interrupt_finishes_the_batch_gives_back_the_rest_and_resumes(
    family: Family, tmp_path: Path
) -> None:
    ids = [f"t-{i}" for i in range(25)]
    texts = []
    for i, task_id in enumerate(ids):
        if i % 5 == 0:  # not selected: held until the end of the run, then given back
            texts.append(body(f"x-{i}", task="apps.other.tasks.x"))
        texts.append(body(task_id))
    put(family.client, family.dlq_url, texts)
    ledger = tmp_path / "l.sqlite3"
    stop = threading.Event()
    only = Selection(tasks=(TASK,))

    result = move(
        family.client, ledger, stop=stop, on_progress=lambda _: stop.set(), selection=only
    )

    # The batch in flight is finished, and so is the one the receiving stage had already
    # received and decided on (it is not claimed before the first is through).
    assert result.interrupted and result.scanned in (10, 20)
    assert result.moved == (8 if result.scanned == 10 else 16)
    assert family.depth() == (30 - result.moved, 0)  # nothing left hidden
    with SqliteLedger(ledger) as led:
        run = led.run(str(result.run_id))
    assert run is not None and run.outcome == "interrupted"
    assert "interrupted" in move_text(result)

    rest = move(family.client, ledger, selection=only)
    assert not rest.interrupted
    assert result.moved + rest.moved == 25
    assert arrived(family) == {t: 1 for t in ids}
    assert family.depth() == (5, 0)


# -- 11. batch splitting ----------------------------------------------------------------------


def test_big_messages_are_sent_in_requests_within_the_batch_limit(
    family: Family, tmp_path: Path
) -> None:
    texts = [encode(TASK, ["x" * 56_000], task_id=f"m-{i}") for i in range(7)]  # ~100 KB
    texts.append(encode(TASK, ["y" * 140_000], task_id="l-1"))  # ~250 KB
    assert all(90_000 < len(t) < MAX_BATCH_BYTES for t in texts)
    put(family.client, family.dlq_url, texts[:4])
    put(family.client, family.dlq_url, texts[4:])
    sizes: list[tuple[int, int]] = []

    def send_message_batch(QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        payload = sum(
            len(e["MessageBody"].encode()) + attribute_size(e.get("MessageAttributes", {}))
            for e in Entries
        )
        sizes.append((len(Entries), payload))
        return dict(family.client.send_message_batch(QueueUrl=QueueUrl, Entries=Entries))

    proxy = Proxy(family.client, send_message_batch=send_message_batch)

    result = move(
        family.client,
        tmp_path / "l.sqlite3",
        sqs=lambda: SqsBroker(family.client, send_client=proxy),
    )

    assert result.moved == 8
    assert all(payload <= MAX_BATCH_BYTES for _, payload in sizes), sizes
    assert sum(n for n, _ in sizes) == 8
    assert len(sizes) >= 5  # at most two ~100 KB messages per request, the big one alone
    assert sorted(m["Body"] for m in drain(family.client, family.queue_url)) == sorted(texts)


# -- 12. workers ------------------------------------------------------------------------------


def test_three_workers_send_each_task_once(family: Family, tmp_path: Path) -> None:
    ids = [f"t-{i}" for i in range(60)]
    put(family.client, family.dlq_url, [body(t) for t in ids] + [body(t) for t in ids[::7]])
    ledger = tmp_path / "l.sqlite3"

    result = move(family.client, ledger, workers=3)
    cleanup = move(family.client, ledger)

    # A copy one worker met while another worker of the run held its twin's claim is
    # skipped as busy and left for the next run, which deletes it.
    assert (result.moved, cleanup.moved) == (60, 0)
    assert result.duplicates + cleanup.duplicates == 9
    assert result.in_doubt == 0 and cleanup.in_doubt == 0
    assert arrived(family) == {t: 1 for t in ids}
    assert family.depth() == (0, 0)


def test_progress_never_shows_more_matched_than_scanned_nor_more_moved_than_matched(
    family: Family, tmp_path: Path
) -> None:
    """Issue 22: one worker's batch matched (and claimed) while another worker reports its
    progress: the report must count that batch as scanned too (``360 matched / 350
    scanned`` was a worker's matches read before its batch was counted)."""
    ids = [f"t-{i}" for i in range(60)]
    put(family.client, family.dlq_url, [body(t) for t in ids])
    watch = ParkOneWorker("claimed", lambda r: (r.scanned, r.matched, r.moved))
    ledger = SqliteLedger(tmp_path / "l.sqlite3")
    try:
        result = MoveEngine(
            checkout(family.client),
            ledger,
            MoveOptions(execute=True, workers=2, pipelined=False, lease=30),
            broker_factory=lambda: SqsBroker(family.client),
            observer=watch,
        ).run()
    finally:
        ledger.close()
    assert watch.heard_while_parked.is_set() and result.moved == 60
    for scanned, matched, moved in watch.reports:
        assert moved <= matched <= scanned, watch.reports


def test_a_message_sqs_delivers_again_after_its_move_is_deleted_not_counted_again(
    family: Family, tmp_path: Path
) -> None:
    ids = [f"t-{i}" for i in range(30)]
    put(family.client, family.dlq_url, [body(t) for t in ids])
    redelivery = Redelivery(family.client)

    result = move(family.client, tmp_path / "l.sqlite3", sqs=redelivery.sqs)

    assert redelivery.delivered_again == 1
    assert (result.moved, result.duplicates, result.scanned) == (30, 0, 30)
    assert result.redelivered == 1
    assert arrived(family) == {t: 1 for t in ids}
    assert family.depth() == (0, 0)


def test_the_rate_limit_holds_for_a_run(family: Family, tmp_path: Path) -> None:
    put(family.client, family.dlq_url, [body(f"t-{i}") for i in range(30)])
    started = time.monotonic()

    result = move(family.client, tmp_path / "l.sqlite3", rate=20)

    # 30 messages at 20/s, one second's worth at once: the last batch of ten waits ~0.5 s.
    assert result.moved == 30
    assert time.monotonic() - started >= 0.4


# -- 11. the two stages -----------------------------------------------------------------------


class FailingReceives(SpySqs):
    """Receives that fail from the ``nth`` one on (the SQS endpoint went away)."""

    def __init__(self, client: Any, spy: Spy, nth: int) -> None:
        super().__init__(client, spy)
        self.nth = nth
        self.calls = 0

    def receive(self, url: str, **kwargs: Any) -> list[Delivery]:
        self.calls += 1
        if self.calls >= self.nth:
            raise AwsUnavailable("cannot reach SQS at http://127.0.0.1:1 (test)")
        return super().receive(url, **kwargs)


def test_an_error_in_the_receiving_stage_ends_the_run_after_the_batch_in_flight(
    family: Family, tmp_path: Path
) -> None:
    ids = [f"t-{i}" for i in range(25)]
    put(family.client, family.dlq_url, [body(t) for t in ids])
    ledger = tmp_path / "l.sqlite3"
    spy = Spy()
    failing = FailingReceives(family.client, spy, nth=2)

    with pytest.raises(AwsUnavailable, match="cannot reach SQS"):
        move(family.client, ledger, sqs=lambda: failing)

    # The first batch went through whole; nothing is left claimed, so nothing is in doubt.
    assert len(spy.received) == 1
    first = {task_id_of(m.body) for m in spy.received[0]}
    keys = keys_in(ledger)
    assert {s for s, _, _ in keys.values()} == {KeyState.DONE}
    assert {k.split(":")[1] for k in keys} == first
    with SqliteLedger(ledger) as led:
        (run,) = led.runs()
    assert run.outcome == "failed"

    rest = move(family.client, ledger)
    assert (rest.moved, rest.in_doubt) == (len(ids) - len(first), 0)
    assert arrived(family) == {t: 1 for t in ids}
    assert family.depth() == (0, 0)


def test_copies_of_a_task_in_consecutive_batches_are_sent_once_with_either_stage_count(
    family: Family, tmp_path: Path
) -> None:
    # The second stage may decide on batch k+1 while batch k's claim is in flight: the claim,
    # made once batch k is through, finds the key sent and deletes the copy as a duplicate.
    tasks_of = seed_with_copies(family)
    for pipelined, name in ((True, "a"), (False, "b")):
        if name == "b":
            family.client.purge_queue(QueueUrl=family.queue_url)
            tasks_of = seed_with_copies(family)
        result = move(family.client, tmp_path / f"{name}.sqlite3", pipelined=pipelined)
        assert (result.moved, result.duplicates, result.in_doubt) == (25, len(DUPLICATED), 0)
        assert result.skipped_total == 0
        assert arrived(family) == {t: 1 for t in set(tasks_of.values())}
        assert family.depth() == (0, 0)


def test_copies_behind_a_claim_lost_to_another_run_are_each_counted_busy(
    family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another run claims the key between this run's decision and its claim: the first copy
    # and the further copies of its key in the batch stay in the DLQ, and each is counted
    # (a follower used to be left uncounted: the rows fell short of what stayed).
    put(family.client, family.dlq_url, [body("t-1")] * 3)
    ledger = tmp_path / "l.sqlite3"
    claim_many = SqliteLedger.claim_many

    def another_run_first(self: SqliteLedger, run_id: str, claims: Sequence[Claim]) -> Any:
        if run_id != "other":
            with SqliteLedger(ledger) as other:
                other.start_run("other", command="move", info={})
                claim_many(other, "other", claims)
        return claim_many(self, run_id, claims)

    monkeypatch.setattr(SqliteLedger, "claim_many", another_run_first)
    result = move(family.client, ledger, pipelined=False)
    assert (result.moved, result.duplicates, result.in_doubt) == (0, 0, 0)
    assert result.matched == 3
    assert result.skipped == Counter({"claimed-by-another-run": 3})
    assert family.depth()[0] + family.depth()[1] == 3
