"""One translation of AWS errors, for SQS, S3, DynamoDB and STS alike.

Every AWS error that reaches the user goes through :func:`aws_errors` (or, where a caller
words its own message, through the code sets here), which turns botocore's exceptions into
one-line :class:`~redrive.errors.RedriveError` messages that say what to do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final

import botocore.exceptions

from redrive.aws.answers import ENDPOINT_KEY, ForeignAnswer, page_title
from redrive.errors import AwsError, AwsUnavailable, ForeignEndpoint, QueueNotFound, RedriveError

CHECK_ENDPOINT: Final = "check --endpoint-url / AWS_ENDPOINT_URL (and any proxy in between)"
# Answered by a proxy or load balancer in front of the service, not by a call it lacks.
GATEWAY_STATUSES: Final = frozenset({502, 503, 504})

# SQS's answers for a queue that does not exist (S3 and DynamoDB name theirs per resource).
QUEUE_NOT_FOUND_CODES: Final = frozenset(
    {
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
        "NonExistentQueue",
    }
)
# The caller may not do this: IAM (SQS, DynamoDB, STS), EC2-style APIs, and S3, which also
# answers a bare 403 (a HEAD has no body) and names a disabled or suspended account.
ACCESS_CODES: Final = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "AuthorizationError",
        "UnauthorizedOperation",
        "Forbidden",
        "403",
        "AllAccessDisabled",
        "AccountProblem",
    }
)
# The credentials themselves were refused (S3 words some of these its own way).
CREDENTIAL_CODES: Final = frozenset(
    {
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidAccessKeyId",
        "MissingAuthenticationToken",
        "InvalidToken",
        "TokenRefreshRequired",
    }
)
THROTTLE_CODES: Final = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "SlowDown",
        "AWS.SimpleQueueService.RequestThrottled",
    }
)
# IAM names the permission after the single-message action for batch calls, and authorises
# each item of a DynamoDB transaction by its own action.
IAM_ACTION: Final = {
    "SendMessageBatch": "SendMessage",
    "DeleteMessageBatch": "DeleteMessage",
    "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
    "TransactWriteItems": "ConditionCheckItem and dynamodb:UpdateItem",
}


def is_throttle(exc: BaseException) -> bool:
    if isinstance(exc, botocore.exceptions.ClientError):
        return error_code(exc) in THROTTLE_CODES
    return False


def error_code(exc: botocore.exceptions.ClientError) -> str:
    """The error code AWS (or botocore, for an answer it could not parse) gave."""
    return str(exc.response.get("Error", {}).get("Code", ""))


@contextlib.contextmanager
def aws_errors(action: str, *, resource: str | None = None, service: str = "sqs") -> Iterator[None]:
    """Turn botocore's exceptions into one-line errors that say what to do."""
    try:
        yield
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise aws_error(exc, action, resource=resource, service=service) from exc


def aws_error(
    exc: botocore.exceptions.BotoCoreError | botocore.exceptions.ClientError,
    action: str,
    *,
    resource: str | None = None,
    service: str = "sqs",
) -> RedriveError:
    """The one-line error saying what to do about botocore's ``exc`` from ``action``."""
    if isinstance(exc, botocore.exceptions.ClientError):
        return _answer_error(exc, action, resource=resource, service=service)
    on = f" on {resource}" if resource else ""
    if isinstance(exc, ForeignAnswer):
        return ForeignEndpoint(f"{action}{on} failed: {exc}: {CHECK_ENDPOINT}")
    setup = _setup_error(exc, service)
    if setup is not None:
        return setup
    if isinstance(exc, botocore.exceptions.ParamValidationError):
        return AwsError(f"{action}{on}: invalid request: {one_line(str(exc))}")
    return AwsError(f"{action}{on} failed: {one_line(str(exc))}")


_CONNECTION_ERRORS: Final = (
    botocore.exceptions.EndpointConnectionError,
    botocore.exceptions.ConnectTimeoutError,
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectionClosedError,
)


def _setup_error(exc: botocore.exceptions.BotoCoreError, service: str) -> AwsError | None:
    """What is wrong with the credentials, profile, region or endpoint, if that is it."""
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return AwsUnavailable(
            "no AWS credentials found: set AWS_PROFILE (or pass --profile), or "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; for the local sandbox use the "
            "lines `redrive sandbox` prints"
        )
    if isinstance(exc, botocore.exceptions.ProfileNotFound):
        return AwsUnavailable(f"{exc}: check --profile / AWS_PROFILE and ~/.aws/config")
    if isinstance(exc, botocore.exceptions.NoRegionError):
        # No broker was named, so redrive took SQS: the user may have meant RabbitMQ.
        return AwsUnavailable(
            "no AWS region: for SQS (the broker when none is named) pass --region or set "
            "AWS_REGION; for RabbitMQ name it: --broker amqp://USER:PASS@HOST:5672/VHOST "
            "(or REDRIVE_BROKER, or [broker] url in the config)"
        )
    if isinstance(exc, botocore.exceptions.InvalidRegionError):
        # Not AwsUnavailable: a typo in one family's region must not hide the other families.
        return AwsError(
            f"{str(exc).rstrip('.')}: check --region / AWS_REGION and the config's regions"
        )
    if isinstance(exc, _CONNECTION_ERRORS):
        endpoint = getattr(exc, "kwargs", {}).get("endpoint_url", "") or "the endpoint"
        return AwsUnavailable(
            f"cannot reach {service.upper()} at {endpoint} ({type(exc).__name__}): check "
            "--endpoint-url / AWS_ENDPOINT_URL and your network (is the sandbox running?)"
        )
    return None


def _answer_error(
    exc: botocore.exceptions.ClientError, action: str, *, resource: str | None, service: str
) -> RedriveError:
    """The error for an answer AWS (or something in its place) gave."""
    on = f" on {resource}" if resource else ""
    code = error_code(exc)
    foreign = not_an_aws_error(exc)
    if foreign is not None:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status in GATEWAY_STATUSES:
            # A proxy or load balancer's own page: no call gets through it now.
            return ForeignEndpoint(f"{action}{on} failed: {foreign}: {CHECK_ENDPOINT}")
        return AwsError(
            f"{action}{on} failed: {foreign}; it may not implement {action}: {CHECK_ENDPOINT}"
        )
    if code in QUEUE_NOT_FOUND_CODES:
        return QueueNotFound(
            f"queue {resource or ''} does not exist: check the name, --region "
            "and the account (`redrive status` lists the configured families)"
        )
    if code in ACCESS_CODES:
        return AwsError(
            f"access denied: the caller may not {service}:{IAM_ACTION.get(action, action)}{on}; "
            "grant that IAM action or use another --profile"
        )
    if code in CREDENTIAL_CODES:
        return AwsUnavailable(
            f"AWS rejected the credentials ({code}): refresh them (e.g. `aws sso login`) "
            "or check AWS_PROFILE / AWS_ACCESS_KEY_ID"
        )
    if code in THROTTLE_CODES:
        return AwsError(
            f"{service.upper()} kept throttling {action}{on} after retries: wait a minute "
            "and rerun with fewer --workers (for move and replay, or a lower --rate)"
        )
    message = str(exc.response.get("Error", {}).get("Message", "")) or code
    return AwsError(f"{action}{on} failed: {code}: {one_line(message)}")


def not_an_aws_error(exc: botocore.exceptions.ClientError) -> str | None:
    """What an error answer no AWS service wrote was (an HTML page from a proxy, a load
    balancer or a server without the action; a bare status), or None for an AWS error.

    botocore names the HTTP status as the code of an answer it cannot parse, and keeps
    the whole body as the message: the page itself must not reach the user.
    """
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    message = str(error.get("Message", ""))
    title = page_title(message)
    if title is None and not code.isdigit():
        return None
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or code
    if title is not None:
        what = f" with an HTML page ({title[:80]})" if title else " with an HTML page"
    else:
        # The body, or botocore's reason phrase when there was none.
        text = one_line(message) if message != code else ""
        what = f" ({text[:80]})" if text else ""
    endpoint = exc.response.get(ENDPOINT_KEY)
    named = f" {endpoint}" if endpoint else ""
    return f"the endpoint{named} answered HTTP {status}{what}, not an AWS error"


def one_line(text: str) -> str:
    # The CLI promises one-line errors; AWS and botocore messages may span several lines.
    return " ".join(text.split())
