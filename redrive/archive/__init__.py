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
* The first member of a gzip file is its header: empty, with redrive's field (below) saying
  "open" while the writer runs; ``close`` rewrites it in place (same size) as "closed" with
  the number of records and batch members written.  A writer that did not close (killed)
  leaves it open.
* S3 destinations are prefixes: each ``write_batch`` puts one object per ``chunk_records``
  records under ``{prefix}/{run_name}/part-{n:06d}.jsonl.gz`` and returns only after every
  put succeeded.  Nothing is buffered across calls (a batch must be durable when the call
  returns), so callers writing to S3 should pass batches of hundreds of messages rather than
  SQS's 10, or the run leaves one small object per receive.  ``close`` puts
  ``part-000000.jsonl.gz``: the run's closed header, listed first though written last (so a
  copy of the run cut short still has it).  It is the only object that holds no record.

Redrive's gzip field
--------------------
Every member redrive writes carries an RFC 1952 extra field (FEXTRA), subfield ``RD``, that
every gzip reader skips.  Its data is big-endian, ending in a CRC32 of the bytes before it:

* header: ``"H"``, version 1, closed (0/1), records (u64), batch members (u64), CRC32;
* batch member: ``"M"``, version 1, number (u64, 1 for the writer's first), records (u32),
  CRC32.  S3 part N holds member N.

What a reader can tell (:class:`ArchiveReader`)
-----------------------------------------------
A writer killed mid-batch leaves at most one unfinished member (or line) at the end of a
local file, after complete ones, under an open header (or none, before headers existed):
a warning, since that batch was never acknowledged and its messages never deleted.  Anything
else is damage: not gzip nor records, a member failing its CRC or length check, bytes between
members, a member missing (numbers jump), a line that is not a record, an S3 object cut short
(each is one PutObject), and a file or run ending before what its closed header counts.  A
copy cut short inside the last member of a file whose writer never closed cannot be told from
the kill itself; once closed, every cut is damage.

Durability contract: when ``write_batch`` returns, its records survive a crash (local: data
written and ``fsync``-ed; S3: ``PutObject`` succeeded).  The archive may therefore hold
records whose messages were never deleted (the run stopped between archiving and deleting),
never the reverse.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import itertools
import json
import os
import re
import secrets
import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Protocol, Self, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from redrive.aws.errors import ACCESS_CODES, CREDENTIAL_CODES, error_code
from redrive.errors import ArchiveError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = [
    "ARCHIVED_ATTRIBUTES",
    "ARCHIVE_VERSION",
    "ArchiveCheck",
    "ArchiveDamaged",
    "ArchiveReader",
    "ArchiveRecord",
    "ArchiveWriter",
    "Damage",
    "DamageReport",
    "LocalArchiveWriter",
    "S3ArchiveWriter",
    "check_archive",
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
# Gzip members and redrive's field in their header
# --------------------------------------------------------------------------------------

# Every gzip reader skips a header's extra field (RFC 1952 FEXTRA), so these fields cost old
# readers, zcat and gzip nothing.  Each ends in a CRC32 of itself: the header is rewritten in
# place on close, and the member CRC covers only the data.
_FEXTRA: Final = 0x04
_EXTRA_ID: Final = b"RD"
_FIELD_VERSION: Final = 1
_HEADER_FIELDS: Final = struct.Struct(">cBBQQ")  # b"H", version, closed, records, members
_MEMBER_FIELDS: Final = struct.Struct(">cBQI")  # b"M", version, seq, records
_MEMBER_MAGIC: Final = b"\x1f\x8b\x08"


@dataclass(frozen=True, slots=True)
class _Header:
    """The empty first member of an archive: closed, with its totals, once its writer closed."""

    closed: bool
    records: int
    members: int


@dataclass(frozen=True, slots=True)
class _MemberInfo:
    seq: int
    records: int


def _member_head(fields: bytes) -> bytes:
    data = fields + struct.pack(">I", zlib.crc32(fields))
    extra = _EXTRA_ID + struct.pack("<H", len(data)) + data
    # Deflate, FEXTRA only, MTIME 0 (the record has its own times), XFL 0, OS unknown.
    return (
        _GZIP_MAGIC
        + bytes([8, _FEXTRA, 0, 0, 0, 0, 0, 255])
        + struct.pack("<H", len(extra))
        + extra
    )


def _gzip_member_pieces(lines: Sequence[bytes], *, seq: int) -> Iterator[bytes]:
    """One gzip member holding ``lines``, numbered ``seq`` (1 for an archive's first batch)."""
    yield _member_head(_MEMBER_FIELDS.pack(b"M", _FIELD_VERSION, seq, len(lines)))
    compressor = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    crc = size = 0
    for line in lines:
        crc = zlib.crc32(line, crc)
        size += len(line)
        yield compressor.compress(line)
    yield compressor.flush()
    yield struct.pack("<II", crc, size & 0xFFFFFFFF)


def _header_member(*, closed: bool, records: int, members: int) -> bytes:
    """The fixed-size first member: rewriting it on close changes no other byte."""
    fields = _HEADER_FIELDS.pack(b"H", _FIELD_VERSION, int(closed), records, members)
    empty = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS).flush()
    return _member_head(fields) + empty + struct.pack("<II", 0, 0)


def _parse_field(head: bytes | bytearray) -> _Header | _MemberInfo | None:
    """redrive's field in the gzip header that starts ``head``; None when it has none (an
    archive from before it, or another tool's gzip).  Raises ValueError when it is corrupt."""
    if len(head) < 12 or not head[3] & _FEXTRA:
        return None
    extra = bytes(head[12 : 12 + int.from_bytes(head[10:12], "little")])
    at = 0
    while at + 4 <= len(extra):
        size = int.from_bytes(extra[at + 2 : at + 4], "little")
        if extra[at : at + 2] == _EXTRA_ID:
            return _decode_field(extra[at + 4 : at + 4 + size])
        at += 4 + size
    return None


def _decode_field(data: bytes) -> _Header | _MemberInfo | None:
    fields, check = data[:-4], data[-4:]
    if len(data) < 6 or zlib.crc32(fields) != int.from_bytes(check, "big"):
        raise ValueError("redrive's field in its gzip header fails its CRC")
    if fields[1] != _FIELD_VERSION:
        return None  # a later writer's field: its records are still read and checked
    if fields[:1] == b"H" and len(fields) == _HEADER_FIELDS.size:
        _, _, closed, records, members = _HEADER_FIELDS.unpack(fields)
        return _Header(closed=bool(closed), records=records, members=members)
    if fields[:1] == b"M" and len(fields) == _MEMBER_FIELDS.size:
        _, _, seq, records = _MEMBER_FIELDS.unpack(fields)
        return _MemberInfo(seq=seq, records=records)
    return None


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
        self._records = 0
        self._members = 0
        self._good_size = 0
        try:
            # The durable data is useless if the directory entry pointing at it is lost.
            _fsync_dir(parent)
            if self._gzip:
                self._good_size = _write_all(self._fd, self._header(closed=False))
                os.fsync(self._fd)
        except BaseException as exc:
            os.close(self._fd)
            # Nothing was archived yet: leave no empty file to block the rerun's O_EXCL.
            with contextlib.suppress(OSError):
                os.unlink(path)
            if isinstance(exc, OSError):
                raise _local_error(exc, path) from exc
            raise

    def write_batch(self, records: Sequence[ArchiveRecord]) -> None:
        self._check_usable()
        if not records:
            return
        written = members = 0
        try:
            for chunk in _chunked(records, self._chunk_records):
                # Encoding before any I/O: an unencodable record fails the batch cleanly.
                lines = _encode_lines(chunk)
                if self._gzip:
                    members += 1
                    written += self._write_pieces(
                        _gzip_member_pieces(lines, seq=self._members + members)
                    )
                else:
                    written += self._write_pieces(lines)
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
        self._members += members
        self._records += len(records)

    def _header(self, *, closed: bool) -> bytes:
        return _header_member(closed=closed, records=self._records, members=self._members)

    def _write_pieces(self, pieces: Iterable[bytes]) -> int:
        pending = bytearray()
        written = 0
        for piece in pieces:
            pending += piece
            if len(pending) >= _WRITE_CHUNK:
                written += _write_all(self._fd, pending)
                pending.clear()
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
        if self._closed:
            return
        self._closed = True
        try:
            self._seal()
        finally:
            os.close(self._fd)

    def _seal(self) -> None:
        """Rewrite the header as closed, with the counts of every acknowledged batch."""
        # A tail a failed rollback left behind must stay readable as an unfinished batch.
        if not self._gzip or os.fstat(self._fd).st_size != self._good_size:
            return
        header = self._header(closed=True)
        try:
            _write_at(self._fd, header, 0)
            os.fsync(self._fd)
        except OSError:
            # The archive stays marked open: as readable, with a weaker check for a cut.
            pass


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
        self._records = 0
        self._preflight()

    def _preflight(self) -> None:
        # Fails before purge receives anything if the bucket is missing or the run exists.
        try:
            listing = self._client.list_objects_v2(
                Bucket=self._bucket, Prefix=self._run_prefix, MaxKeys=1
            )
        except ClientError as exc:
            if error_code(exc) in ACCESS_CODES:
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
            body = b"".join(_gzip_member_pieces(_encode_lines(chunk), seq=self._part + 1))
            try:
                self._put(self._part + 1, body)
            except (ClientError, BotoCoreError) as exc:
                self._broken = True
                where = f"s3://{self._bucket}/{self._part_key(self._part + 1)}"
                raise _s3_error(exc, where, self._bucket, writing=True) from exc
            self._part += 1
            self._records += len(chunk)

    def _part_key(self, number: int) -> str:
        return f"{self._run_prefix}part-{number:06d}.jsonl.gz"

    def _put(self, number: int, body: bytes) -> None:
        self._client.put_object(
            Bucket=self._bucket,
            Key=self._part_key(number),
            Body=body,
            ContentType="application/gzip",
            # Same rule as local files: never replace an archive object.
            IfNoneMatch="*",
        )

    def close(self) -> None:
        """Put part 0: the run's header, which says how many parts and records it holds."""
        if self._closed:
            return
        self._closed = True
        # After a failed put the run's last part is in doubt: a count could be wrong.
        if self._broken:
            return
        header = _header_member(closed=True, records=self._records, members=self._part)
        # Unsealed, the run reads as one whose writer was stopped: readable, checked less.
        with contextlib.suppress(ClientError, BotoCoreError):
            self._put(0, header)


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

_LISTED_DAMAGE: Final = 20
_CHECK_PROGRESS_EVERY: Final = 2000
# How a redrive-written line starts: a killed writer's cut line is a prefix of this or starts
# with it; anything else at the end of a file is damage, not an unfinished write.
_RECORD_START: Final = b'{"v":1,"message_id":"'


@dataclass(frozen=True, slots=True)
class Damage:
    """One damaged place in an archive: what is wrong there and how far reading had got."""

    location: str
    """The file or S3 object (or, for missing parts, the S3 run prefix)."""
    what: str
    offset: int | None = None
    """Byte offset in the file or object as stored (compressed)."""
    member: int | None = None
    """Gzip member, 1-based, counting the archive's header member."""
    line: int | None = None
    """Line of the decompressed text, 1-based."""
    records_read: int = 0
    """Intact records read from the archive before this place."""
    records_lost: int | None = None
    """Records the damaged place held, where its header still says so."""

    @property
    def where(self) -> str:
        places = []
        if self.line is not None:
            places.append(f"line {self.line}")
        if self.member is not None:
            places.append(f"gzip member {self.member}")
        if self.offset is not None:
            places.append(f"byte {self.offset}")
        return ", ".join(places) or "the end"

    @property
    def text(self) -> str:
        """What is wrong, and what it cost where that is known."""
        if self.records_lost is None:
            return self.what
        return f"{self.what}; {self.records_lost} record(s) lost there"

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.location,
            "where": self.where,
            "what": self.what,
            "offset": self.offset,
            "member": self.member,
            "line": self.line,
            "records_read": self.records_read,
            "records_lost": self.records_lost,
        }


@dataclass(frozen=True, slots=True)
class DamageReport:
    """Every damaged place one read of an archive found (the first few listed)."""

    source: str
    places: tuple[Damage, ...]
    count: int
    readable: int
    """Intact records read from the whole archive."""
    expected: int | None
    """Records the archive's headers say it holds; None when a writer never closed it."""

    @property
    def first(self) -> Damage:
        return self.places[0]

    def describe(self) -> str:
        first = self.first
        where = first.where if first.location == self.source else f"{first.location}, {first.where}"
        text = (
            f"archive {self.source} is damaged at {where}: {first.text}; "
            f"{first.records_read} record(s) read before it"
        )
        if self.count > 1:
            text += f", {self.count - 1} more damaged place(s) after it"
        if self.expected is not None:
            text += f"; {self.readable} of its {self.expected} record(s) read cleanly"
        elif self.readable != first.records_read:
            text += f"; {self.readable} record(s) read cleanly in all"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            **self.first.to_json(),
            "places": self.count,
            "readable": self.readable,
            "expected": self.expected,
            "all": [damage.to_json() for damage in self.places],
        }


class ArchiveDamaged(ArchiveError):
    """The archive is damaged: the records it should hold cannot all be read."""

    def __init__(self, report: DamageReport) -> None:
        super().__init__(report.describe())
        self.report = report


@dataclass(frozen=True, slots=True)
class ArchiveCheck:
    """What reading a whole archive found: its intact records and any damage."""

    records: int
    damage: DamageReport | None
    complete: bool = True
    """False when ``stop`` ended the check early."""


def read_records(
    source: str,
    *,
    s3_client_factory: Callable[[], Any] | None = None,
    on_problem: Callable[[str], None] | None = None,
    on_damage: Callable[[Damage], None] | None = None,
) -> Iterator[ArchiveRecord]:
    """Stream the records of a local archive file or an S3 object/prefix, in write order.

    Damage (see :class:`ArchiveReader`) raises :class:`ArchiveDamaged` after the intact
    records before it, unless ``on_damage`` takes it: then reading skips the damaged place
    and goes on.  The unfinished last batch of a writer killed mid-batch is not damage: it
    goes to ``on_problem`` as a one-line warning (without one it raises
    :class:`ArchiveError`).  A record from a newer format version always raises.
    """
    reader = ArchiveReader(
        source,
        s3_client_factory=s3_client_factory,
        on_problem=on_problem,
        on_damage=on_damage,
        skip_damage=on_damage is not None,
    )
    return iter(reader)


def check_archive(
    source: str,
    *,
    s3_client_factory: Callable[[], Any] | None = None,
    on_problem: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> ArchiveCheck:
    """Read a whole archive, keeping nothing but counts: is every record it should hold there?

    Streams (memory as :class:`ArchiveReader`); ``on_progress`` hears the records read so
    far every few thousand records, and ``stop`` ends the check early (not ``complete``).
    """
    reader = ArchiveReader(
        source, s3_client_factory=s3_client_factory, on_problem=on_problem, skip_damage=True
    )
    for count, _ in enumerate(reader, start=1):
        if stop is not None and stop.is_set():
            return ArchiveCheck(reader.records, reader.report(), complete=False)
        if on_progress is not None and count % _CHECK_PROGRESS_EVERY == 0:
            on_progress(count)
    return ArchiveCheck(records=reader.records, damage=reader.report())


@dataclass(slots=True)
class _Segment:
    """The members one writer wrote: a file's, or an S3 run folder's."""

    key: str
    header: _Header | None = None
    members: int = 0
    records: int = 0
    next_seq: int | None = None
    damaged: bool = False
    end: tuple[str, int | None] = ("", None)


class ArchiveReader:
    """One pass over an archive, telling damage from a writer killed mid-batch.

    A writer killed mid-batch leaves at most one unfinished gzip member (or one unfinished
    line) at the end of a local file, after complete ones; its batch was never acknowledged,
    so its messages were never deleted: reported to ``on_problem``, not read.  Everything
    else that keeps a record from being read is damage: data that is not gzip or not a
    record, a member that fails its CRC or length check, bytes between members, a member
    missing (redrive numbers them), an S3 object cut short (each is one PutObject), and a
    file or run that ends before its closed header's counts (so a copy cut short is told
    from a killed writer, whose header stays open).  Damage raises :class:`ArchiveDamaged`,
    or with ``skip_damage`` is counted, passed to ``on_damage`` and skipped: reading goes on
    at the next member that decodes (or the next line, or the next object).

    Memory stays bounded by one gzip member (at most ``chunk_records`` records as written).
    """

    def __init__(
        self,
        source: str,
        *,
        s3_client_factory: Callable[[], Any] | None = None,
        on_problem: Callable[[str], None] | None = None,
        on_damage: Callable[[Damage], None] | None = None,
        skip_damage: bool = False,
    ) -> None:
        self.source = source
        self.records = 0
        self.damage: list[Damage] = []
        self.damage_count = 0
        self._client_factory = s3_client_factory
        self._on_problem = on_problem if on_problem is not None else _raise_problem
        self._on_damage = on_damage
        self._skip_damage = skip_damage
        self._expected: int | None = 0
        self._segment: _Segment | None = None
        self._lineno = 0
        # False when one S3 object of a run is read: its header's counts cover the others.
        self._whole_runs = True

    def report(self) -> DamageReport | None:
        if not self.damage:
            return None
        return DamageReport(
            source=self.source,
            places=tuple(self.damage),
            count=self.damage_count,
            readable=self.records,
            expected=self._expected,
        )

    def __iter__(self) -> Iterator[ArchiveRecord]:
        if self.source.startswith("s3://"):
            if self._client_factory is None:
                raise ValueError("an s3:// archive needs s3_client_factory")
            yield from self._read_s3(self._client_factory())
        else:
            yield from self._read_file()
        self._end_segment()

    # -- sources --------------------------------------------------------------------------

    def _read_file(self) -> Iterator[ArchiveRecord]:
        _reject_other_schemes(self.source)
        path = os.path.expanduser(self.source)
        try:
            stream = open(path, "rb")  # noqa: SIM115 - closed by the with below, across yields
        except FileNotFoundError:
            raise ArchiveError(f"no archive at {path}; check the path") from None
        except OSError as exc:
            raise _local_error(exc, path, writing=False) from exc
        # Numbered members start at 1: a first one numbered later is the start gone missing.
        self._segment = _Segment(key=path, next_seq=1)
        with stream:
            yield from self._read_stream(_iter_chunks(stream.read, path), path, whole=False)

    def _read_s3(self, client: S3Client) -> Iterator[ArchiveRecord]:
        bucket, key = _parse_s3_uri(self.source)
        if key.endswith((".jsonl", ".jsonl.gz")):
            keys = [key]
            self._whole_runs = False
        else:
            # "runs/abc" must not also match "runs/abcdef/...".
            prefix = f"{key.rstrip('/')}/" if key.strip("/") else ""
            keys = _list_archive_keys(client, bucket, prefix, self.source)
            if not keys:
                raise ArchiveError(
                    f"no archive objects (*.jsonl.gz) under {self.source}; check the URI"
                )
        for object_key in keys:
            where = f"s3://{bucket}/{object_key}"
            folder = f"s3://{bucket}/{object_key.rpartition('/')[0]}/"
            if self._segment is None or self._segment.key != folder:
                self._end_segment()
                self._segment = _Segment(key=folder, next_seq=1 if self._whole_runs else None)
            try:
                body = client.get_object(Bucket=bucket, Key=object_key)["Body"]
            except (ClientError, BotoCoreError) as exc:
                raise _s3_error(exc, where, bucket, writing=False) from exc
            try:
                yield from self._read_stream(_iter_chunks(body.read, where), where, whole=True)
            finally:
                body.close()

    def _read_stream(
        self, chunks: Iterator[bytes], where: str, *, whole: bool
    ) -> Iterator[ArchiveRecord]:
        """``whole``: the stream was written in one piece (an S3 object), so it cannot end
        in an unfinished batch."""
        self._lineno = 0
        # Sniff rather than trust the name: a renamed or recompressed archive still reads.
        head = b""
        for chunk in chunks:
            head += chunk
            if len(head) >= len(_GZIP_MAGIC):
                break
        rest = itertools.chain([head], chunks)
        if not head.startswith(_GZIP_MAGIC):
            yield from self._read_lines(rest, where, whole=whole)
            return
        for event in _GzipWalker(rest):
            if isinstance(event, _Member):
                yield from self._read_member(event, where)
            else:
                self._gzip_fault(event, where, whole=whole)

    # -- gzip -----------------------------------------------------------------------------

    def _read_member(self, member: _Member, where: str) -> Iterator[ArchiveRecord]:
        segment = self._segment
        assert segment is not None
        if member.field_error is not None:
            self._damage(
                where,
                f"gzip member {member.index}: {member.field_error}",
                offset=member.offset,
                member=member.index,
            )
        info = member.info
        if isinstance(info, _Header):
            # A header starts what one writer wrote (files may be concatenated).
            self._end_segment()
            segment = self._segment = _Segment(key=segment.key, header=info, next_seq=1)
        elif isinstance(info, _MemberInfo):
            self._check_seq(segment, info, member, where)
            segment.members += 1
        else:
            segment.next_seq = None
            segment.members += 1
        before = self.records
        for line, _, _ in _split_lines([member.payload]):
            record = self._parse_line(line, where, member=member)
            if record is not None:
                yield record
        segment.records += self.records - before
        segment.end = (where, member.end)

    def _check_seq(self, segment: _Segment, info: _MemberInfo, member: _Member, where: str) -> None:
        expected = segment.next_seq
        segment.next_seq = info.seq + 1
        # Right after damage the members skipped explain any gap.
        if expected is None or info.seq == expected or member.after_damage:
            return
        if info.seq > expected:
            missing = f"#{expected}" if info.seq == expected + 1 else f"#{expected}-#{info.seq - 1}"
            what = f"batch member(s) {missing} of its writer are missing before #{info.seq}"
        else:
            what = f"batch member #{info.seq} of its writer comes again (or out of order)"
        self._damage(where, what, offset=member.offset, member=member.index)

    def _gzip_fault(self, fault: _Fault, where: str, *, whole: bool) -> None:
        segment = self._segment
        assert segment is not None
        header = segment.header
        lost = fault.info.records if isinstance(fault.info, _MemberInfo) else None
        if fault.kind == "unfinished":
            if not whole and (header is None or not header.closed):
                self._report(self._unfinished_batch(where, fault, header))
                return
            if whole:
                what = (
                    "the object ends inside a gzip member (an S3 object is written in one "
                    "piece, so it was cut short or changed)"
                )
            else:
                what = "the file is cut short inside a gzip member" + _promise(header)
        elif fault.kind == "corrupt":
            detail = re.sub(r"^Error -?\d+ while decompressing data: ", "", fault.detail)
            what = f"corrupt gzip data ({detail})"
        else:
            what = "bytes that are not gzip data, where a gzip member should start"
        self._damage(where, what, offset=fault.offset, member=fault.index, lost=lost)

    def _unfinished_batch(self, where: str, fault: _Fault, header: _Header | None) -> str:
        text = (
            f"archive {where} ends in an incomplete gzip member (byte {fault.offset}) after "
            f"{self.records} intact records: the unfinished batch of a writer stopped "
            "mid-batch, never acknowledged, so its messages were not deleted"
        )
        if header is None:
            # Written before archives had a header: a cut copy would look the same.
            text += "; if this file is a copy, check it is as long as the original"
        return text

    # -- JSON Lines -----------------------------------------------------------------------

    def _read_lines(
        self, chunks: Iterable[bytes], where: str, *, whole: bool
    ) -> Iterator[ArchiveRecord]:
        segment = self._segment
        assert segment is not None
        segment.members += 1  # a plain file has no header: it can only be checked line by line
        for line, terminated, offset in _split_lines(chunks):
            unfinished = not terminated and not whole and _looks_like_a_cut_record(line)
            record = self._parse_line(
                line, where, offset=offset, unfinished=unfinished, named_gzip=where.endswith(".gz")
            )
            if record is not None:
                yield record

    def _parse_line(
        self,
        line: bytes,
        where: str,
        *,
        member: _Member | None = None,
        offset: int | None = None,
        unfinished: bool = False,
        named_gzip: bool = False,
    ) -> ArchiveRecord | None:
        self._lineno += 1
        if not line.strip():
            return None
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise ArchiveError("line is not a JSON object")
            record = ArchiveRecord.from_json(data)
        except _NewerFormat as exc:
            raise ArchiveError(f"archive {where} line {self._lineno}: {exc}") from None
        except (ArchiveError, ValueError, RecursionError) as exc:
            reason = _one_line(str(exc))
            if unfinished:
                # A complete record without its newline (hand-edited) parsed fine above.
                self._report(
                    f"archive {where} ends in an incomplete record at line {self._lineno} "
                    f"after {self.records} intact records (the writer was stopped mid-write; "
                    "that record was never acknowledged, so its message was not deleted)"
                )
                return None
            if named_gzip and self._lineno == 1 and self.records == 0:
                what = f"not gzip (no gzip magic bytes) and not JSON Lines either ({reason})"
            else:
                what = f"not a valid record ({reason})"
            self._damage(
                where,
                what,
                offset=member.offset if member is not None else offset,
                member=member.index if member is not None else None,
                line=self._lineno,
            )
            return None
        self.records += 1
        return record

    # -- segments, damage and problems ----------------------------------------------------

    def _end_segment(self) -> None:
        segment, self._segment = self._segment, None
        if segment is None:
            return
        header = segment.header
        if header is None or not header.closed or not self._whole_runs:
            if header is not None or segment.members:
                self._expected = None  # no closed header says what it should hold
            return
        if self._expected is not None:
            self._expected += header.records
        if segment.damaged or (segment.members, segment.records) == (
            header.members,
            header.records,
        ):
            return
        s3 = segment.key.startswith("s3://")
        where, offset = (segment.key, None) if s3 else segment.end
        found = f"{segment.records} record(s)" + (f" in {segment.members} part(s)" if s3 else "")
        if (segment.members, segment.records) < (header.members, header.records):
            what = f"it is cut short: it ends after {found}" + _promise(header, s3=s3)
        else:
            what = f"it holds {found}, more than its header says" + _promise(header, s3=s3)
        self._damage(where, what, offset=offset)

    def _damage(
        self,
        where: str,
        what: str,
        *,
        offset: int | None = None,
        member: int | None = None,
        line: int | None = None,
        lost: int | None = None,
    ) -> None:
        damage = Damage(
            location=where,
            what=what,
            offset=offset,
            member=member,
            line=line,
            records_read=self.records,
            records_lost=lost,
        )
        if self._segment is not None:
            self._segment.damaged = True
        self.damage_count += 1
        if len(self.damage) < _LISTED_DAMAGE:
            self.damage.append(damage)
        if not self._skip_damage:
            raise ArchiveDamaged(
                DamageReport(self.source, (damage,), 1, readable=self.records, expected=None)
            )
        if self._on_damage is not None:
            self._on_damage(damage)

    def _report(self, message: str) -> None:
        self._on_problem(message)


def _promise(header: _Header | None, *, s3: bool = False) -> str:
    if header is None or not header.closed:
        return ""
    if s3:
        return f"; its header (part 0) says {header.records} record(s) in {header.members} part(s)"
    return f"; its header says it holds {header.records} record(s)"


def _looks_like_a_cut_record(line: bytes) -> bool:
    start = re.sub(rb"\s+", b"", line[: 4 * len(_RECORD_START)])[: len(_RECORD_START)]
    return _RECORD_START.startswith(start)


def _raise_problem(message: str) -> None:
    raise ArchiveError(message)


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


@dataclass(slots=True)
class _Member:
    index: int
    offset: int
    end: int
    payload: bytes
    info: _Header | _MemberInfo | None
    field_error: str | None
    after_damage: bool


@dataclass(slots=True)
class _Fault:
    kind: str
    """"corrupt" (fails to decode), "unfinished" (the stream ends inside it), "garbage"."""
    index: int
    offset: int
    detail: str = ""
    info: _Header | _MemberInfo | None = None


class _GzipWalker:
    """The CRC-checked members of a gzip stream, with where each starts.

    After a fault it reports nothing more until a member decodes again: it looks for the
    next gzip magic and tries each (a false one fails its checks and is passed over).
    """

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = bytearray()
        self._base = 0
        self._exhausted = False

    def __iter__(self) -> Iterator[_Member | _Fault]:
        index = 0
        resyncing = False
        while self._buf or self._fill():
            while len(self._buf) < len(_MEMBER_MAGIC) and self._fill():
                pass
            offset = self._base
            if not self._buf.startswith(_MEMBER_MAGIC):
                if not resyncing:
                    cut = self._exhausted and _MEMBER_MAGIC.startswith(bytes(self._buf))
                    yield _Fault("unfinished" if cut else "garbage", index + 1, offset)
                    resyncing = True
                self._skip_to_magic()
                continue
            outcome = self._decode()
            if isinstance(outcome, tuple):
                payload, length = outcome
                index += 1
                info, field_error = self._field()
                yield _Member(index, offset, offset + length, payload, info, field_error, resyncing)
                resyncing = False
                self._drop(length)
                continue
            if not resyncing:
                info, _ = self._field()
                kind = "unfinished" if outcome is None else "corrupt"
                yield _Fault(kind, index + 1, offset, outcome or "", info)
                resyncing = True
            if outcome is None:
                return  # the stream ended inside it: nothing follows
            self._skip_to_magic()

    def _fill(self) -> bool:
        if self._exhausted:
            return False
        chunk = next(self._chunks, b"")
        if not chunk:
            self._exhausted = True
            return False
        self._buf += chunk
        return True

    def _drop(self, count: int) -> None:
        del self._buf[:count]
        self._base += count

    def _decode(self) -> tuple[bytes, int] | str | None:
        """(payload, length) of the member at the start of the buffer; a zlib message if it
        is corrupt; None if the stream ends inside it."""
        decompressor = zlib.decompressobj(_GZIP_WBITS)
        payload: list[bytes] = []
        fed = 0
        while True:
            if fed == len(self._buf) and not self._fill():
                return None
            try:
                payload.append(decompressor.decompress(bytes(self._buf[fed:])))
            except zlib.error as exc:
                return str(exc)
            fed = len(self._buf)
            if decompressor.eof:
                return b"".join(payload), fed - len(decompressor.unused_data)

    def _field(self) -> tuple[_Header | _MemberInfo | None, str | None]:
        head = bytes(self._buf[:12])
        if len(head) == 12 and head[3] & _FEXTRA:
            head = bytes(self._buf[: 12 + int.from_bytes(head[10:12], "little")])
        try:
            return _parse_field(head), None
        except ValueError as exc:
            return None, str(exc)

    def _skip_to_magic(self) -> None:
        """Drop the buffer's first byte and everything up to the next gzip magic."""
        self._drop(1)
        while True:
            found = self._buf.find(_MEMBER_MAGIC)
            if found != -1:
                self._drop(found)
                return
            self._drop(max(0, len(self._buf) - (len(_MEMBER_MAGIC) - 1)))
            if not self._fill():
                self._drop(len(self._buf))
                return


def _split_lines(chunks: Iterable[bytes]) -> Iterator[tuple[bytes, bool, int]]:
    """Yield ``(line, ended_with_newline, offset)``; only the final piece can be unterminated."""
    pending = bytearray()
    consumed = 0
    for chunk in chunks:
        # Only the new bytes can hold a newline: keeps long lines (big bodies) linear.
        start = 0
        search_from = len(pending)
        pending += chunk
        while (end := pending.find(b"\n", search_from)) != -1:
            yield bytes(pending[start:end]), True, consumed + start
            start = search_from = end + 1
        del pending[:start]
        consumed += start
    if pending:
        yield bytes(pending), False, consumed


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


def _write_at(fd: int, data: bytes, offset: int) -> None:
    """Overwrite ``data`` at ``offset``, leaving the file position where it was."""
    if hasattr(os, "pwrite"):
        view = memoryview(data)
        while view:
            count = os.pwrite(fd, view, offset)
            if count <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view, offset = view[count:], offset + count
        return
    position = os.lseek(fd, 0, os.SEEK_CUR)
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        _write_all(fd, data)
    finally:
        os.lseek(fd, position, os.SEEK_SET)


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


def _s3_error(
    exc: ClientError | BotoCoreError, location: str, bucket: str, *, writing: bool
) -> ArchiveError:
    action = "writing" if writing else "reading"
    if isinstance(exc, BotoCoreError):
        return ArchiveError(
            f"cannot reach S3 {action} archive {location}: {_one_line(str(exc))}; "
            "check AWS credentials, region, endpoint and network"
        )
    code = error_code(exc)
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
    if code in ACCESS_CODES:
        needed = "s3:PutObject" if writing else "s3:ListBucket and s3:GetObject"
        return ArchiveError(
            f"access denied {action} archive {location}; grant {needed} on it "
            "or choose another archive location"
        )
    if code in CREDENTIAL_CODES:
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
