"""redrive's own marks, stamped on every copy it sends (as headers beside the body).

They let a message that comes back to a DLQ be recognised: how often it was redriven,
under which idempotency key, and from which DLQ. Original headers always win: ours are
added only while the broker's limit of headers per message leaves room, in this order.
"""

from __future__ import annotations

from redrive.broker.base import Header, Headers

COUNT = "redrive-count"
KEY = "redrive-key"
SOURCE_DLQ = "redrive-dlq"


def text_of(headers: Headers, name: str) -> str | None:
    """A header's value as text (a number as written); None: no such header, or bytes."""
    header = headers.get(name)
    return header.as_text if header is not None else None


def redrive_count(headers: Headers) -> int:
    """How many times redrive has already sent this message back (0 when not stamped)."""
    value = text_of(headers, COUNT)
    try:
        return max(0, int(value)) if value is not None else 0
    except ValueError:
        return 0


def stamped(original: Headers, *, count: int, key: str, dlq: str, room: int) -> dict[str, Header]:
    """The original headers, unchanged, plus ours where there is room.

    Our own headers from an earlier redrive are replaced, not counted twice.
    """
    ours = {COUNT: Header.number(count), KEY: Header.text(key), SOURCE_DLQ: Header.text(dlq)}
    result = {name: value for name, value in original.items() if name not in ours}
    for name, value in ours.items():
        if len(result) >= room:
            break
        result[name] = value
    return result


def originals(headers: Headers) -> dict[str, Header]:
    """The producer's headers without redrive's own (what the producer sent)."""
    return {k: v for k, v in headers.items() if k not in (COUNT, KEY, SOURCE_DLQ)}
