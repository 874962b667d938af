"""Amazon SQS, one backend of the broker seam (:mod:`redrive.broker.base`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from redrive.aws.session import AwsSettings
from redrive.broker.sqs.broker import SqsBroker
from redrive.broker.sqs.calls import SqsCalls, delivery_of, message
from redrive.config import SqsClient

if TYPE_CHECKING:
    from redrive.broker import BrokerSettings

__all__ = ["SqsBroker", "SqsCalls", "delivery_of", "message", "open_from_settings", "open_sqs"]


def open_from_settings(
    settings: BrokerSettings, aws: AwsSettings, region: str | None = None
) -> SqsBroker:
    """SQS as the run's broker settings say (its row in :data:`redrive.broker.BACKENDS`)."""
    return open_sqs(aws, region=region, client=settings.sqs_client)


def open_sqs(
    settings: AwsSettings, *, region: str | None = None, client: SqsClient = "botocore"
) -> SqsBroker:
    """SQS in ``region`` (None: the settings' own), with clients of its own: botocore's, or
    (``client="lean"``) the lean path for the per-message calls (issue 25)."""
    if client == "lean":
        # Imported here: only the runs that ask for the lean path load it.
        from redrive.broker.sqs.lean import lean_calls

        lean: SqsBroker = lean_calls(settings, region=region)
        return lean
    # Sends go through a client that never retries by itself: botocore would resend a
    # batch whose response timed out, and that batch may already be in the queue.
    return SqsBroker(
        settings.client("sqs", region=region),
        send_client=settings.client("sqs", region=region, max_attempts=1),
    )
