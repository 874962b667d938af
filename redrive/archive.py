"""Archives of drained messages: JSON Lines on local disk or in S3, read back for replay.

Format (version 1)
------------------
One JSON object per line, UTF-8 (in practice pure ASCII, see below), ``\\n``-terminated::

    {"v": 1, "message_id": ..., "task": ..., "task_id": ... | null, "dlq": <queue URL>,
     "run_id": ..., "archived_at": "2026-11-30T12:00:00.000000Z",
     "attributes": {<only the SQS system attributes in ARCHIVED_ATTRIBUTES that were present>},
     "message_attributes": {<MessageAttributes exactly as boto3 returned them>},
     "body": <the exact SQS Body string>}

* Lines are written with ``ensure_ascii=True``: every non-ASCII character is a ``\\uXXXX``
  escape, so the file has no encoding ambiguity and any Python string (even one SQS would
  never send) survives byte-for-byte.
* Binary message attributes: boto3 hands back ``bytes`` under ``BinaryValue`` (and
  ``BinaryListValues``), which JSON cannot hold.  They are stored under the key with a
  ``_b64`` suffix as standard base64 (RFC 4648, with padding)::

      {"DataType": "Binary.gzip", "BinaryValue_b64": "AP8="}      <- b"\\x00\\xff"
      {"DataType": "Binary", "BinaryListValues_b64": ["AA==", ""]}

  Every other key (``DataType`` with its custom suffix, ``StringValue``,
  ``StringListValues``) is stored unchanged, so the decoded dict equals what boto3 returned.
* Readers ignore fields they do not know (later v1 writers may add some) and refuse
  records with a newer ``v``.

Files and objects
-----------------
* A name ending in ``.gz`` is gzip: each ``write_batch`` appends its own gzip member (at
  most ``chunk_records`` records each).  Concatenated members are one valid gzip stream, so
  ``gzip -dc`` / ``zcat`` read the whole file, and a writer killed mid-batch leaves every
  earlier member intact.
* S3 destinations are prefixes: each ``write_batch`` puts one object per ``chunk_records``
  records under ``{prefix}/{run_name}/part-{n:06d}.jsonl.gz`` and returns only after every
  put succeeded.  Nothing is buffered across calls (a batch must be durable when the call
  returns), so callers writing to S3 should pass batches of hundreds of messages rather than
  SQS's 10, or the run leaves one small object per receive.

Durability contract: when ``write_batch`` returns, its records survive a crash (local: data
written and ``fsync``-ed; S3: ``PutObject`` succeeded).  The archive may therefore hold
records whose messages were never deleted (the run stopped between archiving and deleting),
never the reverse.
"""

from __future__ import annotations

import base64
import binascii
import errno
import itertools
import json
import os
import re
import secrets
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Protocol, Self, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from redrive.errors import ArchiveError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = [
    "ARCHIVED_ATTRIBUTES",
    "ARCHIVE_VERSION",
    "ArchiveRecord",
    "ArchiveWriter",
    "LocalArchiveWriter",
    "S3ArchiveWriter",
    "default_archive_path",
    "open_writer",
    "read_records",
]

ARCHIVE_VERSION: Final = 1

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

_T = TypeVar("_T")

_GZIP_MAGIC: Final = b"\x1f\x8b"
_READ_CHUNK: Final = 1 << 16
_WRITE_CHUNK: Final = 1 << 20
# zlib's default level: level 9 costs several times the CPU for a few percent on JSON.
_GZIP_LEVEL: Final = 6
# wbits=31 makes zlib produce/consume a complete gzip member (header, deflate, CRC32 trailer).
_GZIP_WBITS: Final = 31
_TIMESTAMP_FORMAT: Final = "%Y-%m-%dT%H:%M:%S.%fZ"
_BINARY_KEYS: Final = {"BinaryValue": "BinaryValue_b64", "BinaryListValues": "BinaryListValues_b64"}


class _NewerFormat(ArchiveError):
    """A record from a future redrive: never skipped, since skipping would lose messages."""


# --------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ArchiveRecord:
    """One archived SQS message. ``archived_at`` must be timezone-aware."""

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
    """How many of the receives in ApproximateReceiveCount were redrive's own (the archiving
    one included), as far as its receive log knew; None when not known."""

    def __post_init__(self) -> None:
        if self.archived_at.utcoffset() is None:
            raise ValueError("ArchiveRecord.archived_at must be timezone-aware")

    @classmethod
    def from_message(
        cls,
        message: Mapping[str, Any],
        *,
        task: str,
        task_id: str | None,
        dlq: str,
        run_id: str,
        archived_at: datetime,
        redrive_receives: int | None = None,
    ) -> ArchiveRecord:
        """Build a record from one entry of boto3's ``receive_message()["Messages"]``."""
        attributes = message.get("Attributes") or {}
        message_attributes = message.get("MessageAttributes") or {}
        return cls(
            message_id=message["MessageId"],
            body=message["Body"],
            # Copied so later changes to the boto3 response cannot alter what gets archived.
            message_attributes={name: dict(value) for name, value in message_attributes.items()},
            attributes={k: attributes[k] for k in ARCHIVED_ATTRIBUTES if k in attributes},
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
                raise _NewerFormat(
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


def _encode_lines(records: Sequence[ArchiveRecord]) -> list[bytes]:
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


def _chunked(records: Sequence[ArchiveRecord], size: int) -> Iterator[Sequence[ArchiveRecord]]:
    for start in range(0, len(records), size):
        yield records[start : start + size]


# --------------------------------------------------------------------------------------
# Writers
# --------------------------------------------------------------------------------------


class ArchiveWriter(Protocol):
    """Where purge puts messages before deleting them.

    ``write_batch`` returns only once its records are durable; after it raises, the writer
    refuses further batches (the archive then holds exactly the batches that returned).
    """

    location: str
    """The path or ``s3://`` URI to show the user and to hand to :func:`read_records`."""

    def write_batch(self, records: Sequence[ArchiveRecord]) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> ArchiveWriter: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class _WriterBase:
    location: str

    def __init__(self, location: str, chunk_records: int) -> None:
        if chunk_records < 1:
            raise ValueError("chunk_records must be at least 1")
        self.location = location
        self._chunk_records = chunk_records
        self._closed = False
        self._broken = False

    def _check_usable(self) -> None:
        if self._closed:
            raise ValueError(f"archive writer for {self.location} is closed")
        if self._broken:
            raise ArchiveError(
                f"archive {self.location} stopped accepting records after a failed write; "
                "start a new archive"
            )

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class LocalArchiveWriter(_WriterBase):
    """Appends batches to a new file created 0600; gzip members when the name ends in .gz."""

    def __init__(self, path: str, *, chunk_records: int = 1000) -> None:
        super().__init__(path, chunk_records)
        self._gzip = path.endswith(".gz")
        if os.path.isdir(path):
            raise ArchiveError(
                f"archive path {path} is a directory; give a file name such as "
                f"{os.path.join(path, 'archive.jsonl.gz')}"
            )
        parent = os.path.dirname(os.path.abspath(path))
        try:
            _make_private_dirs(parent)
            # O_EXCL: an existing archive is evidence of an earlier run and must never be
            # clobbered; the mode is set at creation so the file is never readable by others.
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
            self._fd = os.open(path, flags, 0o600)
        except FileExistsError:
            raise ArchiveError(
                f"archive {path} already exists; refusing to overwrite it, "
                "choose another archive path"
            ) from None
        except OSError as exc:
            raise _local_error(exc, path) from exc
        try:
            # The durable data is useless if the directory entry pointing at it is lost.
            _fsync_dir(parent)
        except BaseException:
            os.close(self._fd)
            raise
        self._good_size = 0

    def write_batch(self, records: Sequence[ArchiveRecord]) -> None:
        self._check_usable()
        if not records:
            return
        written = 0
        try:
            for chunk in _chunked(records, self._chunk_records):
                # Encoding before any I/O: an unencodable record fails the batch cleanly.
                lines = _encode_lines(chunk)
                if self._gzip:
                    written += self._write_gzip_member(lines)
                else:
                    written += self._write_buffered(lines)
            os.fsync(self._fd)
        except ArchiveError:
            if written:
                self._broken = True
                self._roll_back()
            raise
        except BaseException as exc:
            # Also on Ctrl-C: a half-written batch must not sit between durable ones,
            # or readers would stop there and never see later batches.
            self._broken = True
            self._roll_back()
            if isinstance(exc, OSError):
                raise _local_error(exc, self.location) from exc
            raise
        self._good_size += written

    def _write_gzip_member(self, lines: list[bytes]) -> int:
        compressor = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, _GZIP_WBITS)
        return self._write_buffered(lines, compressor.compress, compressor.flush)

    def _write_buffered(
        self,
        lines: list[bytes],
        transform: Callable[[bytes], bytes] | None = None,
        finish: Callable[[], bytes] | None = None,
    ) -> int:
        pending = bytearray()
        written = 0
        for line in lines:
            pending += transform(line) if transform is not None else line
            if len(pending) >= _WRITE_CHUNK:
                written += _write_all(self._fd, pending)
                pending.clear()
        if finish is not None:
            pending += finish()
        if pending:
            written += _write_all(self._fd, pending)
        return written

    def _roll_back(self) -> None:
        try:
            os.ftruncate(self._fd, self._good_size)
            os.lseek(self._fd, self._good_size, os.SEEK_SET)
        except OSError:
            # The partial tail stays; readers report it as truncated and keep what precedes it.
            pass

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._fd)


class S3ArchiveWriter(_WriterBase):
    """Puts each batch as ``part-NNNNNN.jsonl.gz`` objects under ``s3://bucket/prefix/run/``."""

    def __init__(
        self,
        client: S3Client,
        bucket: str,
        prefix: str,
        *,
        run_name: str | None = None,
        chunk_records: int = 1000,
    ) -> None:
        if run_name is None:
            # Timestamp first so a listing of the prefix is chronological; the random tail
            # keeps two runs started in the same second apart.
            run_name = f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"
        elif not run_name or "/" in run_name:
            raise ValueError(f"run_name must be a non-empty name without '/': {run_name!r}")
        base = prefix.rstrip("/")
        self._run_prefix = f"{base}/{run_name}/" if base else f"{run_name}/"
        super().__init__(f"s3://{bucket}/{self._run_prefix}", chunk_records)
        self._client = client
        self._bucket = bucket
        self._part = 0
        self._preflight()

    def _preflight(self) -> None:
        # Fails before purge receives anything if the bucket is missing or the run exists.
        try:
            listing = self._client.list_objects_v2(
                Bucket=self._bucket, Prefix=self._run_prefix, MaxKeys=1
            )
        except ClientError as exc:
            if _client_error_code(exc) in _ACCESS_DENIED_CODES:
                # Write-only credentials (PutObject without ListBucket) are a sane setup for
                # an archive bucket; the first put will tell if writing is denied too.
                return
            raise _s3_error(exc, self.location, self._bucket, writing=True) from exc
        except BotoCoreError as exc:
            raise _s3_error(exc, self.location, self._bucket, writing=True) from exc
        if listing.get("KeyCount", 0) or listing.get("Contents"):
            raise ArchiveError(
                f"archive {self.location} already has objects; refusing to mix runs, "
                "choose another run name or prefix"
            )

    def write_batch(self, records: Sequence[ArchiveRecord]) -> None:
        self._check_usable()
        for chunk in _chunked(records, self._chunk_records):
            compressor = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, _GZIP_WBITS)
            parts = [compressor.compress(line) for line in _encode_lines(chunk)]
            parts.append(compressor.flush())
            key = f"{self._run_prefix}part-{self._part + 1:06d}.jsonl.gz"
            try:
                self._client.put_object(
                    Bucket=self._bucket,
                    Key=key,
                    Body=b"".join(parts),
                    ContentType="application/gzip",
                    # Same rule as local files: never replace an archive object.
                    IfNoneMatch="*",
                )
            except (ClientError, BotoCoreError) as exc:
                self._broken = True
                where = f"s3://{self._bucket}/{key}"
                raise _s3_error(exc, where, self._bucket, writing=True) from exc
            self._part += 1


def open_writer(
    destination: str,
    *,
    s3_client_factory: Callable[[], Any] | None = None,
    chunk_records: int = 1000,
    run_name: str | None = None,
) -> ArchiveWriter:
    """Open a new archive at a local path or an ``s3://bucket/prefix`` URI.

    ``chunk_records`` caps the records per gzip member / S3 object, which bounds the memory
    used to write and later to read one.  ``run_name`` names the S3 run folder (default:
    UTC timestamp plus a random suffix); it is ignored for local files.
    """
    if destination.startswith("s3://"):
        bucket, prefix = _parse_s3_uri(destination)
        if prefix.endswith((".jsonl", ".jsonl.gz")):
            parent = prefix.rpartition("/")[0]
            raise ArchiveError(
                f"S3 archive {destination} names an object, but S3 archives are written as "
                f"part objects under a prefix; use a prefix such as s3://{bucket}/{parent}"
            )
        if s3_client_factory is None:
            raise ValueError("an s3:// archive needs s3_client_factory")
        client = s3_client_factory()
        return S3ArchiveWriter(
            client, bucket, prefix, run_name=run_name, chunk_records=chunk_records
        )
    _reject_other_schemes(destination)
    return LocalArchiveWriter(os.path.expanduser(destination), chunk_records=chunk_records)


def default_archive_path(family: str, now: datetime) -> str:
    """``./redrive-archive/{family}-{YYYYMMDDTHHMMSSZ}.jsonl.gz`` for an aware ``now``."""
    if now.utcoffset() is None:
        raise ValueError("default_archive_path needs a timezone-aware datetime")
    # A family name is config text, not a path: keep it from adding directories.
    safe_family = re.sub(r"[^A-Za-z0-9._-]", "_", family) or "archive"
    return f"./redrive-archive/{safe_family}-{now.astimezone(UTC):%Y%m%dT%H%M%SZ}.jsonl.gz"


# --------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------


def read_records(
    source: str,
    *,
    s3_client_factory: Callable[[], Any] | None = None,
    on_problem: Callable[[str], None] | None = None,
) -> Iterator[ArchiveRecord]:
    """Stream the records of a local archive file or an S3 object/prefix, in write order.

    Memory stays bounded by one line (plain files) or one gzip member (at most
    ``chunk_records`` records as written).  Only complete gzip members are trusted: the
    records of a member cut short by a killed writer were never acknowledged, so their
    messages were not deleted and replaying them would duplicate live messages.

    Damage (a truncated tail, a corrupt line or member) is passed to ``on_problem`` as a
    one-line message and skipped (a bad line) or ends that file (a bad gzip member); without
    ``on_problem`` it raises :class:`ArchiveError` after the intact records before it.
    A record from a newer format version always raises.
    """
    report = on_problem if on_problem is not None else _raise_problem
    if source.startswith("s3://"):
        if s3_client_factory is None:
            raise ValueError("an s3:// archive needs s3_client_factory")
        yield from _read_s3(source, s3_client_factory(), report)
        return
    _reject_other_schemes(source)
    path = os.path.expanduser(source)
    try:
        stream = open(path, "rb")  # noqa: SIM115 - closed by the with below, across yields
    except FileNotFoundError:
        raise ArchiveError(f"no archive at {path}; check the path") from None
    except OSError as exc:
        raise _local_error(exc, path, writing=False) from exc
    with stream:
        yield from _records_from_chunks(_iter_chunks(stream.read, path), path, report)


def _raise_problem(message: str) -> None:
    raise ArchiveError(message)


def _read_s3(
    source: str, client: S3Client, report: Callable[[str], None]
) -> Iterator[ArchiveRecord]:
    bucket, key = _parse_s3_uri(source)
    if key.endswith((".jsonl", ".jsonl.gz")):
        keys = [key]
    else:
        # "runs/abc" must not also match "runs/abcdef/...".
        prefix = f"{key.rstrip('/')}/" if key.strip("/") else ""
        keys = _list_archive_keys(client, bucket, prefix, source)
        if not keys:
            raise ArchiveError(f"no archive objects (*.jsonl.gz) under {source}; check the URI")
    for object_key in keys:
        where = f"s3://{bucket}/{object_key}"
        try:
            body = client.get_object(Bucket=bucket, Key=object_key)["Body"]
        except (ClientError, BotoCoreError) as exc:
            raise _s3_error(exc, where, bucket, writing=False) from exc
        try:
            yield from _records_from_chunks(_iter_chunks(body.read, where), where, report)
        finally:
            body.close()


def _list_archive_keys(client: S3Client, bucket: str, prefix: str, source: str) -> list[str]:
    keys: list[str] = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys.extend(
                obj["Key"]
                for obj in page.get("Contents", [])
                if obj["Key"].endswith((".jsonl", ".jsonl.gz"))
            )
    except (ClientError, BotoCoreError) as exc:
        raise _s3_error(exc, source, bucket, writing=False) from exc
    # Numeric order, so part-1000000 (should a run ever get there) follows part-999999.
    keys.sort(key=_natural_key)
    return keys


def _natural_key(text: str) -> list[tuple[int, int, str]]:
    return [
        (0, int(piece), "") if piece.isdigit() else (1, 0, piece)
        for piece in re.split(r"(\d+)", text)
    ]


def _iter_chunks(read: Callable[[int], bytes], where: str) -> Iterator[bytes]:
    while True:
        try:
            chunk = read(_READ_CHUNK)
        except OSError as exc:
            raise _local_error(exc, where, writing=False) from exc
        except BotoCoreError as exc:
            raise ArchiveError(
                f"reading archive {where} failed: {_one_line(str(exc))}; try again"
            ) from exc
        if not chunk:
            return
        yield chunk


def _records_from_chunks(
    chunks: Iterator[bytes], where: str, report: Callable[[str], None]
) -> Iterator[ArchiveRecord]:
    # Sniff rather than trust the name: a renamed or recompressed archive still reads.
    head = b""
    for chunk in chunks:
        head += chunk
        if len(head) >= len(_GZIP_MAGIC):
            break
    parser = _LineParser(where, report)
    rest = itertools.chain([head], chunks)
    if head.startswith(_GZIP_MAGIC):
        try:
            for member in _gzip_members(rest):
                for line, terminated in _split_lines([member]):
                    record = parser.parse(line, terminated=terminated, tail_is_truncation=False)
                    if record is not None:
                        yield record
        except _DamagedGzip as exc:
            if exc.truncated:
                report(
                    f"archive {where} ends in an incomplete gzip member after {parser.intact} "
                    "intact records (the writer was stopped mid-batch; that batch was never "
                    "acknowledged, so its messages were not deleted)"
                )
            else:
                report(
                    f"archive {where} has corrupt gzip data after {parser.intact} intact "
                    f"records ({exc}); the rest of it cannot be read, restore it from a copy"
                )
        return
    for line, terminated in _split_lines(rest):
        record = parser.parse(line, terminated=terminated, tail_is_truncation=True)
        if record is not None:
            yield record


class _DamagedGzip(Exception):
    def __init__(self, message: str, *, truncated: bool) -> None:
        super().__init__(message)
        self.truncated = truncated


def _gzip_members(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Yield the decompressed payload of each complete, CRC-checked gzip member."""
    decompressor: Any = None
    payload: list[bytes] = []
    for chunk in chunks:
        data = chunk
        while data:
            if decompressor is None:
                decompressor = zlib.decompressobj(_GZIP_WBITS)
                payload = []
            try:
                payload.append(decompressor.decompress(data))
            except zlib.error as exc:
                raise _DamagedGzip(str(exc), truncated=False) from None
            if decompressor.eof:
                yield b"".join(payload)
                data = decompressor.unused_data
                decompressor = None
            else:
                data = b""
    if decompressor is not None:
        raise _DamagedGzip("incomplete gzip member", truncated=True)


def _split_lines(chunks: Iterable[bytes]) -> Iterator[tuple[bytes, bool]]:
    """Yield ``(line, ended_with_newline)``; only the final piece can be unterminated."""
    pending = bytearray()
    for chunk in chunks:
        # Only the new bytes can hold a newline: keeps long lines (big bodies) linear.
        start = 0
        search_from = len(pending)
        pending += chunk
        while (end := pending.find(b"\n", search_from)) != -1:
            yield bytes(pending[start:end]), True
            start = search_from = end + 1
        del pending[:start]
    if pending:
        yield bytes(pending), False


class _LineParser:
    def __init__(self, where: str, report: Callable[[str], None]) -> None:
        self.where = where
        self.report = report
        self.lineno = 0
        self.intact = 0

    def parse(
        self, line: bytes, *, terminated: bool, tail_is_truncation: bool
    ) -> ArchiveRecord | None:
        self.lineno += 1
        if not line.strip():
            return None
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise ArchiveError("line is not a JSON object")
            record = ArchiveRecord.from_json(data)
        except _NewerFormat as exc:
            raise ArchiveError(f"archive {self.where} line {self.lineno}: {exc}") from None
        except (ArchiveError, ValueError, RecursionError) as exc:
            # A complete record without its newline (hand-edited file) parsed fine above;
            # an unparsable unterminated tail is a write cut short by a kill.
            if not terminated and tail_is_truncation:
                self.report(
                    f"archive {self.where} ends in an incomplete record at line {self.lineno} "
                    f"after {self.intact} intact records (the writer was stopped mid-write; "
                    "that record was never acknowledged, so its message was not deleted)"
                )
            else:
                self.report(
                    f"archive {self.where} line {self.lineno} is not a valid record "
                    f"({_one_line(str(exc))}); skipped it"
                )
            return None
        self.intact += 1
        return record


# --------------------------------------------------------------------------------------
# Helpers: paths, URIs, errors
# --------------------------------------------------------------------------------------


def _parse_s3_uri(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise ArchiveError(f"archive URI {uri} has no bucket; use s3://bucket/prefix")
    return bucket, key


def _reject_other_schemes(location: str) -> None:
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", location):
        raise ArchiveError(
            f"archive location {location} uses an unsupported scheme; "
            "use a local path or s3://bucket/prefix"
        )


def _make_private_dirs(directory: str) -> None:
    missing: list[str] = []
    current = directory
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if not os.path.isdir(path):
                raise NotADirectoryError(errno.ENOTDIR, "a file is in the way", path) from None
            continue
        _fsync_dir(os.path.dirname(path))


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # e.g. Windows cannot open directories; nothing more we can do there
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some filesystems do not support fsync on directories; anything else is real.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise ArchiveError(
                f"cannot sync directory {directory} ({exc.strerror}); "
                "check the disk or choose another archive path"
            ) from exc
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes | bytearray) -> int:
    view = memoryview(data)
    while view:
        count = os.write(fd, view)
        if count <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[count:]
    return len(data)


def _local_error(exc: OSError, location: str, *, writing: bool = True) -> ArchiveError:
    action = "writing" if writing else "reading"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ArchiveError(
            f"disk full {action} archive {location}; free space or archive to "
            "s3://bucket/prefix (nothing from the failed batch was deleted)"
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        hint = "choose a writable archive path" if writing else "check the file's permissions"
        return ArchiveError(f"permission denied {action} archive {location}; {hint}")
    if exc.errno == errno.EROFS:
        return ArchiveError(
            f"archive {location} is on a read-only filesystem; choose another archive path"
        )
    if exc.errno == errno.EISDIR:
        return ArchiveError(f"archive {location} is a directory; give a file path")
    reason = _one_line(exc.strerror or str(exc))
    return ArchiveError(
        f"{action} archive {location} failed: {reason}; check the path and the disk"
    )


_ACCESS_DENIED_CODES: Final = frozenset(
    {"AccessDenied", "403", "AllAccessDisabled", "AccountProblem", "Forbidden"}
)
_CREDENTIAL_CODES: Final = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
    }
)


def _client_error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _s3_error(
    exc: ClientError | BotoCoreError, location: str, bucket: str, *, writing: bool
) -> ArchiveError:
    action = "writing" if writing else "reading"
    if isinstance(exc, BotoCoreError):
        return ArchiveError(
            f"cannot reach S3 {action} archive {location}: {_one_line(str(exc))}; "
            "check AWS credentials, region, endpoint and network"
        )
    code = _client_error_code(exc)
    if code == "NoSuchBucket":
        return ArchiveError(
            f"S3 bucket {bucket} does not exist ({action} archive {location}); "
            "create it or use an existing bucket"
        )
    if code in ("NoSuchKey", "404"):
        return ArchiveError(f"no archive object at {location}; check the URI")
    if code in ("PreconditionFailed", "412"):
        return ArchiveError(
            f"archive object {location} already exists; refusing to overwrite it, "
            "choose another prefix"
        )
    if code in _ACCESS_DENIED_CODES:
        needed = "s3:PutObject" if writing else "s3:ListBucket and s3:GetObject"
        return ArchiveError(
            f"access denied {action} archive {location}; grant {needed} on it "
            "or choose another archive location"
        )
    if code in _CREDENTIAL_CODES:
        return ArchiveError(
            f"S3 rejected the AWS credentials {action} archive {location} ({code}); "
            "refresh or fix your credentials"
        )
    message = _one_line(str(exc.response.get("Error", {}).get("Message", "")))
    return ArchiveError(
        f"S3 error {action} archive {location}: {code or 'unknown'} {message}".rstrip()
        + "; check the URI, your permissions and try again"
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())
