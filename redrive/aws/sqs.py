"""The SQS adapter: batched calls that report per-entry failures, never drop them.

Its errors go through :func:`redrive.aws.errors.aws_errors`; clients come from
:class:`redrive.aws.session.AwsSettings`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import botocore.exceptions

from redrive.aws.answers import ForeignAnswer, check_answers
from redrive.aws.errors import (
    CHECK_ENDPOINT,
    aws_errors,
    error_code,
    is_throttle,
    not_an_aws_error,
)
from redrive.errors import AwsError, SendInDoubt

#: SQS's limit on one SendMessageBatch request's payload (bodies + attributes).
MAX_BATCH_BYTES = 262_144
MAX_BATCH_ENTRIES = 10
MAX_MESSAGE_ATTRIBUTES = 10
# The paginated listings, by API action: botocore names its paginators in snake case.
_OPERATIONS: Final = {
    "ListDeadLetterSourceQueues": "list_dead_letter_source_queues",
    "ListQueues": "list_queues",
}


@dataclass(frozen=True, slots=True)
class Message:
    """One received SQS message, exactly as SQS returned it."""

    message_id: str
    receipt_handle: str
    body: str
    attributes: Mapping[str, str]
    message_attributes: Mapping[str, Mapping[str, Any]]
    hidden_until: float = field(default=0.0, compare=False)
    """``time.monotonic()`` by which SQS shows this copy again, as far as the receive's own
    visibility timeout goes (counted from before the request: never later than SQS's)."""
    redrive_receives: int = field(default=0, compare=False)
    """How many times redrive received this message, this receive included (0: unknown)."""

    @classmethod
    def from_response(cls, raw: Mapping[str, Any], *, hidden_until: float = 0.0) -> Message:
        return cls(
            message_id=raw["MessageId"],
            receipt_handle=raw["ReceiptHandle"],
            body=raw.get("Body", ""),
            attributes=raw.get("Attributes", {}),
            message_attributes=raw.get("MessageAttributes", {}),
            hidden_until=hidden_until,
        )

    @property
    def sent_timestamp(self) -> float | None:
        """When the message was first enqueued (seconds); SQS keeps it through dead-lettering."""
        raw = self.attributes.get("SentTimestamp")
        return int(raw) / 1000 if raw and raw.isdigit() else None

    @property
    def receive_count(self) -> int:
        raw = self.attributes.get("ApproximateReceiveCount", "0")
        return int(raw) if raw.isdigit() else 0


@dataclass(frozen=True, slots=True)
class SendEntry:
    id: str
    body: str
    message_attributes: Mapping[str, Mapping[str, Any]]
    group_id: str | None = None
    deduplication_id: str | None = None

    # Measured once: a batch split and the engine's size checks ask several times per entry.
    _size: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_size", self._measure())

    def size(self) -> int:
        """Bytes this entry counts against the batch limit (body plus attributes)."""
        return self._size

    def _measure(self) -> int:
        total = len(self.body.encode("utf-8"))
        for name, value in self.message_attributes.items():
            total += len(name.encode("utf-8")) + len(str(value.get("DataType", "")).encode())
            if "StringValue" in value:
                total += len(str(value["StringValue"]).encode("utf-8"))
            if "BinaryValue" in value:
                total += len(value["BinaryValue"])
        return total

    def request(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"Id": self.id, "MessageBody": self.body}
        if self.message_attributes:
            entry["MessageAttributes"] = {
                name: clean_attribute(value) for name, value in self.message_attributes.items()
            }
        if self.group_id is not None:
            entry["MessageGroupId"] = self.group_id
        if self.deduplication_id is not None:
            entry["MessageDeduplicationId"] = self.deduplication_id
        return entry


def clean_attribute(value: Mapping[str, Any]) -> dict[str, Any]:
    """Only the fields SendMessage accepts (receive also returns empty list fields)."""
    out: dict[str, Any] = {"DataType": value["DataType"]}
    for key in ("StringValue", "BinaryValue"):
        if key in value:
            out[key] = value[key]
    return out


@dataclass(frozen=True, slots=True)
class BatchResult:
    ok: dict[str, str]
    """Entry id -> the MessageId SQS gave (for sends) or ``""`` (deletes, visibility)."""
    failed: dict[str, str]
    """Entry id -> ``Code: Message`` for every entry not confirmed (including unconfirmed)."""
    unconfirmed: frozenset[str] = frozenset()
    """Entries SQS named in neither list: for a send, possibly sent (in doubt, never resent
    blindly); for a delete or a visibility change, simply not done."""


def split_batches(entries: Sequence[SendEntry]) -> Iterator[list[SendEntry]]:
    """Groups of at most 10 entries whose payload stays within SQS's batch size limit."""
    batch: list[SendEntry] = []
    size = 0
    for entry in entries:
        entry_size = entry.size()
        if batch and (len(batch) == MAX_BATCH_ENTRIES or size + entry_size > MAX_BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(entry)
        size += entry_size
    if batch:
        yield batch


class Sqs:
    """Batched SQS calls on one client. Failures per entry are returned, never dropped."""

    def __init__(
        self,
        client: Any,
        *,
        send_client: Any | None = None,
        send_attempts: int = 8,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
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
        self, url: str, *, visibility_timeout: int, wait_seconds: int = 1, max_messages: int = 10
    ) -> list[Message]:
        hidden_until = self.clock() + visibility_timeout
        with aws_errors("ReceiveMessage", resource=url):
            response = self.client.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=max_messages,
                VisibilityTimeout=visibility_timeout,
                WaitTimeSeconds=wait_seconds,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
        return [
            Message.from_response(raw, hidden_until=hidden_until)
            for raw in response.get("Messages", [])
        ]

    def send_batch(self, url: str, entries: Sequence[SendEntry]) -> BatchResult:
        """Send one batch; per-entry failures come back in the result.

        Retried here only when SQS provably did nothing (it refused the request as
        throttled, or the connection was never made). A timeout or dropped connection after
        the request left, or a server error, raises :class:`SendInDoubt`.
        """
        if not entries:
            return BatchResult({}, {})
        request = [entry.request() for entry in entries]
        for attempt in range(1, self.send_attempts + 1):
            try:
                with aws_errors("SendMessageBatch", resource=url):
                    try:
                        response = self.send_client.send_message_batch(
                            QueueUrl=url, Entries=request
                        )
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
                retryable = (
                    isinstance(cause, botocore.exceptions.ClientError) and is_throttle(cause)
                ) or isinstance(
                    cause,
                    botocore.exceptions.EndpointConnectionError
                    | botocore.exceptions.ConnectTimeoutError,
                )
                if isinstance(exc, SendInDoubt) or not retryable or attempt == self.send_attempts:
                    raise
                if isinstance(cause, botocore.exceptions.ClientError):
                    self.throttled += 1
                time.sleep(min(20.0, 0.2 * 2**attempt) * (0.5 + random.random() / 2))
        raise AssertionError("unreachable")

    def delete_batch(self, url: str, handles: Mapping[str, str]) -> BatchResult:
        if not handles:
            return BatchResult({}, {})
        with aws_errors("DeleteMessageBatch", resource=url):
            response = self.client.delete_message_batch(
                QueueUrl=url,
                Entries=[{"Id": i, "ReceiptHandle": h} for i, h in handles.items()],
            )
        return _batch_result(response, list(handles))

    def change_visibility_batch(
        self, url: str, handles: Mapping[str, str], timeout: int
    ) -> BatchResult:
        if not handles:
            return BatchResult({}, {})
        with aws_errors("ChangeMessageVisibilityBatch", resource=url):
            response = self.client.change_message_visibility_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": i, "ReceiptHandle": h, "VisibilityTimeout": timeout}
                    for i, h in handles.items()
                ],
            )
        return _batch_result(response, list(handles))

    def purge(self, url: str) -> None:
        with aws_errors("PurgeQueue", resource=url):
            self.client.purge_queue(QueueUrl=url)


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


def queue_name(url_or_arn: str) -> str:
    return url_or_arn.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
