"""Amazon SQS, one backend of the broker seam (:mod:`redrive.broker.base`)."""

from __future__ import annotations

from redrive.aws.session import AwsSettings
from redrive.broker.sqs.broker import SqsBroker
from redrive.broker.sqs.calls import SqsCalls, delivery_of, message
from redrive.config import SqsClient
from redrive.errors import RedriveError

__all__ = ["SqsBroker", "SqsCalls", "delivery_of", "message", "open_sqs"]


def open_sqs(
    settings: AwsSettings, *, region: str | None = None, client: SqsClient = "botocore"
) -> SqsBroker:
    """SQS in ``region`` (None: the settings' own), with clients of its own: botocore's, or
    (``client="lean"``) the lean path for the per-message calls (issue 25)."""
    if client == "lean":
        # Imported here: only the runs that ask for the lean path load it. (It is written
        # beside this switch: until it lands, mypy finds no module, and a run that asks for
        # it is refused in one line.)
        try:
            from redrive.broker.sqs.lean import (  # type: ignore[import-not-found,import-untyped,unused-ignore]
                lean_calls,
            )
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.lean":
                raise
            raise RedriveError(
                "the lean SQS client is not in this redrive yet: use --sqs-client botocore"
            ) from None
        lean: SqsBroker = lean_calls(settings, region=region)
        return lean
    # Sends go through a client that never retries by itself: botocore would resend a
    # batch whose response timed out, and that batch may already be in the queue.
    return SqsBroker(
        settings.client("sqs", region=region),
        send_client=settings.client("sqs", region=region, max_attempts=1),
    )
