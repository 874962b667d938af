"""The SQS calls behind the broker seam: batched calls that report per-entry failures.

Its errors go through :func:`redrive.aws.errors.aws_errors`; clients come from
:class:`redrive.aws.session.AwsSettings`. A receipt handle is a delivery's opaque ``tag``
above this module; queue discovery (RedrivePolicy, source queues) is :mod:`.queues`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final, Protocol

import botocore.exceptions

from redrive.aws.answers import ForeignAnswer, check_answers
from redrive.aws.errors import (
    CHECK_ENDPOINT,
    aws_errors,
    error_code,
    is_throttle,
    not_an_aws_error,
)
from redrive.broker.base import (
    BatchResult,
    Capabilities,
    Delivery,
    Headers,
    SendEntry,
    queue_name,
)
from redrive.broker.base import split_batches as split_entries
from redrive.broker.sqs.headers import attribute_of, attributes_of, header_of, headers_of
from redrive.errors import AwsError, SendInDoubt, SendNotConnected


class LeanCalls(Protocol):
    """The lean path's per-message calls (:class:`redrive.broker.sqs.lean.LeanTransport`,
    named by its shape here: lean.py builds SqsBrokers, so this module cannot import it)."""

    def call(self, operation: str, params: Mapping[str, Any]) -> dict[str, Any]: ...


#: What botocore (and the lean path) raise when a connection was never made: the TCP
#: connect was refused, unreachable or timed out, before any byte of the request was written
#: (a TLS handshake's timeout is a ReadTimeoutError: in doubt). Sends go through clients that
#: never retry by themselves, so no earlier attempt of the same call can have left either.
NEVER_CONNECTED: Final = (
    botocore.exceptions.EndpointConnectionError,
    botocore.exceptions.ConnectTimeoutError,
)
#: SQS's limit on one SendMessageBatch request's payload (bodies + attributes).
MAX_BATCH_BYTES = 262_144
MAX_BATCH_ENTRIES = 10
MAX_MESSAGE_ATTRIBUTES = 10
#: A message's size limits: 256 KiB, and 1 MiB for queues that allow it.
MESSAGE_SIZE_LIMITS = (262_144, 1_048_576)
#: SQS's longest visibility timeout, counted from a message's first receive.
MAX_VISIBILITY_SECONDS = 43_200
# Counts SQS keeps per queue; GetQueueAttributes with these names is instant at any depth.
COUNT_ATTRIBUTES = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
)
# What replay or a human investigating a failure can use; the rest (SenderId, ...) is noise
# or identifies callers, so it stays out of long-lived archives.
ARCHIVED_ATTRIBUTES: Final = (
    "SentTimestamp",
    "ApproximateReceiveCount",
    "ApproximateFirstReceiveTimestamp",
    "MessageGroupId",
    "MessageDeduplicationId",
    "DeadLetterQueueSourceArn",
    "SequenceNumber",
)
CAPABILITIES: Final = Capabilities(
    spoken_name="SQS",
    # Keys of non-Celery messages began "sqs:" before the seam: ledgers hold them.
    key_namespace="sqs",
    durable_holds=True,
    receive_count=True,
    fifo_groups=True,
    batch_size=MAX_BATCH_ENTRIES,
    batch_bytes=MAX_BATCH_BYTES,
    message_size_limits=MESSAGE_SIZE_LIMITS,
    max_hold_seconds=MAX_VISIBILITY_SECONDS,
    native_move=True,
    native_mover="redrive.broker.sqs.native:SqsMoveTasks",
    dead_letter_setting="RedrivePolicy",
    receive_limit_setting="maxReceiveCount",
    receive_limit_way_out=(
        "raise or remove it: aws sqs set-queue-attributes on {name} (its RedrivePolicy's "
        "maxReceiveCount, or no RedrivePolicy)"
    ),
    max_message_attributes=MAX_MESSAGE_ATTRIBUTES,
    archived_attributes=ARCHIVED_ATTRIBUTES,
)
#: The lean path's (issue 25): its one transport is thread-safe, so workers share a broker.
#: Each botocore broker holds two clients (about 1.1 MB of RSS apiece), so 16 workers on one
#: broker spare about 17 MB; botocore's path keeps a broker per worker, as its clients'
#: connection pools are sized for one.
LEAN_CAPABILITIES: Final = replace(CAPABILITIES, shared_by_threads=True)
# The paginated listings, by API action: botocore names its paginators in snake case.
_OPERATIONS: Final = {
    "ListDeadLetterSourceQueues": "list_dead_letter_source_queues",
    "ListQueues": "list_queues",
}


def delivery_of(raw: Mapping[str, Any], *, hidden_until: float = 0.0) -> Delivery:
    """One received SQS message, exactly as SQS returned it (the receipt handle its tag)."""
    attributes: Mapping[str, str] = raw.get("Attributes", {})
    count = attributes.get("ApproximateReceiveCount", "0")
    sent = attributes.get("SentTimestamp")
    return Delivery(
        message_id=raw["MessageId"],
        tag=raw["ReceiptHandle"],
        body=raw.get("Body", ""),
        attributes=attributes,
        headers=headers_of(raw.get("MessageAttributes", {})),
        receive_count=int(count) if count.isdigit() else 0,
        enqueued_at=int(sent) / 1000 if sent and sent.isdigit() else None,
        died_in=attributes.get("DeadLetterQueueSourceArn") or None,
        group_id=attributes.get("MessageGroupId"),
        hidden_until=hidden_until,
    )


def message(
    message_id: str,
    receipt_handle: str,
    body: str,
    attributes: Mapping[str, str] | None = None,
    message_attributes: Mapping[str, Mapping[str, Any]] | None = None,
    hidden_until: float = 0.0,
    redrive_receives: int = 0,
) -> Delivery:
    """A delivery as SQS would give it, from SQS's own fields (tests)."""
    raw: dict[str, Any] = {
        "MessageId": message_id,
        "ReceiptHandle": receipt_handle,
        "Body": body,
        "Attributes": attributes or {},
        "MessageAttributes": message_attributes or {},
    }
    delivery = delivery_of(raw, hidden_until=hidden_until)
    return replace(delivery, redrive_receives=redrive_receives) if redrive_receives else delivery


def restored_delivery(
    message_id: str, body: str, attributes: Mapping[str, str], headers: Headers
) -> Delivery:
    """A delivery rebuilt from what an archive kept (no receipt handle: nothing to delete)."""
    raw = {"MessageId": message_id, "ReceiptHandle": "", "Body": body, "Attributes": attributes}
    return replace(delivery_of(raw), headers=dict(headers))


def request_entry(entry: SendEntry) -> dict[str, Any]:
    """One SendMessageBatch entry."""
    out: dict[str, Any] = {"Id": entry.id, "MessageBody": entry.body}
    if entry.headers:
        out["MessageAttributes"] = attributes_of(entry.headers)
    if entry.group_id is not None:
        out["MessageGroupId"] = entry.group_id
    if entry.deduplication_id is not None:
        out["MessageDeduplicationId"] = entry.deduplication_id
    return out


def clean_attribute(value: Mapping[str, Any]) -> dict[str, Any]:
    """Only the fields SendMessage accepts (receive also returns empty list fields)."""
    return attribute_of(header_of(value))


def split_batches(entries: Sequence[SendEntry]) -> Iterator[list[SendEntry]]:
    """Groups of at most 10 entries whose payload stays within SQS's batch size limit."""
    return split_entries(entries, CAPABILITIES)


class SqsCalls:
    """Batched SQS calls on one client, by SQS's names. Failures per entry are returned,
    never dropped."""

    capabilities = CAPABILITIES

    def __init__(
        self,
        client: Any,
        *,
        send_client: Any | None = None,
        send_attempts: int = 8,
        clock: Callable[[], float] = time.monotonic,
        lean: LeanCalls | None = None,
        lean_send: LeanCalls | None = None,
    ) -> None:
        self.client = client
        # The per-message calls on the lean path (issue 25), when given: receive, delete and
        # visibility on ``lean`` (built from ``client``), sends on ``lean_send``.
        self.lean = lean
        self.lean_send = lean_send
        if lean is not None:
            self.capabilities = LEAN_CAPABILITIES
        self.clock = clock
        """Dates what a receive hides (``Message.hidden_until``); tests pass SQS's own."""
        self.send_client = send_client if send_client is not None else client
        # Every call's 2xx answer must be SQS's (redrive.aws.answers), not a proxy's page.
        check_answers(self.client)
        check_answers(self.send_client)
        self.send_attempts = send_attempts
        self.throttled = 0
        """Sends SQS refused with a throttling error (and that were retried)."""

    def queue_url(self, name_or_url: str, *, owner: str | None = None) -> str:
        if name_or_url.startswith(("https://", "http://")):
            return name_or_url
        kwargs: dict[str, Any] = {"QueueName": name_or_url}
        if owner:
            kwargs["QueueOwnerAWSAccountId"] = owner
        with aws_errors("GetQueueUrl", resource=name_or_url):
            return str(self.client.get_queue_url(**kwargs)["QueueUrl"])

    def attributes(self, url: str, names: Sequence[str] = ("All",)) -> dict[str, str]:
        with aws_errors("GetQueueAttributes", resource=url):
            response = self.client.get_queue_attributes(QueueUrl=url, AttributeNames=list(names))
        return dict(response.get("Attributes", {}))

    def dead_letter_sources(self, url: str) -> list[str]:
        return self._every_url(
            "ListDeadLetterSourceQueues", "queueUrls", resource=url, QueueUrl=url
        )

    def list_queues(self, prefix: str) -> list[str]:
        return self._every_url("ListQueues", "QueueUrls", resource=prefix, QueueNamePrefix=prefix)

    def _every_url(self, action: str, key: str, *, resource: str, **params: str) -> list[str]:
        """The queue URLs of every page of a listing (SQS spells ``key`` per action)."""
        urls: list[str] = []
        with aws_errors(action, resource=resource):
            paginator = self.client.get_paginator(_OPERATIONS[action])
            for page in paginator.paginate(**params):
                urls.extend(page.get(key, []))
        return urls

    def receive(
        self, url: str, *, hold: int, wait_seconds: int = 1, max_messages: int = 10
    ) -> list[Delivery]:
        hidden_until = self.clock() + hold
        params = {
            "QueueUrl": url,
            "MaxNumberOfMessages": max_messages,
            "VisibilityTimeout": hold,
            "WaitTimeSeconds": wait_seconds,
            "MessageSystemAttributeNames": ["All"],
            "MessageAttributeNames": ["All"],
        }
        with aws_errors("ReceiveMessage", resource=url):
            if self.lean is not None:
                response = self.lean.call("ReceiveMessage", params)
            else:
                response = self.client.receive_message(**params)
        return [delivery_of(raw, hidden_until=hidden_until) for raw in response.get("Messages", [])]

    def send_batch(self, url: str, entries: Sequence[SendEntry]) -> BatchResult:
        """Send one batch; per-entry failures come back in the result.

        Retried here only when SQS provably did nothing (it refused the request as
        throttled, or the connection was never made). A timeout or dropped connection after
        the request left, or a server error, raises :class:`SendInDoubt`; a connection never
        made in any attempt raises :class:`SendNotConnected`: the batch was not sent.
        """
        if not entries:
            return BatchResult({}, {})
        request = [request_entry(entry) for entry in entries]
        for attempt in range(1, self.send_attempts + 1):
            try:
                with aws_errors("SendMessageBatch", resource=url):
                    try:
                        response = self._send_call({"QueueUrl": url, "Entries": request})
                    # HTTPClientError covers ReadTimeoutError, ConnectionClosedError and any
                    # other failure after the connection was made: the request may have left.
                    except botocore.exceptions.HTTPClientError as exc:
                        raise SendInDoubt(
                            f"SendMessageBatch to {queue_name(url)} got no answer after the "
                            f"request was sent ({type(exc).__name__}): its {len(entries)} "
                            "messages may or may not be in the queue"
                        ) from exc
                    except ForeignAnswer as exc:
                        raise SendInDoubt(
                            f"SendMessageBatch to {queue_name(url)}: {exc}, so its "
                            f"{len(entries)} messages may or may not be in the queue: "
                            f"{CHECK_ENDPOINT}"
                        ) from exc
                    except botocore.exceptions.ClientError as exc:
                        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
                        if not is_throttle(exc) and int(status) >= 500:
                            raise SendInDoubt(
                                _in_doubt_on_the_server(exc, url, len(entries))
                            ) from exc
                        raise
                return _batch_result(response, [e.id for e in entries], value_key="MessageId")
            except AwsError as exc:
                cause = exc.__cause__
                throttled = cause is not None and is_throttle(cause)
                unconnected = isinstance(cause, NEVER_CONNECTED)
                if isinstance(exc, SendInDoubt) or not (throttled or unconnected):
                    raise
                if attempt == self.send_attempts:
                    if unconnected:
                        raise SendNotConnected(_not_sent(exc, url, len(entries))) from cause
                    raise
                if throttled:
                    self.throttled += 1
                time.sleep(min(20.0, 0.2 * 2**attempt) * (0.5 + random.random() / 2))
        raise AssertionError("unreachable")

    def _send_call(self, params: dict[str, Any]) -> Any:
        if self.lean_send is not None:
            return self.lean_send.call("SendMessageBatch", params)
        return self.send_client.send_message_batch(**params)

    def delete_batch(self, url: str, handles: Mapping[str, str]) -> BatchResult:
        if not handles:
            return BatchResult({}, {})
        params = {
            "QueueUrl": url,
            "Entries": [{"Id": i, "ReceiptHandle": h} for i, h in handles.items()],
        }
        with aws_errors("DeleteMessageBatch", resource=url):
            if self.lean is not None:
                response = self.lean.call("DeleteMessageBatch", params)
            else:
                response = self.client.delete_message_batch(**params)
        return _batch_result(response, list(handles))

    def change_visibility_batch(
        self, url: str, handles: Mapping[str, str], timeout: int
    ) -> BatchResult:
        if not handles:
            return BatchResult({}, {})
        params = {
            "QueueUrl": url,
            "Entries": [
                {"Id": i, "ReceiptHandle": h, "VisibilityTimeout": timeout}
                for i, h in handles.items()
            ],
        }
        with aws_errors("ChangeMessageVisibilityBatch", resource=url):
            if self.lean is not None:
                response = self.lean.call("ChangeMessageVisibilityBatch", params)
            else:
                response = self.client.change_message_visibility_batch(**params)
        return _batch_result(response, list(handles))

    def purge(self, url: str) -> None:
        try:
            with aws_errors("PurgeQueue", resource=url):
                self.client.purge_queue(QueueUrl=url)
        except AwsError as exc:
            if "PurgeQueueInProgress" in str(exc):
                raise AwsError(
                    f"SQS allows one PurgeQueue per 60 seconds on {queue_name(url)} and one "
                    "is already in progress: wait a minute and rerun"
                ) from exc
            raise

    def restored(
        self, message_id: str, body: str, attributes: Mapping[str, str], headers: Headers
    ) -> Delivery:
        return restored_delivery(message_id, body, attributes, headers)


def _not_sent(exc: AwsError, url: str, count: int) -> str:
    """A send whose every attempt failed to connect: no byte of it left."""
    return (
        f"{exc}; SendMessageBatch to {queue_name(url)} made no connection, so its {count} "
        "messages were not sent (none of them is in doubt)"
    )


def _in_doubt_on_the_server(exc: botocore.exceptions.ClientError, url: str, count: int) -> str:
    """A send a server error answered (SQS's, or a proxy's page in its place)."""
    doubt = f"its {count} messages may or may not be in the queue"
    foreign = not_an_aws_error(exc)
    if foreign is not None:
        return f"SendMessageBatch to {queue_name(url)} failed: {foreign}: {doubt}: {CHECK_ENDPOINT}"
    return (
        f"SendMessageBatch to {queue_name(url)} failed on the server ({error_code(exc)}): {doubt}"
    )


def _batch_result(
    response: Mapping[str, Any], ids: Sequence[str], *, value_key: str | None = None
) -> BatchResult:
    ok = {
        item["Id"]: str(item.get(value_key, "")) if value_key else ""
        for item in response.get("Successful", [])
    }
    failed = {
        item["Id"]: f"{item.get('Code', 'Error')}: {item.get('Message', '')}".strip(": ")
        for item in response.get("Failed", [])
    }
    # An entry SQS mentions in neither list is not confirmed: never count it as done.
    missing = frozenset(i for i in ids if i not in ok and i not in failed)
    for entry_id in missing:
        failed[entry_id] = "not in the response"
    return BatchResult(ok, failed, missing)
