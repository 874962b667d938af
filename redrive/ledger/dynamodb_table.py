"""The DynamoDB ledger's table: its name, its schema (the key and the two indexes), its
TTL, and making one (``redrive ledger init``) or checking that one is a ledger."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from redrive.aws.dynamodb import client_region, create_table, translated_calls, wait_until_active
from redrive.errors import LedgerError

# Longer than SQS's 14-day maximum retention: a key must outlive every copy of its task.
TTL_SECONDS = 30 * 86_400
TTL_ATTRIBUTE = "expires_at"
KEYS_BY_RUN = "keys_by_run"
RUNS_BY_START = "runs_by_start"

_TABLE_NAME = re.compile(r"[A-Za-z0-9_.-]{3,255}")


def check_table_name(name: str, uri: str | None = None) -> str:
    """``name`` if DynamoDB accepts it as a table name, else a LedgerError."""
    if not name:
        raise LedgerError(f"ledger URI {uri or name!r} names no table; use dynamodb://TABLE")
    if not _TABLE_NAME.fullmatch(name):
        source = f" (in {uri!r})" if uri else ""
        raise LedgerError(
            f"{name!r}{source} is not a DynamoDB table name: 3 to 255 letters, digits, "
            "'_', '-' or '.'"
        )
    return name


def _create_request(table: str) -> dict[str, Any]:
    return {
        "TableName": table,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "run_id", "AttributeType": "S"},
            {"AttributeName": "kind", "AttributeType": "S"},
            {"AttributeName": "started_at", "AttributeType": "N"},
        ],
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": KEYS_BY_RUN,
                "KeySchema": [{"AttributeName": "run_id", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
            {
                "IndexName": RUNS_BY_START,
                "KeySchema": [
                    {"AttributeName": "kind", "KeyType": "HASH"},
                    {"AttributeName": "started_at", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
        ],
    }


def _key_schema(schema: Iterable[Mapping[str, str]]) -> list[tuple[str, str]]:
    return [(s["AttributeName"], s["KeyType"]) for s in schema]


def _schema_problems(description: Mapping[str, Any]) -> list[str]:
    """What keeps an existing table from being a redrive ledger (empty: nothing)."""
    expected = _create_request("")
    problems: list[str] = []
    if _key_schema(description.get("KeySchema", [])) != _key_schema(expected["KeySchema"]):
        problems.append("its key is not a single string partition key named pk")
    types = {a["AttributeName"]: a["AttributeType"] for a in description["AttributeDefinitions"]}
    if types.get("pk") not in (None, "S"):
        problems.append("pk is not a string")
    have = {
        index["IndexName"]: _key_schema(index["KeySchema"])
        for index in description.get("GlobalSecondaryIndexes", [])
    }
    for index in expected["GlobalSecondaryIndexes"]:
        if have.get(index["IndexName"]) != _key_schema(index["KeySchema"]):
            keys = ", ".join(s["AttributeName"] for s in index["KeySchema"])
            problems.append(f"it lacks the global secondary index {index['IndexName']} ({keys})")
    return problems


def init_table(client: Any, table: str) -> str:
    """Create the ledger table (on-demand billing, the two indexes, TTL on ``expires_at``)
    and wait until it is usable; return one line saying what was done.

    Idempotent: an existing table with the ledger's schema is fine (TTL is switched on if it
    is not); a table with another schema is a LedgerError.
    """
    check_table_name(table)
    region = client_region(client)
    call = translated_calls(client, table, region)
    created = create_table(client, _create_request(table), region)
    wait_until_active(client, table, region)
    problems = _schema_problems(call("DescribeTable", TableName=table)["Table"])
    if problems:
        raise LedgerError(
            f"the DynamoDB table {table} exists but is not a redrive ledger "
            f"({'; '.join(problems)}); choose another table name"
        )
    ttl = call("DescribeTimeToLive", TableName=table).get("TimeToLiveDescription", {})
    if ttl_needs_switching_on(table, ttl):
        call(
            "UpdateTimeToLive",
            TableName=table,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
        )
    days = TTL_SECONDS // 86_400
    if created:
        return (
            f"created the DynamoDB ledger table {table} (on-demand billing; an entry expires "
            f"{days} days after its last change)"
        )
    return f"the DynamoDB ledger table {table} is ready (entries expire {days} days after use)"


def ttl_needs_switching_on(table: str, ttl: Mapping[str, Any]) -> bool:
    """Whether a ledger table whose TTL is described by ``ttl`` (DescribeTimeToLive's
    TimeToLiveDescription) needs TTL switched on; a LedgerError when it expires items by
    another attribute (not ours) or TTL is being switched off."""
    status, attribute = ttl.get("TimeToLiveStatus", "DISABLED"), ttl.get("AttributeName")
    if status in ("ENABLED", "ENABLING") and attribute not in (None, TTL_ATTRIBUTE):
        raise LedgerError(
            f"the DynamoDB table {table} expires items by {attribute!r}, not by "
            f"{TTL_ATTRIBUTE!r}; choose another table name for the ledger"
        )
    if status == "DISABLING":
        raise LedgerError(
            f"TTL of the DynamoDB table {table} is being switched off; wait an hour, then "
            "run `redrive ledger init` again"
        )
    return bool(status == "DISABLED")


def check_ledger_table(table: str, description: Mapping[str, Any]) -> None:
    """A LedgerError unless ``description`` (DescribeTable's) is of a usable ledger table."""
    status = description.get("TableStatus", "ACTIVE")
    if status in ("CREATING", "DELETING", "ARCHIVING", "ARCHIVED"):
        raise LedgerError(
            f"the DynamoDB ledger table {table} is {status.lower()}; wait for it "
            f"(`redrive ledger init dynamodb://{table}` waits until it is ready)"
        )
    problems = _schema_problems(description)
    if problems:
        raise LedgerError(
            f"the DynamoDB table {table} is not a redrive ledger "
            f"({'; '.join(problems)}); create one with `redrive ledger init "
            "dynamodb://NEW-TABLE`"
        )
