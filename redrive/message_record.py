"""The record a ``--where`` or ``--group-by`` expression reads: one plain dict per message,
with the fields docs/where.md documents.

A record holds only the fields its expression can read (:func:`redrive.where.compile_expression`
works them out from the expression's syntax tree once per run), so an expression that reads
``task`` never decodes a message's arguments, and one that never reads ``state`` never asks a
result backend. A field the record does not hold is null to JMESPath, exactly like a field
the message does not have.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from redrive.broker.base import Delivery, Header, consumer_receives, queue_name
from redrive.durations import iso_utc
from redrive.messages import Payload, TaskInfo, read_payload

__all__ = [
    "FIELDS",
    "RecordBuilder",
    "ResultLookup",
    "TaskOutcome",
]


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """What a Celery result backend knows of one task id."""

    state: str | None
    exception: str | None = None


class ResultLookup(Protocol):
    """The hook for a Celery result backend (``state`` and ``exception``): given a task id,
    what the backend knows of it, or None. Called only for a record whose expression reads
    ``state`` or ``exception``, at most once per message."""

    def __call__(self, task_id: str, /) -> TaskOutcome | None: ...


@dataclass(slots=True)
class _Source:
    """One message while its record is built: the payload and the backend's answer are
    read at most once, and only by a field that needs them."""

    info: TaskInfo
    message: Delivery
    now: float
    sources: Sequence[str]
    results: ResultLookup | None
    _payload: Payload | None = field(default=None)
    _outcome: TaskOutcome | None = field(default=None)
    _asked: bool = field(default=False)

    @property
    def payload(self) -> Payload:
        if self._payload is None:
            self._payload = read_payload(self.message.body, self.info)
        return self._payload

    @property
    def outcome(self) -> TaskOutcome | None:
        if not self._asked:
            self._asked = True
            task_id = self.info.task_id
            if self.results is not None and task_id:
                self._outcome = self.results(task_id)
        return self._outcome


def _task(s: _Source) -> str | None:
    return s.info.task if s.info.is_celery else None


def _iso(moment: datetime | None) -> str | None:
    return iso_utc(moment.timestamp()) if moment is not None else None


def _expired(s: _Source) -> bool:
    """Whether the task's ``expires`` has passed, as inspect counts it (a worker would
    discard it): ``--where expired`` selects only those (``--where expires``: any deadline)."""
    return s.info.is_expired(datetime.fromtimestamp(s.now, UTC))


def _header(name: str) -> Callable[[_Source], Any]:
    def read(s: _Source) -> Any:
        headers = s.payload.headers
        return headers.get(name) if headers is not None and s.info.protocol == 2 else None

    return read


def _age(s: _Source) -> float | None:
    sent = s.message.enqueued_at
    return round(s.now - sent, 3) if sent is not None else None


def _queue(s: _Source) -> str | None:
    """The DLQ's source queue the message came from: where the broker says it died, else
    the DLQ's only source queue."""
    if s.message.died_in:
        return queue_name(s.message.died_in)
    return s.sources[0] if len(s.sources) == 1 else None


def _header_value(header: Header) -> Any:
    """A header's value: text as text, a number as a number (so that comparisons work),
    bytes as base64 text."""
    if isinstance(header.value, bytes):
        return base64.b64encode(header.value).decode("ascii")
    if header.kind == "number":
        try:
            return int(header.value)
        except ValueError:
            try:
                return float(header.value)
            except ValueError:
                return header.value
    return header.value


def _attributes(s: _Source) -> dict[str, Any]:
    return {name: _header_value(h) for name, h in s.message.headers.items()}


def _body(s: _Source) -> str | None:
    return None if s.info.is_celery else s.message.body


def _json(s: _Source) -> Any:
    return None if s.info.is_celery else s.payload.json


def _state(s: _Source) -> str | None:
    outcome = s.outcome
    return outcome.state if outcome is not None else None


def _exception(s: _Source) -> str | None:
    outcome = s.outcome
    return outcome.exception if outcome is not None else None


#: Every field of the record, in docs/where.md's order, and how each is read.
_READERS: Final[dict[str, Callable[[_Source], Any]]] = {
    "task": _task,
    "id": lambda s: s.info.task_id,
    "args": lambda s: s.payload.args,
    "kwargs": lambda s: s.payload.kwargs,
    "retries": lambda s: s.info.retries,
    "eta": lambda s: _iso(s.info.eta),
    "expires": lambda s: _iso(s.info.expires),
    "expired": lambda s: _expired(s),
    "root_id": _header("root_id"),
    "parent_id": _header("parent_id"),
    "origin": _header("origin"),
    "headers": lambda s: s.payload.headers,
    "message_id": lambda s: s.message.message_id,
    "receive_count": lambda s: s.message.receive_count,
    "consumer_receives": lambda s: consumer_receives(s.message),
    "sent_at": lambda s: iso_utc(s.message.enqueued_at),
    "age_seconds": _age,
    "attributes": _attributes,
    "queue": _queue,
    "body": _body,
    "json": _json,
    "state": _state,
    "exception": _exception,
}
FIELDS: Final = tuple(_READERS)


@dataclass(frozen=True, slots=True)
class RecordBuilder:
    """Builds the records of one run: the fields its expressions read, nothing more."""

    fields: Collection[str] = FIELDS
    sources: Sequence[str] = ()
    """The DLQ's source queue names (``queue`` when SQS did not say which one)."""
    results: ResultLookup | None = None

    def build(
        self,
        info: TaskInfo,
        message: Delivery,
        *,
        now: float,
        outcome: TaskOutcome | None = None,
    ) -> dict[str, Any]:
        """``outcome``: the backend's answer when the caller already read it (inspect reads
        a batch at a time); the builder's ``results`` hook is then not asked."""
        source = _Source(info, message, now, self.sources, self.results)
        if outcome is not None:
            source._outcome, source._asked = outcome, True
        return {name: _READERS[name](source) for name in self.fields if name in _READERS}
