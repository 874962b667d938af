"""Scheduled-report state: what each DLQ held at the previous report, and when it last alerted.

Two uses, one small JSON file each:

* ``--since-last``: what is new in each DLQ since the previous report (kept in the state
  directory, per layout);
* ``--alert-state FILE --alert-throttle DUR``: throttle, not debounce. The alerting exit code
  fires at once when a DLQ grows or a new task group appears, and otherwise at most once per
  DUR while a DLQ keeps the same (non-empty) content. Growth is measured against the previous
  *run*, not the previous alert, so a DLQ that keeps growing alerts on every run.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redrive.errors import ConfigError
from redrive.reporting.report import Report

STATE_VERSION = 1


def snapshot(report: Report) -> dict[str, dict[str, Any]]:
    """Per family scanned in full: message count and per-task counts (what the next run
    compares with)."""
    out: dict[str, dict[str, Any]] = {}
    for queue in report.queues:
        # Part of a DLQ (an interrupted report) would read as a DLQ that shrank.
        if queue.result is None or queue.coverage != "full":
            continue
        out[queue.family] = {
            "dlq": queue.dlq,
            "messages": queue.messages,
            "tasks": {g.task: g.count for g in queue.result.groups},
        }
    return out


def load_state(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"state file {path} is unreadable ({exc}): delete it to start afresh"
        ) from exc
    if not isinstance(data, dict) or data.get("v") != STATE_VERSION:
        return {}
    return data


def save_state(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"v": STATE_VERSION, **data}, indent=2, sort_keys=True), "utf-8")
    os.replace(tmp, path)


def since_last_path(state_dir: Path, layout_source: str) -> Path:
    digest = hashlib.sha256(layout_source.encode()).hexdigest()[:12]
    return state_dir / f"report-last-{digest}.json"


@dataclass(frozen=True, slots=True)
class Change:
    family: str
    previous_at: float | None
    previous_messages: int | None
    messages: int
    new_tasks: dict[str, int] = field(default_factory=dict)
    grown_tasks: dict[str, int] = field(default_factory=dict)
    """task -> how many more than at the previous report."""

    @property
    def delta(self) -> int | None:
        return None if self.previous_messages is None else self.messages - self.previous_messages

    def to_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "previous_report_at": self.previous_at,
            "previous_messages": self.previous_messages,
            "messages": self.messages,
            "delta": self.delta,
            "new_tasks": self.new_tasks,
            "grown_tasks": self.grown_tasks,
        }


def changes_since(previous: Mapping[str, Any], report: Report) -> list[Change]:
    before = previous.get("families", {})
    at = previous.get("generated_at")
    changes = []
    for family, now in snapshot(report).items():
        old = before.get(family)
        old_tasks: dict[str, int] = old.get("tasks", {}) if old else {}
        changes.append(
            Change(
                family=family,
                previous_at=at if old else None,
                previous_messages=int(old["messages"]) if old else None,
                messages=int(now["messages"]),
                new_tasks={t: n for t, n in now["tasks"].items() if old and t not in old_tasks},
                grown_tasks={
                    t: n - old_tasks[t]
                    for t, n in now["tasks"].items()
                    if t in old_tasks and n > old_tasks[t]
                },
            )
        )
    return changes


@dataclass(frozen=True, slots=True)
class AlertDecision:
    fire: bool
    reasons: dict[str, str]
    """family -> why it fires (or why it is held back)."""


def decide_alert(
    state: Mapping[str, Any], report: Report, *, throttle: float | None, now: float
) -> tuple[AlertDecision, dict[str, Any]]:
    """Whether the alert fires now, and the state to save for the next run."""
    seen = state.get("families", {})
    new_state: dict[str, Any] = {}
    reasons: dict[str, str] = {}
    fire = False
    for family, current in snapshot(report).items():
        old = seen.get(family, {})
        last_fired = old.get("last_fired_at")
        messages = int(current["messages"])
        entry = {
            "messages": messages,
            "tasks": sorted(current["tasks"]),
            "last_fired_at": last_fired,
        }
        if messages > 0:
            grew = messages > int(old.get("messages", 0))
            new_tasks = sorted(set(current["tasks"]) - set(old.get("tasks", [])))
            due = throttle is None or last_fired is None or now - float(last_fired) >= throttle
            if grew or new_tasks or due:
                fire = True
                entry["last_fired_at"] = now
                reasons[family] = (
                    f"grew to {messages}"
                    if grew
                    else f"new task(s): {', '.join(new_tasks)}"
                    if new_tasks
                    else f"still {messages} message(s)"
                )
            else:
                reasons[family] = f"unchanged ({messages}); alerted {int(now - last_fired)}s ago"
        new_state[family] = entry
    return AlertDecision(fire, reasons), {"families": new_state}
