"""The AWS client's side of the DynamoDB ledger: its calls' failures said as the project's
own errors (one line that says what to do), and what a client says about itself.

Only here (and the rest of :mod:`redrive.aws`) is the AWS SDK imported; the ledger sees
:class:`ConditionFailed`, :class:`TransactionConflict` and LedgerError.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import botocore.exceptions

from redrive.aws.errors import ACCESS_CODES, IAM_ACTION, aws_errors, error_code
from redrive.errors import AwsError, LedgerError

# A client's connection pool when its configuration does not say (botocore's default).
_DEFAULT_POOL_CONNECTIONS = 10


class ConditionFailed(Exception):
    """A conditional write whose condition did not hold (nothing was written).

    ``item`` is the item as it stood, when DynamoDB returned it (ALL_OLD on a single write).
    """

    def __init__(self, item: dict[str, Any] | None) -> None:
        super().__init__("the condition did not hold")
        self.item = item


class TransactionConflict(Exception):
    """Another transaction held an item of the call, so it was not applied: try again."""


def operation(client: Any, action: str) -> Callable[..., Any]:
    """The client's method for the API action ``action`` (PutItem: put_item)."""
    method: Callable[..., Any] = getattr(client, re.sub(r"(?<!^)(?=[A-Z])", "_", action).lower())
    return method


def client_region(client: Any) -> str | None:
    region: str | None = getattr(getattr(client, "meta", None), "region_name", None)
    return region


def pool_connections(client: Any) -> int:
    """The size of the client's HTTP connection pool (the SDK's default when unknown)."""
    config = getattr(getattr(client, "meta", None), "config", None)
    connections = getattr(config, "max_pool_connections", None)
    if isinstance(connections, int) and connections > 0:
        return connections
    return _DEFAULT_POOL_CONNECTIONS


def ledger_error(exc: Exception, action: str, table: str, region: str | None) -> LedgerError:
    """One line that says what to do, for any failure of the AWS client in a ledger call."""
    if isinstance(exc, botocore.exceptions.ClientError):
        code = error_code(exc)
        if code == "ResourceNotFoundException":
            where = f" in region {region}" if region else ""
            return LedgerError(
                f"the DynamoDB ledger table {table} does not exist{where}: create it with "
                f"`redrive ledger init dynamodb://{table}` (or check --region / AWS_REGION)"
            )
        if code in ACCESS_CODES:
            iam = IAM_ACTION.get(action, action)
            return LedgerError(
                f"access denied: the caller may not dynamodb:{iam} on the ledger table "
                f"{table}; grant that IAM action or use another --profile"
            )
    try:
        with aws_errors(action, resource=f"ledger table {table}", service="dynamodb"):
            raise exc
    except AwsError as err:
        return LedgerError(str(err))
    except Exception:  # not an AWS client error: say what it was, on one line
        pass
    return LedgerError(f"{action} on ledger table {table} failed: {' '.join(str(exc).split())}")


@contextlib.contextmanager
def ledger_errors(action: str, table: str, region: str | None) -> Iterator[None]:
    """Any failure of the AWS client inside, as a one-line LedgerError."""
    try:
        yield
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
        raise ledger_error(exc, action, table, region) from exc


@contextlib.contextmanager
def write_errors(
    action: str, table: str, region: str | None, *, last_attempt: bool
) -> Iterator[None]:
    """The failures of one attempt at a (conditional) ledger call: a condition that did not
    hold is :class:`ConditionFailed`; losing to another transaction is
    :class:`TransactionConflict` while attempts remain (a cancelled transaction's lasting
    conflicts end as ConditionFailed: the caller reads back if it cares); any other failure
    a one-line LedgerError."""
    try:
        yield
    except botocore.exceptions.ClientError as exc:
        code = error_code(exc)
        if code == "ConditionalCheckFailedException":
            old: dict[str, Any] | None = exc.response.get("Item")  # type: ignore[assignment]
            raise ConditionFailed(old) from None
        conflict = code == "TransactionConflictException"
        if code == "TransactionCanceledException":
            reasons = {
                str(r.get("Code") or "None") for r in exc.response.get("CancellationReasons", [])
            }
            if "ConditionalCheckFailed" in reasons:
                raise ConditionFailed(None) from None
            conflict = reasons <= {"None", "TransactionConflict"}
            if conflict and last_attempt:
                # Lost to concurrent writers on the same items every time: the same
                # answer as a refused condition (the caller reads back if it cares).
                raise ConditionFailed(None) from None
        if not conflict or last_attempt:
            raise ledger_error(exc, action, table, region) from exc
        raise TransactionConflict(code) from None
    except botocore.exceptions.BotoCoreError as exc:
        raise ledger_error(exc, action, table, region) from exc


def translated_calls(client: Any, table: str, region: str | None) -> Callable[..., Any]:
    """Calls of the client by API action name, their errors translated."""

    def call(action: str, **kwargs: Any) -> Any:
        with ledger_errors(action, table, region):
            return operation(client, action)(**kwargs)

    return call


def create_table(client: Any, request: Mapping[str, Any], region: str | None) -> bool:
    """CreateTable with ``request``; False when the table exists already (or is being made)."""
    table = str(request["TableName"])
    try:
        client.create_table(**request)
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) != "ResourceInUseException":
            raise ledger_error(exc, "CreateTable", table, region) from exc
        return False
    except botocore.exceptions.BotoCoreError as exc:
        raise ledger_error(exc, "CreateTable", table, region) from exc
    return True


def wait_until_active(client: Any, table: str, region: str | None) -> None:
    """Wait (up to 5 minutes) until ``table`` exists and is ACTIVE."""
    try:
        client.get_waiter("table_exists").wait(
            TableName=table, WaiterConfig={"Delay": 2, "MaxAttempts": 150}
        )
    except botocore.exceptions.WaiterError as exc:
        cause = getattr(exc, "last_response", {}) or {}
        if "Error" in cause:
            # Raises the real error, translated.
            translated_calls(client, table, region)("DescribeTable", TableName=table)
        raise LedgerError(
            f"the DynamoDB table {table} did not become ACTIVE within 5 minutes; "
            "check it in the console, then run `redrive ledger init` again"
        ) from exc
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
        raise ledger_error(exc, "DescribeTable", table, region) from exc
