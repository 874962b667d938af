"""The AWS client's side of the S3 archive: its calls' failures said as the project's own
errors (one line that says what to do).

Only here (and the rest of :mod:`redrive.aws`) is the AWS SDK imported; the archive sees
:class:`~redrive.errors.ArchiveError` and the client's type, :data:`S3Client`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from redrive.aws.errors import ACCESS_CODES, CREDENTIAL_CODES, error_code, one_line
from redrive.errors import ArchiveError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client as S3Client


def s3_errors(location: str, bucket: str, *, writing: bool, denied_ok: bool = False) -> S3Errors:
    """Any failure of the AWS client inside, on archive ``location`` in ``bucket``, as the
    one-line :class:`ArchiveError` of :func:`s3_error`.

    ``denied_ok``: S3's answer that the caller may not do this ends the block quietly
    instead (whatever it was to assign stays unassigned).
    """
    return S3Errors(location, bucket, writing=writing, denied_ok=denied_ok)


class S3Errors:
    """What :func:`s3_errors` returns (a class, not a generator: a type checker must know
    the block may end early)."""

    def __init__(self, location: str, bucket: str, *, writing: bool, denied_ok: bool) -> None:
        self.location = location
        self.bucket = bucket
        self.writing = writing
        self.denied_ok = denied_ok

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if isinstance(exc, ClientError):
            if self.denied_ok and error_code(exc) in ACCESS_CODES:
                return True
        elif not isinstance(exc, BotoCoreError):
            return False
        raise s3_error(exc, self.location, self.bucket, writing=self.writing) from exc


@contextlib.contextmanager
def s3_read_errors(location: str) -> Iterator[None]:
    """The AWS client failing to read an object's body (``location``) mid-stream, as a
    one-line :class:`ArchiveError`."""
    try:
        yield
    except BotoCoreError as exc:
        raise ArchiveError(
            f"reading archive {location} failed: {one_line(str(exc))}; try again"
        ) from exc


@contextlib.contextmanager
def ignore_s3_errors() -> Iterator[None]:
    """Any failure of the AWS client inside ends the block quietly."""
    with contextlib.suppress(ClientError, BotoCoreError):
        yield


def s3_error(
    exc: ClientError | BotoCoreError, location: str, bucket: str, *, writing: bool
) -> ArchiveError:
    """The one-line error saying what to do about the AWS client's ``exc`` from an S3 call
    on archive ``location`` in ``bucket``."""
    action = "writing" if writing else "reading"
    if isinstance(exc, BotoCoreError):
        return ArchiveError(
            f"cannot reach S3 {action} archive {location}: {one_line(str(exc))}; "
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
    message = one_line(str(exc.response.get("Error", {}).get("Message", "")))
    return ArchiveError(
        f"S3 error {action} archive {location}: {code or 'unknown'} {message}".rstrip()
        + "; check the URI, your permissions and try again"
    )
