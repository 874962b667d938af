"""How the DynamoDB ledger stores keys and runs as items (see :mod:`redrive.ledger.dynamodb`
for the layout): DynamoDB's attribute values, the partition keys, and the items read back
as :class:`Entry` and :class:`RunInfo`."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

from redrive.ledger.base import Entry, KeyState, RunInfo

KEY_PREFIX = "key#"
RUN_PREFIX = "run#"
RUN_KIND = "run"

Item = dict[str, Any]


def as_s(value: str) -> dict[str, str]:
    return {"S": value}


def as_n(value: float) -> dict[str, str]:
    if not math.isfinite(value):
        raise ValueError(f"the ledger stores finite times only, got {value!r}")
    # repr round-trips a float exactly; "f" keeps DynamoDB away from exponent notation.
    return {"N": format(Decimal(repr(float(value))), "f")}


def number(item: Item, name: str) -> float:
    return float(item[name]["N"])


def optional_string(item: Item, name: str) -> str | None:
    value = item.get(name)
    return None if value is None else str(value["S"])


def key_pk(key: str) -> dict[str, dict[str, str]]:
    return {"pk": as_s(KEY_PREFIX + key)}


def run_pk(run_id: str) -> dict[str, dict[str, str]]:
    return {"pk": as_s(RUN_PREFIX + run_id)}


def attribute_names(*names: str) -> dict[str, str]:
    # Every attribute goes through a placeholder: "state", "key" and others are reserved words.
    return {f"#{name}": name for name in names}


def entry_of(item: Item) -> Entry:
    return Entry(
        key=item["key"]["S"],
        state=KeyState(item["state"]["S"]),
        run_id=item["run_id"]["S"],
        task=item["task"]["S"],
        message_id=item["message_id"]["S"],
        target=item["target"]["S"],
        sent_message_id=optional_string(item, "sent_message_id"),
        updated_at=number(item, "updated_at"),
        sent_at=number(item, "sent_at") if "sent_at" in item else None,
    )


def run_info_of(item: Item) -> RunInfo:
    ended = item.get("ended_at")
    return RunInfo(
        run_id=item["pk"]["S"].removeprefix(RUN_PREFIX),
        command=item["command"]["S"],
        started_at=number(item, "started_at"),
        heartbeat_at=number(item, "heartbeat_at"),
        lease_until=number(item, "lease_until"),
        ended_at=None if ended is None else float(ended["N"]),
        outcome=optional_string(item, "outcome"),
        info=json.loads(item["info"]["S"]),
        counts=json.loads(item["counts"]["S"]),
    )
