"""Where archives live (a local path, or an ``s3://bucket/prefix``) and what their errors
mean, in one line that says what to do."""

from __future__ import annotations

import errno
import os
import re

from redrive.aws.errors import one_line
from redrive.errors import ArchiveError


def parse_s3_uri(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise ArchiveError(f"archive URI {uri} has no bucket; use s3://bucket/prefix")
    return bucket, key


_SUFFIXES = (".jsonl.gz", ".jsonl")


def _stem_and_suffix(location: str) -> tuple[str, str]:
    for suffix in _SUFFIXES:
        if location.endswith(suffix):
            return location.removesuffix(suffix), suffix
    return location, ""


def archive_part(location: str, number: int) -> str:
    """Process ``number``'s own archive of a ``--processes`` run: beside the one named
    (``X.jsonl.gz`` -> ``X.pN.jsonl.gz``). An S3 prefix is every process's: each writes a
    run folder of its own under it."""
    if location.startswith("s3://"):
        return location
    stem, suffix = _stem_and_suffix(location)
    return f"{stem}.p{number}{suffix}"


def archive_parts(path: str) -> list[str]:
    """The parts a ``--processes`` run wrote beside the local archive ``path`` (what
    :func:`archive_part` names), in process order; none if it wrote none."""
    directory, name = os.path.split(path)
    stem, suffix = _stem_and_suffix(name)
    part = re.compile(rf"{re.escape(stem)}\.p([1-9][0-9]*){re.escape(suffix)}")
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return []
    numbered = sorted((int(m.group(1)), n) for n in names if (m := part.fullmatch(n)) is not None)
    return [os.path.join(directory, n) for _, n in numbered]


def free_part(path: str) -> str:
    """The next part beside the local archive ``path`` that nothing holds yet: one past
    the highest part there (a rerun continuing an archive adds to it, never overwrites)."""
    taken = [int(m.group(1)) for p in archive_parts(path) if (m := _PART.search(p))]
    return archive_part(path, max(taken, default=0) + 1)


_PART = re.compile(r"\.p([1-9][0-9]*)(?:\.jsonl\.gz|\.jsonl)?$")


def absolute_location(location: str | None) -> str | None:
    """A local archive path made absolute; an ``s3://`` URI (or None) as it is."""
    if location is None or "://" in location:
        return location
    return os.path.abspath(os.path.expanduser(location))


def reject_other_schemes(location: str) -> None:
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", location):
        raise ArchiveError(
            f"archive location {location} uses an unsupported scheme; "
            "use a local path or s3://bucket/prefix"
        )


def local_error(exc: OSError, location: str, *, writing: bool = True) -> ArchiveError:
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
    reason = one_line(exc.strerror or str(exc))
    return ArchiveError(
        f"{action} archive {location} failed: {reason}; check the path and the disk"
    )


def archive_label(source: str) -> str:
    """An archive's name in a report: its last path part (the whole location if none)."""
    return source.rstrip("/").rsplit("/", 1)[-1] or source
