"""A minimal SQS-compatible HTTP server for benchmarking SQS *clients* on 127.0.0.1.

Why it exists: stock moto's SQS does work proportional to the queue's depth on every call
(it walks the whole queue to compute attributes and to find visible messages), so a
benchmark of ``redrive inspect`` against moto at 10,000+ messages measures moto, not
redrive. This server keeps every operation O(1) amortised, so what a benchmark measures is
the client: boto3's request/response cost and the client's own work.

It speaks the protocol boto3/botocore 1.44 use for SQS: JSON 1.0 over HTTP POST, operation in
``X-Amz-Target: AmazonSQS.<Op>``, ``Content-Type: application/x-amz-json-1.0``, errors as
``{"__type": ..., "message": ...}`` with the ``x-amzn-query-error`` header SQS adds for its
old query-protocol codes (so botocore reports e.g. ``AWS.SimpleQueueService.NonExistentQueue``).

Operations: CreateQueue, GetQueueUrl, GetQueueAttributes, SetQueueAttributes, ListQueues,
ListDeadLetterSourceQueues, SendMessage(Batch), ReceiveMessage, DeleteMessage(Batch),
ChangeMessageVisibility(Batch), PurgeQueue, DeleteQueue.

Data structures, per queue: visible messages in a deque; in-flight and delayed messages in
a heap ordered by the time they become visible, moved back to the deque lazily (entries
made stale by a later visibility change are skipped by a generation number); messages by
sequence number in a dict. A receipt handle names the message's sequence number and its
receive count, so a handle from an earlier receive is recognised as stale, like SQS does,
without a table of handles. MD5OfBody / MD5OfMessageBody and MD5OfMessageAttributes are
computed exactly as SQS computes them (botocore 1.44 does not check them, other SDKs do).
A RedrivePolicy is honoured: a message received more than maxReceiveCount times moves to
the DLQ on its next receive, keeping its MessageId, SentTimestamp and receive count.
Long polling (WaitTimeSeconds) returns at once when messages are visible, else waits up to
the wait time for one to become visible.

Like SQS, a standard queue holds at most 120,000 messages in flight (``--inflight-limit``):
beyond that a short-poll receive fails with OverLimit and a long poll (WaitTimeSeconds > 0)
returns no messages and no error, as SQS documents.

Not implemented (not needed to measure a client): authentication (signatures are not
checked), FIFO ordering and deduplication (``.fifo`` queues behave as standard queues),
message retention expiry, tags, permissions, message move tasks, the query (XML) protocol.

Run it standalone with ``python bench/fast_sqs.py --port 9324``; it prints one line with
its endpoint and serves until SIGTERM/SIGINT. It only listens on loopback addresses.
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder comes first on sys.path, and bench/inspect.py would
# shadow the standard library's inspect module for everything imported after this line.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse  # noqa: E402
import base64  # noqa: E402
import binascii  # noqa: E402
import collections  # noqa: E402
import hashlib  # noqa: E402
import heapq  # noqa: E402
import ipaddress  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Callable  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402
from typing import Any  # noqa: E402

ACCOUNT = "123456789012"
REGION = "us-east-1"
MAX_WAIT_SECONDS = 20
MAX_VISIBILITY = 43_200
MAX_BATCH = 10
MAX_MESSAGE_BYTES = 262_144
#: SQS's quota of in-flight messages per standard queue ("approximately 120,000"): beyond it
#: a short poll fails with OverLimit, a long poll returns nothing. ``--inflight-limit 0``: none.
INFLIGHT_LIMIT = 120_000
SENDER_ID = "AIDAIT2UOQQY3AUEKVGXU"

VISIBLE, INFLIGHT, DELAYED, DELETED = 0, 1, 2, 3

_ENTRY_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}(\.fifo)?$")
# Real receipt handles are a few hundred characters; clients that keep them (in memory or
# spooled) should pay for that here too. The part before "~" is what the server reads.
_HANDLE_PAD = "~" + base64.b64encode(os.urandom(270)).decode("ascii")

_DEFAULT_ATTRIBUTES = {
    "VisibilityTimeout": "30",
    "MaximumMessageSize": str(MAX_MESSAGE_BYTES),
    "MessageRetentionPeriod": "345600",
    "DelaySeconds": "0",
    "ReceiveMessageWaitTimeSeconds": "0",
    "SqsManagedSseEnabled": "true",
}
_SETTABLE = {
    *_DEFAULT_ATTRIBUTES,
    "RedrivePolicy",
    "RedriveAllowPolicy",
    "Policy",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "FifoQueue",
    "ContentBasedDeduplication",
    "DeduplicationScope",
    "FifoThroughputLimit",
}
_MESSAGE_SYSTEM_ATTRIBUTES = (
    "SenderId",
    "SentTimestamp",
    "ApproximateReceiveCount",
    "ApproximateFirstReceiveTimestamp",
)


class SqsError(Exception):
    """An error response: HTTP 400 unless said otherwise."""

    def __init__(
        self, code: str, message: str, *, query_code: str | None = None, status: int = 400
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.query_code = query_code
        self.status = status


def _missing_queue() -> SqsError:
    return SqsError(
        "QueueDoesNotExist",
        "The specified queue does not exist.",
        query_code="AWS.SimpleQueueService.NonExistentQueue",
    )


def _invalid(message: str) -> SqsError:
    return SqsError("InvalidParameterValue", message, query_code="InvalidParameterValue")


class EntryError(Exception):
    """A failure of one batch entry (reported in ``Failed``, not as an error response)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# -- MD5s as SQS computes them ----------------------------------------------------------------


def md5_of_body(body: str) -> str:
    return hashlib.md5(body.encode("utf-8")).hexdigest()


def md5_of_attributes(attributes: dict[str, dict[str, Any]]) -> str:
    """SQS's MD5OfMessageAttributes: names sorted; for each, length-prefixed name, data type,
    a transport byte (1 string/number, 2 binary) and length-prefixed value."""
    digest = hashlib.md5()
    for name in sorted(attributes):
        value = attributes[name]
        data_type = str(value["DataType"])
        for part in (name.encode("utf-8"), data_type.encode("utf-8")):
            digest.update(struct.pack(">I", len(part)) + part)
        if "StringValue" in value:
            raw = str(value["StringValue"]).encode("utf-8")
            digest.update(b"\x01" + struct.pack(">I", len(raw)) + raw)
        else:
            raw = base64.b64decode(value.get("BinaryValue", ""))
            digest.update(b"\x02" + struct.pack(">I", len(raw)) + raw)
    return digest.hexdigest()


def _clean_attributes(raw: Any) -> dict[str, dict[str, Any]]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or len(raw) > 10:
        raise _invalid("Message attributes must be a map of at most 10 entries.")
    out: dict[str, dict[str, Any]] = {}
    for name, value in raw.items():
        if not isinstance(value, dict) or not isinstance(value.get("DataType"), str):
            raise _invalid(f"Message attribute {name} must have a DataType.")
        data_type = value["DataType"]
        base = data_type.split(".", 1)[0]
        if base in ("String", "Number"):
            if not isinstance(value.get("StringValue"), str):
                raise _invalid(f"Message attribute {name} must have a StringValue.")
            out[name] = {"DataType": data_type, "StringValue": value["StringValue"]}
        elif base == "Binary":
            if not isinstance(value.get("BinaryValue"), str):
                raise _invalid(f"Message attribute {name} must have a BinaryValue.")
            try:
                base64.b64decode(value["BinaryValue"], validate=True)
            except (binascii.Error, ValueError):
                raise _invalid(
                    f"Message attribute {name} has a BinaryValue that is not base64."
                ) from None
            out[name] = {"DataType": data_type, "BinaryValue": value["BinaryValue"]}
        else:
            raise _invalid(f"Message attribute {name} has an unknown DataType {data_type}.")
    return out


# -- the store ----------------------------------------------------------------------------------


class Message:
    __slots__ = (
        "attributes",
        "body",
        "deadline",
        "first_receive_ms",
        "gen",
        "md5_attributes",
        "md5_body",
        "message_id",
        "queue",
        "receive_count",
        "sent_ms",
        "seq",
        "state",
    )

    def __init__(
        self,
        seq: int,
        body: str,
        attributes: dict[str, dict[str, Any]],
        sent_ms: int,
        queue: Queue,
    ) -> None:
        self.seq = seq
        self.message_id = str(uuid.uuid4())
        self.body = body
        self.md5_body = md5_of_body(body)
        self.attributes = attributes
        self.md5_attributes = md5_of_attributes(attributes) if attributes else None
        self.sent_ms = sent_ms
        self.receive_count = 0
        self.first_receive_ms: int | None = None
        self.state = VISIBLE
        self.deadline = 0.0
        self.gen = 0
        self.queue = queue


class Queue:
    def __init__(self, qid: int, name: str, url: str, attributes: dict[str, str]) -> None:
        self.qid = qid
        self.name = name
        self.url = url
        self.arn = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"
        now = str(int(time.time()))
        self.attributes = dict(_DEFAULT_ATTRIBUTES)
        self.attributes.update(attributes)
        self.created = now
        self.modified = now
        self.messages: dict[int, Message] = {}
        self.visible: collections.deque[Message] = collections.deque()
        # (visible-at, tie-breaker, generation, message)
        self.pending: list[tuple[float, int, int, Message]] = []
        self.n_visible = 0
        self.n_inflight = 0
        self.n_delayed = 0

    def max_receives(self) -> tuple[int, str] | None:
        raw = self.attributes.get("RedrivePolicy")
        if not raw:
            return None
        try:
            policy = json.loads(raw)
            return int(policy["maxReceiveCount"]), str(policy["deadLetterTargetArn"])
        except (ValueError, KeyError, TypeError):
            return None


class Store:
    """Every queue of the server; callers hold ``self.lock`` (a Condition) around each op."""

    def __init__(self, endpoint: str, *, inflight_limit: int = INFLIGHT_LIMIT) -> None:
        self.endpoint = endpoint
        self.inflight_limit = inflight_limit
        self.lock = threading.Condition()
        self.queues: dict[str, Queue] = {}
        self._qids = itertools.count(1)
        self._seqs = itertools.count(1)
        self._ties = itertools.count()
        self.calls: collections.Counter[str] = collections.Counter()
        """Requests served per operation (ChangeMessageVisibilityBatch split by whether it
        hides, ``:hide``, or releases, ``:release``); ``GET /stats`` returns them."""

    # -- queues --

    def queue_for_url(self, url: Any) -> Queue:
        if not isinstance(url, str) or not url:
            raise _invalid("QueueUrl is required.")
        queue = self.queues.get(url.rstrip("/").rsplit("/", 1)[-1])
        if queue is None:
            raise _missing_queue()
        return queue

    def queue_for_arn(self, arn: str) -> Queue | None:
        return self.queues.get(arn.rsplit(":", 1)[-1])

    def url_for(self, name: str) -> str:
        return f"{self.endpoint}/{ACCOUNT}/{name}"

    # -- lazy bookkeeping --

    def _set_visible(self, queue: Queue, message: Message) -> None:
        if message.state == INFLIGHT:
            queue.n_inflight -= 1
        elif message.state == DELAYED:
            queue.n_delayed -= 1
        message.state = VISIBLE
        message.gen += 1
        queue.n_visible += 1
        queue.visible.append(message)

    def _hide(self, queue: Queue, message: Message, until: float, state: int) -> None:
        if message.state == VISIBLE:
            queue.n_visible -= 1
        elif message.state == INFLIGHT:
            queue.n_inflight -= 1
        elif message.state == DELAYED:
            queue.n_delayed -= 1
        message.state = state
        message.gen += 1
        message.deadline = until
        if state == INFLIGHT:
            queue.n_inflight += 1
        else:
            queue.n_delayed += 1
        heapq.heappush(queue.pending, (until, next(self._ties), message.gen, message))

    def requeue_due(self, queue: Queue, now: float) -> None:
        pending = queue.pending
        while pending and pending[0][0] <= now:
            _, _, gen, message = heapq.heappop(pending)
            if message.gen == gen and message.state in (INFLIGHT, DELAYED):
                self._set_visible(queue, message)
        # Entries made stale by visibility changes would pile up in a heap that is never
        # due: rebuild it when most of it is stale (amortised O(1) per change).
        live = queue.n_inflight + queue.n_delayed
        if len(pending) > 64 and len(pending) > 4 * live:
            queue.pending = [e for e in pending if e[3].gen == e[2] and e[3].state != VISIBLE]
            heapq.heapify(queue.pending)

    def _remove(self, queue: Queue, message: Message) -> None:
        if message.state == VISIBLE:
            queue.n_visible -= 1
        elif message.state == INFLIGHT:
            queue.n_inflight -= 1
        elif message.state == DELAYED:
            queue.n_delayed -= 1
        message.state = DELETED
        message.gen += 1
        queue.messages.pop(message.seq, None)

    def _handle(self, queue: Queue, message: Message) -> str:
        return (
            f"{queue.qid}.{message.seq}.{message.receive_count}.{os.urandom(6).hex()}" + _HANDLE_PAD
        )

    def _message_for_handle(self, queue: Queue, handle: Any) -> Message:
        if not isinstance(handle, str):
            raise EntryError("ReceiptHandleIsInvalid", "The input receipt handle is invalid.")
        try:
            qid, seq, count, _ = handle.split("~", 1)[0].split(".")
            key = (int(qid), int(seq), int(count))
        except ValueError:
            raise EntryError(
                "ReceiptHandleIsInvalid", f'The input receipt handle "{handle}" is not valid.'
            ) from None
        message = queue.messages.get(key[1])
        if key[0] != queue.qid or message is None or message.receive_count != key[2]:
            raise EntryError(
                "ReceiptHandleIsInvalid",
                "The receipt handle has expired or the message was received again.",
            )
        return message

    # -- operations --

    def create_queue(self, req: dict[str, Any]) -> dict[str, Any]:
        name = req.get("QueueName")
        if not isinstance(name, str) or not _QUEUE_NAME.match(name):
            raise _invalid("Can only include alphanumeric characters, hyphens, or underscores.")
        attributes = {k: str(v) for k, v in (req.get("Attributes") or {}).items()}
        for key in attributes:
            if key not in _SETTABLE:
                raise SqsError("InvalidAttributeName", f"Unknown Attribute {key}.")
        existing = self.queues.get(name)
        if existing is not None:
            for key, value in attributes.items():
                if existing.attributes.get(key) != value:
                    raise SqsError(
                        "QueueNameExists",
                        f"A queue already exists with the same name and a different value "
                        f"for attribute {key}",
                        query_code="QueueAlreadyExists",
                    )
            return {"QueueUrl": existing.url}
        queue = Queue(next(self._qids), name, self.url_for(name), attributes)
        self.queues[name] = queue
        return {"QueueUrl": queue.url}

    def delete_queue(self, req: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_for_url(req.get("QueueUrl"))
        del self.queues[queue.name]
        return {}

    def get_queue_url(self, req: dict[str, Any]) -> dict[str, Any]:
        queue = self.queues.get(str(req.get("QueueName", "")))
        if queue is None:
            raise _missing_queue()
        return {"QueueUrl": queue.url}

    def list_queues(self, req: dict[str, Any]) -> dict[str, Any]:
        prefix = str(req.get("QueueNamePrefix") or "")
        names = sorted(n for n in self.queues if n.startswith(prefix))
        start = int(req["NextToken"]) if str(req.get("NextToken", "")).isdigit() else 0
        limit = req.get("MaxResults")
        if limit is None:
            return {"QueueUrls": [self.queues[n].url for n in names[:1000]]} if names else {}
        page = names[start : start + int(limit)]
        out: dict[str, Any] = {"QueueUrls": [self.queues[n].url for n in page]}
        if start + int(limit) < len(names):
            out["NextToken"] = str(start + int(limit))
        return out

    def list_dead_letter_source_queues(self, req: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_for_url(req.get("QueueUrl"))
        urls = []
        for other in sorted(self.queues.values(), key=lambda q: q.name):
            policy = other.max_receives()
            if policy is not None and policy[1] == queue.arn:
                urls.append(other.url)
        return {"queueUrls": urls}

    def get_queue_attributes(self, req: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_for_url(req.get("QueueUrl"))
        self.requeue_due(queue, time.time())
        names = req.get("AttributeNames") or []
        everything = dict(queue.attributes)
        everything.update(
            {
                "QueueArn": queue.arn,
                "ApproximateNumberOfMessages": str(queue.n_visible),
                "ApproximateNumberOfMessagesNotVisible": str(queue.n_inflight),
                "ApproximateNumberOfMessagesDelayed": str(queue.n_delayed),
                "CreatedTimestamp": queue.created,
                "LastModifiedTimestamp": queue.modified,
            }
        )
        if "All" in names:
            chosen = everything
        else:
            unknown = [n for n in names if n not in everything and n not in _SETTABLE]
            if unknown:
                raise SqsError("InvalidAttributeName", f"Unknown Attribute {unknown[0]}.")
            chosen = {n: everything[n] for n in names if n in everything}
        return {"Attributes": chosen} if chosen else {}

    def set_queue_attributes(self, req: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_for_url(req.get("QueueUrl"))
        for key, value in (req.get("Attributes") or {}).items():
            if key not in _SETTABLE:
                raise SqsError("InvalidAttributeName", f"Unknown Attribute {key}.")
            if key == "RedrivePolicy" and value:
                try:
                    policy = json.loads(value)
                    int(policy["maxReceiveCount"])
                    str(policy["deadLetterTargetArn"])
                except (ValueError, KeyError, TypeError):
                    raise _invalid(
                        f"Invalid value for the parameter RedrivePolicy: {value}"
                    ) from None
            if value == "" and key in ("RedrivePolicy", "RedriveAllowPolicy", "Policy"):
                queue.attributes.pop(key, None)
            else:
                queue.attributes[key] = str(value)
        queue.modified = str(int(time.time()))
        return {}

    def _enqueue(self, queue: Queue, body: Any, attributes: Any, delay: Any, now: float) -> Message:
        if not isinstance(body, str) or not body:
            raise EntryError("InvalidParameterValue", "The request must contain a MessageBody.")
        cleaned = _clean_attributes(attributes)
        size = len(body.encode("utf-8"))
        if size > int(queue.attributes["MaximumMessageSize"]):
            raise EntryError(
                "InvalidParameterValue", f"One or more parameters are invalid: {size} bytes."
            )
        delay_s = int(queue.attributes["DelaySeconds"]) if delay is None else int(delay)
        if not 0 <= delay_s <= 900:
            raise EntryError("InvalidParameterValue", "DelaySeconds must be 0 to 900.")
        message = Message(next(self._seqs), body, cleaned, int(now * 1000), queue)
        queue.messages[message.seq] = message
        if delay_s:
            message.state = VISIBLE  # _hide moves it from "visible" to delayed
            queue.n_visible += 1
            self._hide(queue, message, now + delay_s, DELAYED)
        else:
            queue.n_visible += 1
            queue.visible.append(message)
        return message

    @staticmethod
    def _sent(message: Message) -> dict[str, Any]:
        out: dict[str, Any] = {
            "MessageId": message.message_id,
            "MD5OfMessageBody": message.md5_body,
        }
        if message.md5_attributes is not None:
            out["MD5OfMessageAttributes"] = message.md5_attributes
        return out

    def send_message(self, req: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_for_url(req.get("QueueUrl"))
        try:
            message = self._enqueue(
                queue,
                req.get("MessageBody"),
                req.get("MessageAttributes"),
                req.get("DelaySeconds"),
                time.time(),
            )
        except EntryError as exc:
            raise SqsError(exc.code, exc.message, query_code=exc.code) from None
        self.lock.notify_all()
        return self._sent(message)

    def send_message_batch(self, req: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_for_url(req.get("QueueUrl"))
        entries = _batch_entries(req, "Send")
        total = sum(len(str(e.get("MessageBody", "")).encode("utf-8")) for e in entries)
        if total > MAX_MESSAGE_BYTES:
            raise SqsError(
                "BatchRequestTooLong",
                f"Batch requests cannot be longer than {MAX_MESSAGE_BYTES} bytes.",
                query_code="AWS.SimpleQueueService.BatchRequestTooLong",
            )
        now = time.time()

        def send(entry: dict[str, Any]) -> dict[str, Any]:
            message = self._enqueue(
                queue,
                entry.get("MessageBody"),
                entry.get("MessageAttributes"),
                entry.get("DelaySeconds"),
                now,
            )
            return self._sent(message)

        result = _run_batch(entries, send)
        self.lock.notify_all()
        return result

    def receive_message(self, req: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_for_url(req.get("QueueUrl"))
        want = int(req.get("MaxNumberOfMessages") or 1)
        if not 1 <= want <= MAX_BATCH:
            raise _invalid(f"Value {want} for parameter MaxNumberOfMessages is invalid.")
        visibility = req.get("VisibilityTimeout")
        visibility_s = (
            int(queue.attributes["VisibilityTimeout"]) if visibility is None else int(visibility)
        )
        if not 0 <= visibility_s <= MAX_VISIBILITY:
            raise _invalid(f"Value {visibility_s} for parameter VisibilityTimeout is invalid.")
        wait = req.get("WaitTimeSeconds")
        wait_s = (
            int(queue.attributes["ReceiveMessageWaitTimeSeconds"]) if wait is None else int(wait)
        )
        if not 0 <= wait_s <= MAX_WAIT_SECONDS:
            raise _invalid(f"Value {wait_s} for parameter WaitTimeSeconds is invalid.")
        system_names = set(req.get("MessageSystemAttributeNames") or []) | set(
            req.get("AttributeNames") or []
        )
        attribute_names = list(req.get("MessageAttributeNames") or [])

        give_up = time.monotonic() + wait_s
        while True:
            now = time.time()
            self.requeue_due(queue, now)
            over = bool(
                visibility_s and self.inflight_limit and queue.n_inflight >= self.inflight_limit
            )
            if over and wait_s:
                # What SQS documents for long polling at the quota: no error, no messages.
                got = []
            elif over:
                raise SqsError(
                    "OverLimit",
                    f"{queue.n_inflight} messages are in flight in {queue.name}: the limit "
                    f"is {self.inflight_limit}.",
                    query_code="AWS.SimpleQueueService.OverLimit",
                )
            else:
                got = self._take(queue, want, now, visibility_s)
            remaining = give_up - time.monotonic()
            if got or remaining <= 0 or self.queues.get(queue.name) is not queue:
                break
            timeout = remaining
            if queue.pending:
                timeout = min(timeout, max(0.0, queue.pending[0][0] - now) + 0.001)
            self.lock.wait(timeout)
        if not got:
            return {}
        return {"Messages": [_received(m, h, system_names, attribute_names) for m, h in got]}

    def _take(
        self, queue: Queue, want: int, now: float, visibility_s: int
    ) -> list[tuple[Message, str]]:
        got: list[tuple[Message, str]] = []
        again: list[Message] = []
        redrive = queue.max_receives()
        now_ms = int(now * 1000)
        while queue.visible and len(got) < want:
            message = queue.visible.popleft()
            if message.state != VISIBLE or message.queue is not queue:
                continue  # deleted, or stale (hidden again since it was appended)
            if redrive is not None and message.receive_count >= redrive[0]:
                target = self.queue_for_arn(redrive[1])
                if target is not None and target is not queue:
                    self._move(queue, message, target)
                    continue
            message.receive_count += 1
            if message.first_receive_ms is None:
                message.first_receive_ms = now_ms
            if visibility_s:
                self._hide(queue, message, now + visibility_s, INFLIGHT)
            else:
                # Received and visible again at once: back of the line (after this call,
                # so one receive never returns a message twice).
                message.gen += 1
                again.append(message)
            got.append((message, self._handle(queue, message)))
        queue.visible.extend(again)
        return got

    def _move(self, queue: Queue, message: Message, target: Queue) -> None:
        queue.n_visible -= 1
        queue.messages.pop(message.seq, None)
        message.gen += 1
        message.queue = target
        target.messages[message.seq] = message
        target.n_visible += 1
        target.visible.append(message)

    def delete_message(self, req: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_for_url(req.get("QueueUrl"))
        try:
            self._remove(queue, self._message_for_handle(queue, req.get("ReceiptHandle")))
        except EntryError as exc:
            raise SqsError(exc.code, exc.message, query_code=exc.code) from None
        return {}

    def delete_message_batch(self, req: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_for_url(req.get("QueueUrl"))
        entries = _batch_entries(req, "Delete")

        def delete(entry: dict[str, Any]) -> dict[str, Any]:
            self._remove(queue, self._message_for_handle(queue, entry.get("ReceiptHandle")))
            return {}

        return _run_batch(entries, delete)

    def _change(self, queue: Queue, handle: Any, timeout: Any, now: float) -> None:
        message = self._message_for_handle(queue, handle)
        seconds = int(timeout) if timeout is not None else -1
        if not 0 <= seconds <= MAX_VISIBILITY:
            raise EntryError("InvalidParameterValue", f"VisibilityTimeout {timeout} is invalid.")
        if message.state != INFLIGHT:
            raise EntryError("MessageNotInflight", "The message is not in flight.")
        if seconds == 0:
            self._set_visible(queue, message)
        else:
            self._hide(queue, message, now + seconds, INFLIGHT)

    def change_message_visibility(self, req: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_for_url(req.get("QueueUrl"))
        now = time.time()
        self.requeue_due(queue, now)
        try:
            self._change(queue, req.get("ReceiptHandle"), req.get("VisibilityTimeout"), now)
        except EntryError as exc:
            raise SqsError(exc.code, exc.message, query_code=exc.code) from None
        self.lock.notify_all()
        return {}

    def change_message_visibility_batch(self, req: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_for_url(req.get("QueueUrl"))
        entries = _batch_entries(req, "ChangeMessageVisibility")
        now = time.time()
        self.requeue_due(queue, now)

        def change(entry: dict[str, Any]) -> dict[str, Any]:
            self._change(queue, entry.get("ReceiptHandle"), entry.get("VisibilityTimeout"), now)
            return {}

        result = _run_batch(entries, change)
        self.lock.notify_all()
        return result

    def purge_queue(self, req: dict[str, Any]) -> dict[str, Any]:
        queue = self.queue_for_url(req.get("QueueUrl"))
        for message in queue.messages.values():
            message.state = DELETED
            message.gen += 1
        queue.messages.clear()
        queue.visible.clear()
        queue.pending.clear()
        queue.n_visible = queue.n_inflight = queue.n_delayed = 0
        return {}


def _call_name(operation: str, request: dict[str, Any]) -> str:
    if operation == "ChangeMessageVisibilityBatch":
        entries = request.get("Entries") or [{}]
        hides = str(entries[0].get("VisibilityTimeout", "0")) != "0"
        return f"{operation}:{'hide' if hides else 'release'}"
    return operation


def _batch_entries(req: dict[str, Any], action: str) -> list[dict[str, Any]]:
    entries = req.get("Entries") or []
    if not entries:
        raise SqsError(
            "EmptyBatchRequest",
            f"There should be at least one {action}MessageBatchRequestEntry in the request.",
            query_code="AWS.SimpleQueueService.EmptyBatchRequest",
        )
    if len(entries) > MAX_BATCH:
        raise SqsError(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are {MAX_BATCH}. You have sent {len(entries)}.",
            query_code="AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        )
    ids = [e.get("Id") for e in entries]
    for entry_id in ids:
        if not isinstance(entry_id, str) or not _ENTRY_ID.match(entry_id):
            raise SqsError(
                "InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and "
                "underscores. It can be at most 80 letters long.",
                query_code="AWS.SimpleQueueService.InvalidBatchEntryId",
            )
    if len(set(ids)) != len(ids):
        raise SqsError(
            "BatchEntryIdsNotDistinct",
            "Two or more batch entries in the request have the same Id.",
            query_code="AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
        )
    return entries


def _run_batch(
    entries: list[dict[str, Any]], apply: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    ok: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for entry in entries:
        try:
            ok.append({"Id": entry["Id"], **apply(entry)})
        except EntryError as exc:
            failed.append(
                {"Id": entry["Id"], "SenderFault": True, "Code": exc.code, "Message": exc.message}
            )
        except SqsError as exc:
            failed.append(
                {"Id": entry["Id"], "SenderFault": True, "Code": exc.code, "Message": exc.message}
            )
    return {"Successful": ok, "Failed": failed}


def _received(
    message: Message, handle: str, system_names: set[str], attribute_names: list[str]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "MessageId": message.message_id,
        "ReceiptHandle": handle,
        "MD5OfBody": message.md5_body,
        "Body": message.body,
    }
    if system_names:
        every = {
            "SenderId": SENDER_ID,
            "SentTimestamp": str(message.sent_ms),
            "ApproximateReceiveCount": str(message.receive_count),
            "ApproximateFirstReceiveTimestamp": str(message.first_receive_ms),
        }
        if "All" in system_names:
            out["Attributes"] = every
        else:
            chosen = {k: v for k, v in every.items() if k in system_names}
            if chosen:
                out["Attributes"] = chosen
    if attribute_names and message.attributes:
        if "All" in attribute_names or ".*" in attribute_names:
            chosen_attrs = message.attributes
            md5 = message.md5_attributes
        else:
            chosen_attrs = {
                k: v
                for k, v in message.attributes.items()
                if k in attribute_names
                or any(n.endswith(".*") and k.startswith(n[:-1]) for n in attribute_names)
            }
            md5 = md5_of_attributes(chosen_attrs) if chosen_attrs else None
        if chosen_attrs:
            out["MessageAttributes"] = chosen_attrs
            out["MD5OfMessageAttributes"] = md5
    return out


# -- HTTP ---------------------------------------------------------------------------------------

_OPERATIONS: dict[str, Callable[[Store, dict[str, Any]], dict[str, Any]]] = {
    "CreateQueue": Store.create_queue,
    "DeleteQueue": Store.delete_queue,
    "GetQueueUrl": Store.get_queue_url,
    "ListQueues": Store.list_queues,
    "ListDeadLetterSourceQueues": Store.list_dead_letter_source_queues,
    "GetQueueAttributes": Store.get_queue_attributes,
    "SetQueueAttributes": Store.set_queue_attributes,
    "SendMessage": Store.send_message,
    "SendMessageBatch": Store.send_message_batch,
    "ReceiveMessage": Store.receive_message,
    "DeleteMessage": Store.delete_message,
    "DeleteMessageBatch": Store.delete_message_batch,
    "ChangeMessageVisibility": Store.change_message_visibility,
    "ChangeMessageVisibilityBatch": Store.change_message_visibility_batch,
    "PurgeQueue": Store.purge_queue,
}
_CONTENT_TYPE = "application/x-amz-json-1.0"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as botocore's connection pool expects
    server: FastSqsServer

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    def setup(self) -> None:
        super().setup()
        # One write per response (below) and no Nagle: no 40 ms delayed-ACK stalls.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _reply(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
        lines = [f"HTTP/1.1 {status} {self.responses.get(status, ('',))[0]}"]
        headers = {
            "Content-Type": _CONTENT_TYPE,
            "Content-Length": str(len(payload)),
            "x-amzn-RequestId": str(uuid.uuid4()),
            **headers,
        }
        lines.extend(f"{k}: {v}" for k, v in headers.items())
        self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload)
        self.log_request(status, len(payload))

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/stats":
            store = self.server.store
            with store.lock:
                stats = json.dumps(dict(store.calls)).encode("utf-8")
            self._reply(200, stats, {"Content-Type": "application/json"})
            return
        self._reply(200, b'{"fast_sqs": "ok"}', {"Content-Type": "application/json"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        target = self.headers.get("X-Amz-Target", "")
        operation = target.removeprefix("AmazonSQS.")
        handler = _OPERATIONS.get(operation) if target.startswith("AmazonSQS.") else None
        store = self.server.store
        try:
            if handler is None:
                raise SqsError(
                    "UnsupportedOperation",
                    f"fast_sqs does not implement {target or 'this request'} (JSON protocol "
                    "with X-Amz-Target: AmazonSQS.<Operation> only)",
                    query_code="AWS.SimpleQueueService.UnsupportedOperation",
                )
            try:
                request = json.loads(raw) if raw else {}
            except ValueError:
                raise SqsError("SerializationException", "Request body is not JSON.") from None
            if not isinstance(request, dict):
                raise SqsError("SerializationException", "Request body is not a JSON object.")
            with store.lock:
                store.calls[_call_name(operation, request)] += 1
                result = handler(store, request)
            if self.server.latency:
                # Outside the store's lock: concurrent requests wait side by side, as they do
                # on a network.
                time.sleep(self.server.latency)
            self._reply(200, json.dumps(result, separators=(",", ":")).encode("utf-8"), {})
        except SqsError as exc:
            headers = {"x-amzn-query-error": f"{exc.query_code or exc.code};Sender"}
            body = {"__type": f"com.amazonaws.sqs#{exc.code}", "message": exc.message}
            self._reply(exc.status, json.dumps(body).encode("utf-8"), headers)
        except (ValueError, TypeError, KeyError) as exc:
            body = {"__type": "com.amazonaws.sqs#InvalidParameterValue", "message": str(exc)}
            self._reply(
                400,
                json.dumps(body).encode("utf-8"),
                {"x-amzn-query-error": "InvalidParameterValue;Sender"},
            )


class FastSqsServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        host: str,
        port: int,
        *,
        verbose: bool = False,
        inflight_limit: int = INFLIGHT_LIMIT,
        latency: float = 0.0,
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.address_family = family
        super().__init__((host, port), Handler)
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        self.endpoint_url = f"http://{shown}:{self.server_address[1]}"
        self.store = Store(self.endpoint_url, inflight_limit=inflight_limit)
        self.verbose = verbose
        self.latency = latency
        """Seconds added to every answer: the network's round trip, which loopback lacks."""


def start(
    port: int = 0,
    host: str = "127.0.0.1",
    *,
    verbose: bool = False,
    inflight_limit: int = INFLIGHT_LIMIT,
    latency: float = 0.0,
) -> FastSqsServer:
    """Serve on a daemon thread (for use inside a test or script); ``shutdown()`` stops it."""
    address = ipaddress.ip_address(host.strip("[]") if host != "localhost" else "127.0.0.1")
    if not address.is_loopback:
        raise ValueError(f"fast_sqs only listens on loopback, not {host!r}")
    server = FastSqsServer(
        str(address), port, verbose=verbose, inflight_limit=inflight_limit, latency=latency
    )
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
    )
    thread.start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python bench/fast_sqs.py",
        description="A minimal in-memory SQS (JSON protocol) on loopback, for client benchmarks.",
    )
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    parser.add_argument(
        "--inflight-limit",
        type=int,
        default=INFLIGHT_LIMIT,
        help=f"in-flight messages per queue before ReceiveMessage fails with OverLimit "
        f"(SQS: about {INFLIGHT_LIMIT:,}; 0: no limit)",
    )
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="milliseconds to wait before every answer, to model a network round trip "
        "(default 0: loopback, where only CPU counts)",
    )
    args = parser.parse_args(argv)
    try:
        server = start(
            args.port,
            args.host,
            verbose=args.verbose,
            inflight_limit=args.inflight_limit,
            latency=args.latency_ms / 1000,
        )
    except (ValueError, OSError) as exc:
        print(f"fast_sqs: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"fast_sqs: SQS on {server.endpoint_url}", flush=True)
    while not stop.wait(0.5):
        pass
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
