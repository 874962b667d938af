"""One translation of AWS errors, for SQS, S3, DynamoDB and STS alike.

Every AWS error that reaches the user goes through :func:`aws_errors` (or, where a caller
words its own message, through the code sets here), which turns botocore's exceptions into
one-line :class:`~redrive.errors.RedriveError` messages that say what to do.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Final

import botocore.exceptions

from redrive.errors import AwsError, AwsUnavailable, QueueNotFound

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
    on = f" on {resource}" if resource else ""
    try:
        yield
    except botocore.exceptions.NoCredentialsError as exc:
        raise AwsUnavailable(
            "no AWS credentials found: set AWS_PROFILE (or pass --profile), or "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; for the local sandbox use the "
            "lines `redrive sandbox` prints"
        ) from exc
    except botocore.exceptions.ProfileNotFound as exc:
        raise AwsUnavailable(f"{exc}: check --profile / AWS_PROFILE and ~/.aws/config") from exc
    except botocore.exceptions.NoRegionError as exc:
        raise AwsUnavailable("no AWS region: pass --region or set AWS_REGION") from exc
    except botocore.exceptions.InvalidRegionError as exc:
        # Not AwsUnavailable: a typo in one family's region must not hide the other families.
        raise AwsError(
            f"{str(exc).rstrip('.')}: check --region / AWS_REGION and the config's regions"
        ) from exc
    except (
        botocore.exceptions.EndpointConnectionError,
        botocore.exceptions.ConnectTimeoutError,
        botocore.exceptions.ReadTimeoutError,
        botocore.exceptions.ConnectionClosedError,
    ) as exc:
        endpoint = getattr(exc, "kwargs", {}).get("endpoint_url", "") or "the endpoint"
        raise AwsUnavailable(
            f"cannot reach {service.upper()} at {endpoint} ({type(exc).__name__}): check "
            "--endpoint-url / AWS_ENDPOINT_URL and your network (is the sandbox running?)"
        ) from exc
    except botocore.exceptions.ParamValidationError as exc:
        raise AwsError(f"{action}{on}: invalid request: {one_line(str(exc))}") from exc
    except botocore.exceptions.ClientError as exc:
        code = error_code(exc)
        message = str(exc.response.get("Error", {}).get("Message", "")) or code
        foreign = _not_an_aws_error(exc)
        if foreign is not None:
            raise AwsError(
                f"{action}{on} failed: {foreign}; it may not implement {action}: check "
                "--endpoint-url / AWS_ENDPOINT_URL (and any proxy in between)"
            ) from exc
        if code in QUEUE_NOT_FOUND_CODES:
            raise QueueNotFound(
                f"queue {resource or ''} does not exist: check the name, --region "
                "and the account (`redrive status` lists the configured families)"
            ) from exc
        if code in ACCESS_CODES:
            iam = IAM_ACTION.get(action, action)
            raise AwsError(
                f"access denied: the caller may not {service}:{iam}{on}; grant that IAM "
                "action or use another --profile"
            ) from exc
        if code in CREDENTIAL_CODES:
            raise AwsUnavailable(
                f"AWS rejected the credentials ({code}): refresh them (e.g. `aws sso login`) "
                "or check AWS_PROFILE / AWS_ACCESS_KEY_ID"
            ) from exc
        if code in THROTTLE_CODES:
            raise AwsError(
                f"{service.upper()} kept throttling {action}{on} after retries: wait a minute "
                "and rerun, with fewer --workers or a lower --rate"
            ) from exc
        raise AwsError(f"{action}{on} failed: {code}: {one_line(message)}") from exc
    except botocore.exceptions.BotoCoreError as exc:
        raise AwsError(f"{action}{on} failed: {one_line(str(exc))}") from exc


_MARKUP = re.compile(r"<\s*(?:!doctype|html|head|body|title|h1)\b", re.IGNORECASE)
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]*>")


def _not_an_aws_error(exc: botocore.exceptions.ClientError) -> str | None:
    """What an error answer no AWS service wrote was (an HTML page from a proxy, a load
    balancer or a server without the action; a bare status), or None for an AWS error.

    botocore names the HTTP status as the code of an answer it cannot parse, and keeps
    the whole body as the message: the page itself must not reach the user.
    """
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    message = str(error.get("Message", ""))
    markup = _MARKUP.search(message) is not None
    if not markup and not code.isdigit():
        return None
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or code
    if markup:
        title = _TITLE.search(message)
        text = one_line(_TAG.sub(" ", title.group(1) if title else ""))
        what = f" with an HTML page ({text[:80]})" if text else " with an HTML page"
    else:
        # The body, or botocore's reason phrase when there was none.
        text = one_line(message) if message != code else ""
        what = f" ({text[:80]})" if text else ""
    return f"the endpoint answered HTTP {status}{what}, not an AWS error"


def one_line(text: str) -> str:
    # The CLI promises one-line errors; AWS and botocore messages may span several lines.
    return " ".join(text.split())
