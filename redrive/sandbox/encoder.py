"""Celery task messages as kombu's SQS transport writes them: ``encode`` builds a body byte for
byte like Celery 5.7 / kombu 5.7 publish a JSON task (checked against messages Celery itself
sent). The sandbox seeds its DLQs with it; tests and bench use it too.
"""

from __future__ import annotations

import base64
import bz2
import json
import lzma
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from redrive.messages import safe_repr

# What kombu 5.7 writes in headers.compression for each name it accepts.
_COMPRESSORS: Final[dict[str, tuple[str, Callable[[bytes], bytes]]]] = {
    "gzip": ("application/x-gzip", zlib.compress),
    "zlib": ("application/x-gzip", zlib.compress),
    "application/x-gzip": ("application/x-gzip", zlib.compress),
    "bzip2": ("application/x-bz2", bz2.compress),
    "bzip": ("application/x-bz2", bz2.compress),
    "application/x-bz2": ("application/x-bz2", bz2.compress),
    "lzma": ("application/x-lzma", lzma.compress),
    "xz": ("application/x-lzma", lzma.compress),
    "application/x-lzma": ("application/x-lzma", lzma.compress),
}
_EMPTY_EMBED: Final[dict[str, None]] = {
    "callbacks": None,
    "errbacks": None,
    "chain": None,
    "chord": None,
}


def encode(
    task: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    protocol: int = 2,
    task_id: str | None = None,
    retries: int = 0,
    eta: datetime | None = None,
    expires: datetime | None = None,
    queue: str = "celery",
    base64_envelope: bool = True,
    compression: str | None = None,
    origin: str = "redrive-sandbox",
) -> str:
    """Build the SQS Body Celery 5.7 / kombu 5.7 send for a JSON-serialized task.

    ``compression`` takes kombu's names ("gzip", "zlib", "bzip2", "lzma" or the content type);
    kombu maps both "gzip" and "zlib" to zlib data labelled "application/x-gzip", and so does
    this. Naive ``eta``/``expires`` are UTC. Raises ValueError for an unknown protocol or
    compression and TypeError for arguments JSON cannot represent.
    """
    if protocol not in (1, 2):
        raise ValueError(f"Celery message protocol must be 1 or 2, not {protocol!r}")
    codec = _codec(compression)
    expires_at = _aware(expires)
    fields = _TaskFields(
        task=task,
        task_id=task_id if task_id is not None else str(uuid.uuid4()),
        args=list(args),
        kwargs=dict(kwargs) if kwargs is not None else {},
        retries=retries,
        eta=_iso(_aware(eta)),
        expires=_iso(expires_at),
        origin=origin,
    )
    headers: dict[str, Any] = {}
    inner: object
    if protocol == 2:
        headers, inner = _protocol_2(fields)
    else:
        inner = _protocol_1(fields)
    payload = json.dumps(inner).encode("utf-8")
    if codec is not None:
        # kombu appends the header after Celery's own, so it comes last.
        headers["compression"], compress = codec
        payload = compress(payload)
    envelope = {
        "body": base64.b64encode(payload).decode("ascii"),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": _properties(fields.task_id, origin, expires_at, queue),
    }
    text = json.dumps(envelope)
    if base64_envelope:
        return base64.b64encode(text.encode("utf-8")).decode("ascii")
    return text


@dataclass(frozen=True)
class _TaskFields:
    """What both protocols carry of a task, as JSON will hold it."""

    task: str
    task_id: str
    args: list[Any]
    kwargs: dict[str, Any]
    retries: int
    eta: str | None
    expires: str | None
    origin: str


def _codec(compression: str | None) -> tuple[str, Callable[[bytes], bytes]] | None:
    if compression is None:
        return None
    codec = _COMPRESSORS.get(compression.strip().lower())
    if codec is None:
        known = ", ".join(sorted(_COMPRESSORS))
        raise ValueError(f"unknown compression {compression!r}; use one of: {known}")
    return codec


def _protocol_2(task: _TaskFields) -> tuple[dict[str, Any], object]:
    """Protocol 2: the task in the headers, the body ``[args, kwargs, embed]``."""
    headers: dict[str, Any] = {
        "lang": "py",
        "task": task.task,
        "id": task.task_id,
        "shadow": None,
        "eta": task.eta,
        "expires": task.expires,
        "group": None,
        "group_index": None,
        "retries": task.retries,
        "timelimit": [None, None],
        "root_id": task.task_id,
        "parent_id": None,
        "argsrepr": safe_repr(tuple(task.args)),
        "kwargsrepr": safe_repr(task.kwargs),
        "origin": task.origin,
        "ignore_result": False,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
    }
    return headers, [task.args, task.kwargs, dict(_EMPTY_EMBED)]


def _protocol_1(task: _TaskFields) -> dict[str, Any]:
    """Protocol 1: no headers, everything in the body."""
    return {
        "task": task.task,
        "id": task.task_id,
        "args": task.args,
        "kwargs": task.kwargs,
        "group": None,
        "group_index": None,
        "retries": task.retries,
        "eta": task.eta,
        "expires": task.expires,
        "utc": True,
        "callbacks": None,
        "errbacks": None,
        "timelimit": [None, None],
        "taskset": None,
        "chord": None,
    }


def _properties(
    task_id: str, origin: str, expires_at: datetime | None, queue: str
) -> dict[str, Any]:
    """The envelope's properties, in kombu's order."""
    # Celery's reply_to is a uuid3 naming the producing app: stable per origin, like one app.
    properties: dict[str, Any] = {
        "correlation_id": task_id,
        "reply_to": str(uuid.uuid3(uuid.NAMESPACE_OID, origin)),
    }
    properties["delivery_mode"] = 2
    if expires_at is not None:
        # Celery passes the time left as the AMQP expiration, in ms, clamped at 0.
        left = (expires_at - datetime.now(UTC)).total_seconds()
        properties["expiration"] = str(int(max(left, 0.0) * 1000))
    properties["delivery_info"] = {"exchange": "", "routing_key": queue}
    properties["priority"] = 0
    properties["body_encoding"] = "base64"
    properties["delivery_tag"] = str(uuid.uuid4())
    return properties


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _aware(moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    if moment.tzinfo is None or moment.utcoffset() is None:
        return moment.replace(tzinfo=UTC)
    return moment
