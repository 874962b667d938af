"""The DynamoDB ledger's state changes, each as the one conditional write (or two-item
transaction) that makes it: the request, built here; sent by :mod:`redrive.ledger.dynamodb`.

``ttl`` is how long an item lives after this write (see TTL_SECONDS).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from redrive.ledger.base import Claim, Entry, KeyState, RunInfo
from redrive.ledger.dynamodb_items import (
    RUN_KIND,
    Item,
    as_n,
    as_s,
    attribute_names,
    key_pk,
    run_pk,
)
from redrive.ledger.dynamodb_table import TTL_ATTRIBUTE

# The owner run of a key has no lease running: gone, ended, or past its promised time.
_OWNER_NOT_LEASED = (
    "attribute_not_exists(pk) OR attribute_exists(#ended_at) OR #lease_until <= :now"
)
_RUN_OPEN = "attribute_exists(pk) AND attribute_not_exists(#ended_at)"

Request = dict[str, Any]


def expiry(now: float, ttl: float) -> dict[str, str]:
    # TTL wants whole epoch seconds.
    return {"N": str(int(now + ttl))}


# --------------------------------------------------------------------------- runs


def run_item(
    run_id: str, *, command: str, info: Mapping[str, Any], now: float, token: str, ttl: float
) -> Item:
    """A new run's item; ``token`` marks this put, to recognise it when retried."""
    return {
        **run_pk(run_id),
        "kind": as_s(RUN_KIND),
        "command": as_s(command),
        "started_at": as_n(now),
        "heartbeat_at": as_n(now),
        "lease_until": as_n(now),
        # default=str: info is descriptive; a Path or datetime in it must not crash a run.
        "info": as_s(json.dumps(dict(info), sort_keys=True, default=str)),
        "counts": as_s("{}"),
        "start_token": as_s(token),
        TTL_ATTRIBUTE: expiry(now, ttl),
    }


def heartbeat_update(run_id: str, *, lease_until: float, now: float, ttl: float) -> Request:
    return {
        "Key": run_pk(run_id),
        "UpdateExpression": "SET #heartbeat_at = :now, #lease_until = :lease, #expires_at = :exp",
        "ConditionExpression": _RUN_OPEN,
        "ExpressionAttributeNames": attribute_names(
            "heartbeat_at", "lease_until", TTL_ATTRIBUTE, "ended_at"
        ),
        "ExpressionAttributeValues": {
            ":now": as_n(now),
            ":lease": as_n(lease_until),
            ":exp": expiry(now, ttl),
        },
    }


def end_run_update(
    run_id: str, *, outcome: str, counts: Mapping[str, int], now: float, ttl: float
) -> Request:
    return {
        "Key": run_pk(run_id),
        "UpdateExpression": (
            "SET #ended_at = :now, #outcome = :outcome, #counts = :counts, #expires_at = :exp"
        ),
        "ConditionExpression": _RUN_OPEN,
        "ExpressionAttributeNames": attribute_names("ended_at", "outcome", "counts", TTL_ATTRIBUTE),
        "ExpressionAttributeValues": {
            ":now": as_n(now),
            ":outcome": as_s(outcome),
            ":counts": as_s(json.dumps(dict(counts), sort_keys=True)),
            ":exp": expiry(now, ttl),
        },
    }


def with_info(update: Request, info: Mapping[str, Any]) -> Request:
    """``update`` (of :func:`end_run_update`) that also sets the run's info to ``info``."""
    return {
        **update,
        "UpdateExpression": update["UpdateExpression"] + ", #info = :info",
        "ExpressionAttributeNames": {
            **update["ExpressionAttributeNames"],
            **attribute_names("info"),
        },
        "ExpressionAttributeValues": {
            **update["ExpressionAttributeValues"],
            ":info": as_s(json.dumps(dict(info), sort_keys=True, default=str)),
        },
    }


# --------------------------------------------------------------------------- keys


def claim_item(run_id: str, claim: Claim, *, now: float, token: str, ttl: float) -> Item:
    """A new key's item, CLAIMED by ``run_id``; ``token`` marks the claiming call's puts,
    to recognise them when retried."""
    return {
        **key_pk(claim.key),
        "key": as_s(claim.key),
        "state": as_s(KeyState.CLAIMED.value),
        "run_id": as_s(run_id),
        "task": as_s(claim.task),
        "message_id": as_s(claim.message_id),
        "target": as_s(claim.target),
        "updated_at": as_n(now),
        "claim_token": as_s(token),
        TTL_ATTRIBUTE: expiry(now, ttl),
    }


def mark_sent_update(key: str, run_id: str, sent_id: str, *, now: float, ttl: float) -> Request:
    return {
        "Key": key_pk(key),
        "UpdateExpression": (
            "SET #state = :sent, #sent_message_id = :sid, #updated_at = :now, "
            "#sent_at = :now, #expires_at = :exp"
        ),
        "ConditionExpression": "#state = :claimed AND #run_id = :run",
        "ExpressionAttributeNames": attribute_names(
            "state", "sent_message_id", "updated_at", "sent_at", TTL_ATTRIBUTE, "run_id"
        ),
        "ExpressionAttributeValues": {
            ":sent": as_s(KeyState.SENT.value),
            ":sid": as_s(sent_id),
            ":now": as_n(now),
            ":exp": expiry(now, ttl),
            ":claimed": as_s(KeyState.CLAIMED.value),
            ":run": as_s(run_id),
        },
    }


def release_delete(key: str, run_id: str) -> Request:
    return {
        "Key": key_pk(key),
        "ConditionExpression": "#state = :claimed AND #run_id = :run",
        "ExpressionAttributeNames": attribute_names("state", "run_id"),
        "ExpressionAttributeValues": {
            ":claimed": as_s(KeyState.CLAIMED.value),
            ":run": as_s(run_id),
        },
    }


def mark_done_update(key: str, *, now: float, ttl: float) -> Request:
    return {
        "Key": key_pk(key),
        "UpdateExpression": "SET #state = :done, #updated_at = :now, #expires_at = :exp",
        "ConditionExpression": "#state = :sent",
        "ExpressionAttributeNames": attribute_names("state", "updated_at", TTL_ATTRIBUTE),
        "ExpressionAttributeValues": {
            ":done": as_s(KeyState.DONE.value),
            ":sent": as_s(KeyState.SENT.value),
            ":now": as_n(now),
            ":exp": expiry(now, ttl),
        },
    }


def takeover_transaction(
    table: str, key: str, old_run: str, run_id: str, *, now: float, ttl: float
) -> list[Request]:
    """``key``, CLAIMED by ``old_run``, to ``run_id`` once ``old_run``'s lease ran out."""
    return _from_dead_owner(
        table,
        key,
        old_run,
        now=now,
        ttl=ttl,
        update="SET #run_id = :run, #updated_at = :now, #expires_at = :exp",
        names=("run_id", "updated_at", TTL_ATTRIBUTE),
        values={":run": as_s(run_id)},
    )


def skip_transaction(
    table: str, key: str, owner: str, run_id: str, *, now: float, ttl: float
) -> list[Request]:
    """``key``, CLAIMED by ``owner``, to SKIPPED by ``run_id`` once ``owner``'s lease ran
    out."""
    return _from_dead_owner(
        table,
        key,
        owner,
        now=now,
        ttl=ttl,
        update="SET #state = :skipped, #run_id = :run, #updated_at = :now, #expires_at = :exp",
        names=("updated_at", TTL_ATTRIBUTE),
        values={":skipped": as_s(KeyState.SKIPPED.value), ":run": as_s(run_id)},
    )


def _from_dead_owner(
    table: str,
    key: str,
    owner: str,
    *,
    now: float,
    ttl: float,
    update: str,
    names: Sequence[str],
    values: Mapping[str, Any],
) -> list[Request]:
    """The TransactItems that apply ``update`` to a key CLAIMED by ``owner`` if and only if
    ``owner``'s lease has run out, atomically: the ConditionCheck fails if the owner
    heartbeats first."""
    return [
        {
            "ConditionCheck": {
                "TableName": table,
                "Key": run_pk(owner),
                "ConditionExpression": _OWNER_NOT_LEASED,
                "ExpressionAttributeNames": attribute_names("ended_at", "lease_until"),
                "ExpressionAttributeValues": {":now": as_n(now)},
            }
        },
        {
            "Update": {
                "TableName": table,
                "Key": key_pk(key),
                "UpdateExpression": update,
                "ConditionExpression": "#state = :claimed AND #run_id = :old",
                "ExpressionAttributeNames": attribute_names("state", "run_id", *names),
                "ExpressionAttributeValues": {
                    ":claimed": as_s(KeyState.CLAIMED.value),
                    ":old": as_s(owner),
                    ":now": as_n(now),
                    ":exp": expiry(now, ttl),
                    **values,
                },
            }
        },
    ]


# --------------------------------------------------------------------------- copies


def copied_run_item(run: RunInfo, *, now: float, ttl: float) -> Item:
    """A run copied from another ledger, as it stands there (``ledger copy``)."""
    item: Item = {
        **run_pk(run.run_id),
        "kind": as_s(RUN_KIND),
        "command": as_s(run.command),
        "started_at": as_n(run.started_at),
        "heartbeat_at": as_n(run.heartbeat_at),
        "lease_until": as_n(run.lease_until),
        "info": as_s(json.dumps(run.info, sort_keys=True, default=str)),
        "counts": as_s(json.dumps(run.counts, sort_keys=True)),
        TTL_ATTRIBUTE: expiry(now, ttl),
    }
    if run.ended_at is not None:
        item["ended_at"] = as_n(run.ended_at)
    if run.outcome is not None:
        item["outcome"] = as_s(run.outcome)
    return item


def copied_entry_item(entry: Entry, *, now: float, ttl: float) -> Item:
    """A key copied from another ledger, as it stands there; it lives ``ttl`` from the
    copy, as if changed then (a copied key guards as long as a new one)."""
    item: Item = {
        **key_pk(entry.key),
        "key": as_s(entry.key),
        "state": as_s(entry.state.value),
        "run_id": as_s(entry.run_id),
        "task": as_s(entry.task),
        "message_id": as_s(entry.message_id),
        "target": as_s(entry.target),
        "updated_at": as_n(entry.updated_at),
        TTL_ATTRIBUTE: expiry(now, ttl),
    }
    if entry.sent_message_id is not None:
        item["sent_message_id"] = as_s(entry.sent_message_id)
    if entry.sent_at is not None:
        item["sent_at"] = as_n(entry.sent_at)
    return item
