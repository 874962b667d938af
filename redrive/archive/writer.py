"""Writing archives: a new local file (0600, fsynced per batch) or S3 part objects."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Protocol, Self

from redrive.archive.format import gzip_member_pieces, header_member
from redrive.archive.record import ArchiveRecord, chunked, encode_lines
from redrive.archive.storage import local_error, parse_s3_uri, reject_other_schemes
from redrive.aws.s3 import ignore_s3_errors, s3_errors
from redrive.errors import ArchiveError

if TYPE_CHECKING:
    from redrive.aws.s3 import S3Client

_WRITE_CHUNK: Final = 1 << 20


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
            raise local_error(exc, path) from exc
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
                raise local_error(exc, path) from exc
            raise

    def write_batch(self, records: Sequence[ArchiveRecord]) -> None:
        self._check_usable()
        if not records:
            return
        written = members = 0
        try:
            for chunk in chunked(records, self._chunk_records):
                # Encoding before any I/O: an unencodable record fails the batch cleanly.
                lines = encode_lines(chunk)
                if self._gzip:
                    members += 1
                    written += self._write_pieces(
                        gzip_member_pieces(lines, seq=self._members + members)
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
                raise local_error(exc, self.location) from exc
            raise
        self._good_size += written
        self._members += members
        self._records += len(records)

    def _header(self, *, closed: bool) -> bytes:
        return header_member(closed=closed, records=self._records, members=self._members)

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
        listing: Mapping[str, object] | None = None
        # Write-only credentials (PutObject without ListBucket) are a sane setup for an
        # archive bucket; the first put will tell if writing is denied too.
        with s3_errors(self.location, self._bucket, writing=True, denied_ok=True):
            listing = self._client.list_objects_v2(
                Bucket=self._bucket, Prefix=self._run_prefix, MaxKeys=1
            )
        if listing is None:
            return
        if listing.get("KeyCount", 0) or listing.get("Contents"):
            raise ArchiveError(
                f"archive {self.location} already has objects; refusing to mix runs, "
                "choose another run name or prefix"
            )

    def write_batch(self, records: Sequence[ArchiveRecord]) -> None:
        self._check_usable()
        for chunk in chunked(records, self._chunk_records):
            body = b"".join(gzip_member_pieces(encode_lines(chunk), seq=self._part + 1))
            where = f"s3://{self._bucket}/{self._part_key(self._part + 1)}"
            try:
                with s3_errors(where, self._bucket, writing=True):
                    self._put(self._part + 1, body)
            except ArchiveError:
                self._broken = True
                raise
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
        header = header_member(closed=True, records=self._records, members=self._part)
        # Unsealed, the run reads as one whose writer was stopped: readable, checked less.
        with ignore_s3_errors():
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
        bucket, prefix = parse_s3_uri(destination)
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
    reject_other_schemes(destination)
    return LocalArchiveWriter(os.path.expanduser(destination), chunk_records=chunk_records)


def default_archive_path(family: str, now: datetime) -> str:
    """``./redrive-archive/{family}-{YYYYMMDDTHHMMSSZ}.jsonl.gz`` for an aware ``now``."""
    if now.utcoffset() is None:
        raise ValueError("default_archive_path needs a timezone-aware datetime")
    # A family name is config text, not a path: keep it from adding directories.
    safe_family = re.sub(r"[^A-Za-z0-9._-]", "_", family) or "archive"
    return f"./redrive-archive/{safe_family}-{now.astimezone(UTC):%Y%m%dT%H%M%SZ}.jsonl.gz"


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
