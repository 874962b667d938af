"""An archived message: :class:`ArchiveRecord` and its JSON line (format version 1).

The format is described in :mod:`redrive.archive`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from redrive.broker import restored_delivery
from redrive.broker.base import Broker, Delivery, Header, HeaderKind
from redrive.errors import ArchiveError

ARCHIVE_VERSION: Final = 1

_T = TypeVar("_T")

_TIMESTAMP_FORMAT: Final = "%Y-%m-%dT%H:%M:%S.%fZ"
_BINARY_KEYS: Final = {"BinaryValue": "BinaryValue_b64", "BinaryListValues": "BinaryListValues_b64"}


class NewerFormat(ArchiveError):
    """A record from a future redrive: never skipped, since skipping would lose messages."""


@dataclass(frozen=True, slots=True)
class ArchiveRecord:
    """One archived message. ``archived_at`` must be timezone-aware.

    ``message_attributes`` is the archive's form of the message's headers (format 1 keeps
    SQS's MessageAttributes shape, whichever broker the message came from: archives written
    before the seam's neutral headers read as they always did); :attr:`headers` is the
    seam's."""

    message_id: str
    body: str
    message_attributes: dict[str, dict[str, Any]]
    attributes: dict[str, str]
    task: str
    task_id: str | None
    dlq: str
    archived_at: datetime
    run_id: str
    redrive_receives: int | None = None
    """How many of the receives in the broker's receive count were redrive's own (the archiving
    one included), as far as its receive log knew; None when not known."""

    def __post_init__(self) -> None:
        if self.archived_at.utcoffset() is None:
            raise ValueError("ArchiveRecord.archived_at must be timezone-aware")

    @property
    def headers(self) -> dict[str, Header]:
        """The archived message's headers, as the seam carries them."""
        return {name: _header_of(value) for name, value in self.message_attributes.items()}

    @classmethod
    def from_message(
        cls,
        message: Delivery,
        *,
        kept: Collection[str],
        task: str,
        task_id: str | None,
        dlq: str,
        run_id: str,
        archived_at: datetime,
        redrive_receives: int | None = None,
    ) -> ArchiveRecord:
        """Build a record from one received message, keeping the broker's ``kept`` facts."""
        attributes = message.attributes
        return cls(
            message_id=message.message_id,
            body=message.body,
            message_attributes={
                name: _attribute_of(header) for name, header in message.headers.items()
            },
            attributes={k: attributes[k] for k in kept if k in attributes},
            task=task,
            task_id=task_id,
            dlq=dlq,
            archived_at=archived_at,
            run_id=run_id,
            redrive_receives=redrive_receives,
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready dict of one archive line (binary attribute values as base64)."""
        # Metadata first and the (possibly 256 KiB) body last, so `head`/`less` stay readable.
        return {
            "v": ARCHIVE_VERSION,
            "message_id": self.message_id,
            "task": self.task,
            "task_id": self.task_id,
            "dlq": self.dlq,
            "run_id": self.run_id,
            "archived_at": self.archived_at.astimezone(UTC).strftime(_TIMESTAMP_FORMAT),
            **(
                {} if self.redrive_receives is None else {"redrive_receives": self.redrive_receives}
            ),
            "attributes": dict(self.attributes),
            "message_attributes": {
                name: _encode_attribute_value(value)
                for name, value in self.message_attributes.items()
            },
            "body": self.body,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ArchiveRecord:
        """Parse one archive line's dict; raises :class:`ArchiveError` if it is not a record."""
        if not isinstance(data, Mapping):
            raise ArchiveError("record is not a JSON object")
        version = data.get("v")
        if version != ARCHIVE_VERSION or isinstance(version, bool):
            if isinstance(version, int) and not isinstance(version, bool) and version > 1:
                raise NewerFormat(
                    f"record format v{version} is newer than this redrive reads "
                    f"(v{ARCHIVE_VERSION}); upgrade redrive to read this archive"
                )
            raise ArchiveError(f"record has no valid format version (v={version!r})")
        task_id = data.get("task_id")
        if task_id is not None and not isinstance(task_id, str):
            raise ArchiveError("record field 'task_id' is neither a string nor null")
        attributes = _require(data, "attributes", dict)
        if not all(isinstance(v, str) for v in attributes.values()):
            raise ArchiveError("record field 'attributes' holds a non-string value")
        redrive_receives = data.get("redrive_receives")
        if redrive_receives is not None and (
            not isinstance(redrive_receives, int) or isinstance(redrive_receives, bool)
        ):
            raise ArchiveError("record field 'redrive_receives' is neither a number nor absent")
        return cls(
            message_id=_require(data, "message_id", str),
            body=_require(data, "body", str),
            message_attributes=_decode_message_attributes(
                _require(data, "message_attributes", dict)
            ),
            attributes=dict(attributes),
            task=_require(data, "task", str),
            task_id=task_id,
            dlq=_require(data, "dlq", str),
            archived_at=_parse_timestamp(_require(data, "archived_at", str)),
            run_id=_require(data, "run_id", str),
            redrive_receives=redrive_receives,
        )


def _require(data: Mapping[str, Any], name: str, kind: type[_T]) -> _T:
    value = data.get(name)
    if not isinstance(value, kind):
        raise ArchiveError(f"record field {name!r} is missing or not a {kind.__name__}")
    return value


def _parse_timestamp(text: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ArchiveError(f"record field 'archived_at' is not a timestamp: {text!r}") from None
    if parsed.utcoffset() is None:
        raise ArchiveError(f"record field 'archived_at' has no time zone: {text!r}")
    return parsed


#: The format's names of a header's kinds (SQS's MessageAttributes: format 1's shape).
_DATA_TYPES: Final[dict[HeaderKind, str]] = {
    "text": "String",
    "number": "Number",
    "bytes": "Binary",
}
_KINDS: Final = {name: kind for kind, name in _DATA_TYPES.items()}


def _attribute_of(header: Header) -> dict[str, Any]:
    """A header in the format's shape: as the broker gave it where its own form is this
    one (SQS's, kept exactly as the AWS client returned it), else made from the header."""
    data_type = _DATA_TYPES[header.kind] + (f".{header.label}" if header.label else "")
    original = header.original
    if isinstance(original, Mapping) and original.get("DataType") == data_type:
        # Copied so later changes to the received message cannot alter what is archived.
        return dict(original)
    value = "BinaryValue" if header.kind == "bytes" else "StringValue"
    return {"DataType": data_type, value: header.value}


def _header_of(value: Mapping[str, Any]) -> Header:
    """A header from the format's shape (list values, which no broker sends, are dropped)."""
    base, _, label = str(value.get("DataType", "")).partition(".")
    kind = _KINDS.get(base) or ("bytes" if "BinaryValue" in value else "text")
    if kind == "bytes":
        return Header.data(bytes(value.get("BinaryValue", b"")), label)
    return Header(kind, str(value.get("StringValue", "")), label)


def _encode_attribute_value(value: Mapping[str, Any]) -> dict[str, Any]:
    encoded: dict[str, Any] = {}
    for key, item in value.items():
        if key == "BinaryValue" and isinstance(item, bytes | bytearray | memoryview):
            encoded[_BINARY_KEYS[key]] = base64.b64encode(item).decode("ascii")
        elif key == "BinaryListValues" and isinstance(item, list | tuple):
            if all(isinstance(x, bytes | bytearray | memoryview) for x in item):
                encoded[_BINARY_KEYS[key]] = [base64.b64encode(x).decode("ascii") for x in item]
            else:
                encoded[key] = list(item)
        else:
            encoded[key] = item
    return encoded


def _decode_message_attributes(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    decoded: dict[str, dict[str, Any]] = {}
    for name, value in raw.items():
        if not isinstance(value, dict) or not isinstance(value.get("DataType"), str):
            raise ArchiveError(f"message attribute {name!r} is not an object with a DataType")
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key == "BinaryValue_b64":
                out["BinaryValue"] = _b64decode(item, name)
            elif key == "BinaryListValues_b64":
                if not isinstance(item, list):
                    raise ArchiveError(f"message attribute {name!r}: {key} is not a list")
                out["BinaryListValues"] = [_b64decode(x, name) for x in item]
            else:
                out[key] = item
        decoded[name] = out
    return decoded


def _b64decode(item: Any, name: str) -> bytes:
    if not isinstance(item, str):
        raise ArchiveError(f"message attribute {name!r}: binary value is not a base64 string")
    try:
        return base64.b64decode(item, validate=True)
    except (binascii.Error, ValueError):
        raise ArchiveError(
            f"message attribute {name!r}: binary value is not valid base64"
        ) from None


def encode_lines(records: Sequence[ArchiveRecord]) -> list[bytes]:
    lines = []
    for record in records:
        try:
            text = json.dumps(
                record.to_json(), ensure_ascii=True, allow_nan=False, separators=(",", ":")
            )
        except (TypeError, ValueError) as exc:
            raise ArchiveError(
                f"message {record.message_id} cannot be archived ({exc}); "
                "this batch is not archived, so none of its messages may be deleted"
            ) from None
        lines.append(text.encode("ascii") + b"\n")
    return lines


def chunked(records: Sequence[ArchiveRecord], size: int) -> Iterator[Sequence[ArchiveRecord]]:
    for start in range(0, len(records), size):
        yield records[start : start + size]


def as_message(record: ArchiveRecord, broker: Broker | None = None) -> Delivery:
    """The archived message as a delivery (``broker``: the one it goes back to)."""
    restore = broker.restored if broker is not None else restored_delivery
    return restore(record.message_id, record.body, record.attributes, record.headers)
