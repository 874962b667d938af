"""The gzip members of an archive and redrive's field in their headers (see
:mod:`redrive.archive`: "Redrive's gzip field")."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

GZIP_MAGIC: Final = b"\x1f\x8b"
# zlib's default level: level 9 costs several times the CPU for a few percent on JSON.
_GZIP_LEVEL: Final = 6
# wbits=31 makes zlib produce/consume a complete gzip member (header, deflate, CRC32 trailer).
GZIP_WBITS: Final = 31

# Every gzip reader skips a header's extra field (RFC 1952 FEXTRA), so these fields cost old
# readers, zcat and gzip nothing.  Each ends in a CRC32 of itself: the header is rewritten in
# place on close, and the member CRC covers only the data.
FEXTRA: Final = 0x04
_EXTRA_ID: Final = b"RD"
_FIELD_VERSION: Final = 1
_HEADER_FIELDS: Final = struct.Struct(">cBBQQ")  # b"H", version, closed, records, members
_MEMBER_FIELDS: Final = struct.Struct(">cBQI")  # b"M", version, seq, records
MEMBER_MAGIC: Final = b"\x1f\x8b\x08"


@dataclass(frozen=True, slots=True)
class Header:
    """The empty first member of an archive: closed, with its totals, once its writer closed."""

    closed: bool
    records: int
    members: int


@dataclass(frozen=True, slots=True)
class MemberInfo:
    seq: int
    records: int


def _member_head(fields: bytes) -> bytes:
    data = fields + struct.pack(">I", zlib.crc32(fields))
    extra = _EXTRA_ID + struct.pack("<H", len(data)) + data
    # Deflate, FEXTRA only, MTIME 0 (the record has its own times), XFL 0, OS unknown.
    return (
        GZIP_MAGIC + bytes([8, FEXTRA, 0, 0, 0, 0, 0, 255]) + struct.pack("<H", len(extra)) + extra
    )


def gzip_member_pieces(lines: Sequence[bytes], *, seq: int) -> Iterator[bytes]:
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


def header_member(*, closed: bool, records: int, members: int) -> bytes:
    """The fixed-size first member: rewriting it on close changes no other byte."""
    fields = _HEADER_FIELDS.pack(b"H", _FIELD_VERSION, int(closed), records, members)
    empty = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS).flush()
    return _member_head(fields) + empty + struct.pack("<II", 0, 0)


def parse_field(head: bytes | bytearray) -> Header | MemberInfo | None:
    """redrive's field in the gzip header that starts ``head``; None when it has none (an
    archive from before it, or another tool's gzip).  Raises ValueError when it is corrupt."""
    if len(head) < 12 or not head[3] & FEXTRA:
        return None
    extra = bytes(head[12 : 12 + int.from_bytes(head[10:12], "little")])
    at = 0
    while at + 4 <= len(extra):
        size = int.from_bytes(extra[at + 2 : at + 4], "little")
        if extra[at : at + 2] == _EXTRA_ID:
            return _decode_field(extra[at + 4 : at + 4 + size])
        at += 4 + size
    return None


def _decode_field(data: bytes) -> Header | MemberInfo | None:
    fields, check = data[:-4], data[-4:]
    if len(data) < 6 or zlib.crc32(fields) != int.from_bytes(check, "big"):
        raise ValueError("redrive's field in its gzip header fails its CRC")
    if fields[1] != _FIELD_VERSION:
        return None  # a later writer's field: its records are still read and checked
    if fields[:1] == b"H" and len(fields) == _HEADER_FIELDS.size:
        _, _, closed, records, members = _HEADER_FIELDS.unpack(fields)
        return Header(closed=bool(closed), records=records, members=members)
    if fields[:1] == b"M" and len(fields) == _MEMBER_FIELDS.size:
        _, _, seq, records = _MEMBER_FIELDS.unpack(fields)
        return MemberInfo(seq=seq, records=records)
    return None
