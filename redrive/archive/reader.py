"""Reading archives: streaming their records, and telling damage from a writer killed
mid-batch (:class:`ArchiveReader`)."""

from __future__ import annotations

import itertools
import json
import os
import re
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from redrive.archive.format import (
    FEXTRA,
    GZIP_MAGIC,
    GZIP_WBITS,
    MEMBER_MAGIC,
    Header,
    MemberInfo,
    parse_field,
)
from redrive.archive.record import ArchiveRecord, NewerFormat
from redrive.archive.storage import (
    archive_part,
    archive_parts,
    local_error,
    parse_s3_uri,
    reject_other_schemes,
)
from redrive.aws.errors import one_line
from redrive.aws.s3 import s3_errors, s3_read_errors
from redrive.errors import ArchiveError

if TYPE_CHECKING:
    from redrive.aws.s3 import S3Client

_READ_CHUNK: Final = 1 << 16
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

    @property
    def not_an_archive(self) -> bool:
        """Nothing in it reads as an archive from its very first byte on: a file of another
        kind (not gzip, not JSON Lines), not a damaged archive."""
        first = self.first
        return (
            self.readable == 0
            and first.records_read == 0
            and first.offset in (None, 0)
            and first.line in (None, 1)
            and first.member in (None, 1)
        )

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
            # As every capped list in the JSON says how much of it is there.
            "places_listed": len(self.places),
            "places_truncated": self.count > len(self.places),
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
    header: Header | None = None
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
        reject_other_schemes(self.source)
        path = os.path.expanduser(self.source)
        # The name given to a --processes purge stands for the parts it wrote beside it, and
        # an archive a rerun continued (an edited move's) for itself and its new parts: read
        # one after another, each checked as the file it is, as one archive.
        paths = ([path] if os.path.lexists(path) else []) + archive_parts(path)
        if not paths:
            raise ArchiveError(
                f"no archive at {path}, nor the parts a --processes run writes beside it "
                f"({os.path.basename(archive_part(path, 1))}, ...); check the path"
            )
        for part in paths:
            self._end_segment()
            yield from self._read_one_file(part)

    def _read_one_file(self, path: str) -> Iterator[ArchiveRecord]:
        try:
            stream = open(path, "rb")  # noqa: SIM115 - closed by the with below, across yields
        except FileNotFoundError:
            raise ArchiveError(f"no archive at {path}; check the path") from None
        except OSError as exc:
            raise local_error(exc, path, writing=False) from exc
        # Numbered members start at 1: a first one numbered later is the start gone missing.
        self._segment = _Segment(key=path, next_seq=1)
        with stream:
            yield from self._read_stream(_iter_chunks(stream.read, path), path, whole=False)

    def _read_s3(self, client: S3Client) -> Iterator[ArchiveRecord]:
        bucket, key = parse_s3_uri(self.source)
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
            with s3_errors(where, bucket, writing=False):
                body = client.get_object(Bucket=bucket, Key=object_key)["Body"]
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
            if len(head) >= len(GZIP_MAGIC):
                break
        rest = itertools.chain([head], chunks)
        if not head and where.endswith(".gz"):
            # Every .gz archive starts with its header member: none at all is damage (a file
            # truncated to nothing, or not redrive's), never an archive of nothing.
            self._damage(where, "it is empty (0 bytes): not even the header a .jsonl.gz holds")
            return
        if not head.startswith(GZIP_MAGIC):
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
        if isinstance(info, Header):
            # A header starts what one writer wrote (files may be concatenated).
            self._end_segment()
            segment = self._segment = _Segment(key=segment.key, header=info, next_seq=1)
        elif isinstance(info, MemberInfo):
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

    def _check_seq(self, segment: _Segment, info: MemberInfo, member: _Member, where: str) -> None:
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
        lost = fault.info.records if isinstance(fault.info, MemberInfo) else None
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

    def _unfinished_batch(self, where: str, fault: _Fault, header: Header | None) -> str:
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
        except NewerFormat as exc:
            raise ArchiveError(f"archive {where} line {self._lineno}: {exc}") from None
        except (ArchiveError, ValueError, RecursionError) as exc:
            reason = one_line(str(exc))
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


def _promise(header: Header | None, *, s3: bool = False) -> str:
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
    with s3_errors(source, bucket, writing=False):
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys.extend(
                obj["Key"]
                for obj in page.get("Contents", [])
                if obj["Key"].endswith((".jsonl", ".jsonl.gz"))
            )
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
        # A failure that is an OSError too (the AWS client's read timeouts are) is said as
        # the local one it also is.
        with s3_read_errors(where):
            try:
                chunk = read(_READ_CHUNK)
            except OSError as exc:
                raise local_error(exc, where, writing=False) from exc
        if not chunk:
            return
        yield chunk


@dataclass(slots=True)
class _Member:
    index: int
    offset: int
    end: int
    payload: bytes
    info: Header | MemberInfo | None
    field_error: str | None
    after_damage: bool


@dataclass(slots=True)
class _Fault:
    kind: str
    """"corrupt" (fails to decode), "unfinished" (the stream ends inside it), "garbage"."""
    index: int
    offset: int
    detail: str = ""
    info: Header | MemberInfo | None = None


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
            while len(self._buf) < len(MEMBER_MAGIC) and self._fill():
                pass
            offset = self._base
            if not self._buf.startswith(MEMBER_MAGIC):
                if not resyncing:
                    cut = self._exhausted and MEMBER_MAGIC.startswith(bytes(self._buf))
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
        decompressor = zlib.decompressobj(GZIP_WBITS)
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

    def _field(self) -> tuple[Header | MemberInfo | None, str | None]:
        head = bytes(self._buf[:12])
        if len(head) == 12 and head[3] & FEXTRA:
            head = bytes(self._buf[: 12 + int.from_bytes(head[10:12], "little")])
        try:
            return parse_field(head), None
        except ValueError as exc:
            return None, str(exc)

    def _skip_to_magic(self) -> None:
        """Drop the buffer's first byte and everything up to the next gzip magic."""
        self._drop(1)
        while True:
            found = self._buf.find(MEMBER_MAGIC)
            if found != -1:
                self._drop(found)
                return
            self._drop(max(0, len(self._buf) - (len(MEMBER_MAGIC) - 1)))
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
