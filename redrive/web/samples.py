"""The messages a console scan keeps: in memory, the ``--where`` record of the first few of
each group (docs/where.md's fields, the CLI's view of one message, arguments included for a
reveal); on disk (:class:`~redrive.web.spool.MessageSpool`), every message's record with its
arguments withheld, for the DLQ page's list, a page at a time. Never a list of every message
in memory, so a scan of 100,000 stays in bounded memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redrive.broker.base import Delivery
from redrive.celery.results import TaskRecord
from redrive.inspection.groups import GroupKey
from redrive.message_record import FIELDS, RecordBuilder, TaskOutcome
from redrive.messages import TaskInfo
from redrive.web.spool import MessageSpool

KEPT_PER_GROUP = 20
#: The record's fields that may hold personal data: hidden until revealed (audited).
PRIVATE_FIELDS = ("args", "kwargs", "body", "json")
#: Celery's headers that repeat the arguments (protocol 2's reprs of them).
PRIVATE_HEADERS = ("argsrepr", "kwargsrepr")
#: What a spooled record holds: every field but those (they are never written to disk).
SPOOLED_FIELDS = tuple(f for f in FIELDS if f not in PRIVATE_FIELDS)


@dataclass
class SampleKeeper:
    """Hears each message a scan counts (``Focus.on_counted``): keeps the records of up to
    ``per_group`` of each group, with the group's label, and spools every message's record
    without its arguments to ``spool`` (when there is one)."""

    now: float
    sources: tuple[str, ...] = ()
    per_group: int = KEPT_PER_GROUP
    spool: MessageSpool | None = None
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    _kept: dict[str, int] = field(default_factory=dict)

    def offer(
        self, key: GroupKey, message: Delivery, info: TaskInfo, backend: TaskRecord | None
    ) -> None:
        kept = self._kept.get(key.identity, 0) < self.per_group
        if not kept and self.spool is None:
            return
        outcome = TaskOutcome(backend.state, backend.exception) if backend is not None else None
        # The arguments are decoded only for a message kept in memory.
        record = RecordBuilder(FIELDS if kept else SPOOLED_FIELDS, self.sources).build(
            info, message, now=self.now, outcome=outcome
        )
        record["group"] = key.label
        record["death"] = {
            "reason": message.death_reason,
            "queue": message.died_in,
            "at": message.died_at,
        }
        if kept:
            self._kept[key.identity] = self._kept.get(key.identity, 0) + 1
            self.records[message.message_id] = record
        if self.spool is not None:
            self.spool.add(message.message_id, key.label, public_record(record))


def public_record(record: dict[str, Any]) -> dict[str, Any]:
    """The record with the fields that may hold personal data withheld (None): the
    arguments, the body, and the headers that repeat the arguments, wherever the broker put
    them (Celery's headers; on RabbitMQ the message's headers are its attributes too)."""
    shown = {k: (None if k in PRIVATE_FIELDS else v) for k, v in record.items()}
    shown |= {k: None for k in PRIVATE_FIELDS}
    for name in ("headers", "attributes"):
        values = shown.get(name)
        if isinstance(values, dict):
            shown[name] = {k: (None if k in PRIVATE_HEADERS else v) for k, v in values.items()}
    return shown
