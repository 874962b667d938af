"""The messages a console scan keeps for its message page: the ``--where`` record of the
first few of each group (docs/where.md's fields, the CLI's view of one message), never a
list of every message, so a scan of 100,000 stays in bounded memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redrive.broker.base import Delivery
from redrive.celery.results import TaskRecord
from redrive.inspection.groups import GroupKey
from redrive.message_record import FIELDS, RecordBuilder, TaskOutcome
from redrive.messages import TaskInfo

KEPT_PER_GROUP = 20
#: The record's fields that may hold personal data: hidden until revealed (audited).
PRIVATE_FIELDS = ("args", "kwargs", "body", "json")
#: Celery's headers that repeat the arguments (protocol 2's reprs of them).
PRIVATE_HEADERS = ("argsrepr", "kwargsrepr")


@dataclass
class SampleKeeper:
    """Hears each message a scan counts (``Focus.on_counted``) and keeps the records of up
    to ``per_group`` of each group, with the group's label."""

    now: float
    sources: tuple[str, ...] = ()
    per_group: int = KEPT_PER_GROUP
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    _kept: dict[str, int] = field(default_factory=dict)

    def offer(
        self, key: GroupKey, message: Delivery, info: TaskInfo, backend: TaskRecord | None
    ) -> None:
        if self._kept.get(key.identity, 0) >= self.per_group:
            return
        self._kept[key.identity] = self._kept.get(key.identity, 0) + 1
        outcome = TaskOutcome(backend.state, backend.exception) if backend is not None else None
        record = RecordBuilder(FIELDS, self.sources).build(
            info, message, now=self.now, outcome=outcome
        )
        record["group"] = key.label
        record["death"] = {
            "reason": message.death_reason,
            "queue": message.died_in,
            "at": message.died_at,
        }
        self.records[message.message_id] = record


def public_record(record: dict[str, Any]) -> dict[str, Any]:
    """The record with the fields that may hold personal data withheld (None)."""
    shown = {k: (None if k in PRIVATE_FIELDS else v) for k, v in record.items()}
    headers = shown.get("headers")
    if isinstance(headers, dict):
        shown["headers"] = {k: (None if k in PRIVATE_HEADERS else v) for k, v in headers.items()}
    return shown
