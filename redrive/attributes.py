"""redrive's own message attributes, stamped on every copy it sends.

They let a message that comes back to a DLQ be recognised: how often it was redriven,
under which idempotency key, and from which DLQ. Original attributes always win: ours are
added only while the broker's limit of attributes per message leaves room, in this order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COUNT = "redrive-count"
KEY = "redrive-key"
SOURCE_DLQ = "redrive-dlq"


def redrive_count(message_attributes: Mapping[str, Mapping[str, Any]]) -> int:
    """How many times redrive has already sent this message back (0 when not stamped)."""
    value = message_attributes.get(COUNT, {}).get("StringValue")
    try:
        return max(0, int(str(value))) if value is not None else 0
    except ValueError:
        return 0


def stamped(
    original: Mapping[str, Mapping[str, Any]], *, count: int, key: str, dlq: str, room: int
) -> dict[str, Mapping[str, Any]]:
    """The original attributes, unchanged, plus ours where there is room.

    Our own attributes from an earlier redrive are replaced, not counted twice.
    """
    ours: dict[str, Mapping[str, Any]] = {
        COUNT: {"DataType": "Number", "StringValue": str(count)},
        KEY: {"DataType": "String", "StringValue": key},
        SOURCE_DLQ: {"DataType": "String", "StringValue": dlq},
    }
    result = {name: value for name, value in original.items() if name not in ours}
    for name, value in ours.items():
        if len(result) >= room:
            break
        result[name] = value
    return result


def originals(message_attributes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The producer's attributes without redrive's own (what the producer sent)."""
    return {k: v for k, v in message_attributes.items() if k not in (COUNT, KEY, SOURCE_DLQ)}
