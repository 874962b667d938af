"""Plans: a dry run's exact selection, written for review and applied later as it stands.

``move --plan-out plan.json`` (or ``purge --plan-out``) writes what the dry run selected:
the command, target, filters and options, who made it and when, and one item per message
(SQS MessageId, idempotency key, task, and the digest of the message as planned).
``apply plan.json --execute`` acts on exactly those messages: a message not in the plan is
left alone even if it matches the filters now, a planned message no longer in the DLQ is
reported as gone, and one whose digest differs from the plan's is left in the DLQ
(``changed-since-plan``: what was reviewed is not what is there). Applying a plan twice does
nothing the second time (its messages are gone, and their keys are done in the ledger).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from redrive.aws.identity import local_identity
from redrive.broker.base import Delivery
from redrive.errors import UsageProblem
from redrive.runs.observer import PlanItem, RunObserver

PLAN_VERSION = 1
KINDS = ("move", "purge")
CHANGED_SINCE_PLAN = "changed-since-plan"
"""Why apply leaves a planned message: its digest is not the plan's (a skip reason)."""


def message_digest(message: Delivery) -> str:
    """``sha256:<hex>`` of what a resend carries: the body and the neutral headers (each
    name sorted; its kind, its type label and its value, bytes in base64), so that a message
    whose id stayed but whose content did not (a RabbitMQ producer's own ``message_id`` on a
    new publish) is known. The same on every broker: a digest never names a broker's own
    attribute shape."""
    headers = {
        name: {
            "kind": header.kind,
            "label": header.label,
            "value": (
                {"b64": base64.b64encode(header.value).decode("ascii")}
                if isinstance(header.value, bytes)
                else header.value
            ),
        }
        for name, header in sorted(message.headers.items())
    }
    digest = hashlib.sha256(message.body.encode("utf-8", "surrogatepass"))
    digest.update(b"\x00")
    digest.update(json.dumps(headers, separators=(",", ":")).encode("utf-8"))
    return "sha256:" + digest.hexdigest()


def changed_since_plan(planned: Mapping[str, str] | None, message: Delivery) -> bool:
    """Whether a plan's message is not the one it recorded (``planned``: MessageId ->
    digest; a message the plan gives no digest, as a plan of an earlier redrive, is not)."""
    if not planned:
        return False
    recorded = planned.get(message.message_id)
    return recorded is not None and message_digest(message) != recorded


@dataclass(slots=True)
class Plan:
    kind: str
    target: str
    dlq_url: str
    filters: dict[str, Any]
    options: dict[str, Any]
    created_at: str
    created_by: dict[str, Any]
    items: list[PlanItem] = field(default_factory=list)
    path: str = ""

    @classmethod
    def read(cls, path: str) -> Plan:
        """The plan at ``path`` (:func:`read_plan`)."""
        return read_plan(path)

    @property
    def message_ids(self) -> frozenset[str]:
        return frozenset(item.message_id for item in self.items)

    @property
    def by_task(self) -> dict[str, int]:
        return dict(sorted(Counter(item.task for item in self.items).items()))

    @property
    def digests(self) -> dict[str, str] | None:
        """MessageId -> the digest planned; None for a plan with none (written before plans
        recorded them: applied as it was then)."""
        digests = {i.message_id: i.digest for i in self.items if i.digest is not None}
        return digests or None


class PlanWriter(RunObserver[Any]):
    """Streams a plan to disk: items go straight to the file, never all held in memory. As
    a dry run's observer it writes each item the run plans."""

    def __init__(
        self,
        path: str,
        *,
        kind: str,
        target: str,
        dlq_url: str,
        filters: Mapping[str, Any],
        options: Mapping[str, Any],
        caller: Mapping[str, Any] | None = None,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown plan kind {kind!r}")
        self.path = path
        self.count = 0
        self.by_task: Counter[str] = Counter()
        tmp = Path(path).with_name(f".{Path(path).name}.tmp")
        self._tmp = tmp
        try:
            self._file: IO[str] = tmp.open("w", encoding="utf-8")
        except OSError as exc:
            raise UsageProblem(f"cannot write the plan {path}: {exc.strerror}") from exc
        header = {
            "redrive_plan": PLAN_VERSION,
            "kind": kind,
            "target": target,
            "dlq_url": dlq_url,
            "filters": dict(filters),
            "options": dict(options),
            "created_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "created_by": {**local_identity(), **(dict(caller) if caller else {})},
        }
        # The header first, then one item per line: readable in a review, easy to diff.
        text = json.dumps(header, indent=2, ensure_ascii=False)
        self._file.write(text[: text.rstrip().rfind("}")].rstrip() + ',\n  "items": [\n')
        self._first = True

    def on_plan(self, item: PlanItem) -> None:
        self.add(item)

    def add(self, item: PlanItem) -> None:
        prefix = "    " if self._first else ",\n    "
        self._file.write(prefix + json.dumps(item.to_json(), ensure_ascii=False))
        self._first = False
        self.count += 1
        self.by_task[item.task] += 1

    def close(self) -> None:
        if self._file.closed:
            return
        summary = json.dumps(dict(sorted(self.by_task.items())), ensure_ascii=False)
        self._file.write(f'\n  ],\n  "count": {self.count},\n  "by_task": {summary}\n}}\n')
        self._file.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        self._file.close()
        self._tmp.unlink(missing_ok=True)


def read_plan(path: str) -> Plan:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageProblem(f"plan {path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise UsageProblem(f"plan {path} is not a readable plan: {exc}") from exc
    if not isinstance(data, dict) or "redrive_plan" not in data:
        raise UsageProblem(f"{path} is not a redrive plan (no 'redrive_plan' field)")
    if data["redrive_plan"] != PLAN_VERSION:
        raise UsageProblem(
            f"plan {path} has version {data['redrive_plan']}; this redrive reads version "
            f"{PLAN_VERSION}: upgrade redrive"
        )
    kind = data.get("kind")
    if kind not in KINDS:
        raise UsageProblem(f"plan {path}: unknown kind {kind!r}")
    try:
        items = [
            PlanItem(
                message_id=str(raw["message_id"]),
                task=str(raw["task"]),
                task_id=raw.get("task_id"),
                key=raw.get("key"),
                target=raw.get("target"),
                action=str(raw.get("action", "send")),
                routed_from=raw.get("routed_from"),
                digest_before=raw.get("digest_before"),
                digest_after=raw.get("digest_after"),
                digest=_digest_field(raw.get("digest")),
            )
            for raw in data.get("items", [])
        ]
        return Plan(
            kind=str(kind),
            target=str(data["target"]),
            dlq_url=str(data["dlq_url"]),
            filters=dict(data.get("filters", {})),
            options=dict(data.get("options", {})),
            created_at=str(data.get("created_at", "")),
            created_by=dict(data.get("created_by", {})),
            items=items,
            path=path,
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise UsageProblem(f"plan {path} is damaged: missing or bad field {exc}") from exc


def _digest_field(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError("'digest' (not a string)")
