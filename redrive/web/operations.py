"""The console's own operations: each an executed plan running in a thread the server owns
(it outlives the browser tab that started it), stopped from its page as Ctrl-C stops the
CLI's (the batch in flight finished, every hold released, the summary kept), and stopped all
together when the server stops. Plans are kept here too: a dry run's (the CLI's plan file,
byte for byte what ``--plan-out`` writes) or one uploaded from the CLI."""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redrive.errors import RedriveError, UsageProblem
from redrive.operations.coordinator import Outcome
from redrive.operations.plan import Plan
from redrive.runs.observer import RunObserver
from redrive.web.security import Person

_ID = re.compile(r"^[0-9a-f]{16}$")


def new_id() -> str:
    return secrets.token_hex(8)


def checked_id(value: str) -> str:
    """An id from a URL: 16 hex digits, or a UsageProblem (never a path of its own)."""
    if not _ID.match(value):
        raise UsageProblem(f"no such plan or operation: {value!r}")
    return value


class PlanStore:
    """Plan files in one directory: ``ID.json`` (the plan) and ``ID.dry-run.json`` (what its
    dry run said: counts, the edits' diff samples), for the plan page."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, plan_id: str) -> Path:
        return self.directory / f"{checked_id(plan_id)}.json"

    def new_path(self) -> tuple[str, Path]:
        self.directory.mkdir(parents=True, exist_ok=True)
        plan_id = new_id()
        return plan_id, self.path(plan_id)

    def read(self, plan_id: str) -> Plan:
        path = self.path(plan_id)
        if not path.exists():
            raise UsageProblem(f"no such plan: {plan_id}")
        return Plan.read(str(path))

    def keep_dry_run(self, plan_id: str, summary: Mapping[str, Any]) -> None:
        self.path(plan_id).with_suffix(".dry-run.json").write_text(
            json.dumps(summary, default=str), encoding="utf-8"
        )

    def dry_run(self, plan_id: str) -> dict[str, Any] | None:
        path = self.path(plan_id).with_suffix(".dry-run.json")
        if not path.exists():
            return None
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return data

    def keep_replay(self, form: Mapping[str, Any], dry_run: Mapping[str, Any]) -> str:
        """A replay's dry run (a replay has no plan file): what it asked and would send."""
        replay_id, path = self.new_path()
        path.with_suffix(".replay.json").write_text(
            json.dumps({"form": dict(form), "dry_run": dict(dry_run)}, default=str),
            encoding="utf-8",
        )
        return replay_id

    def replay(self, replay_id: str) -> dict[str, Any]:
        path = self.path(replay_id).with_suffix(".replay.json")
        if not path.exists():
            raise UsageProblem(f"no such replay: {replay_id}")
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return data

    def upload(self, content: bytes) -> str:
        """A plan made elsewhere (``move/purge --plan-out``), kept once it reads as one."""
        plan_id, path = self.new_path()
        path.write_bytes(content)
        try:
            Plan.read(str(path))
        except RedriveError:
            path.unlink(missing_ok=True)
            raise
        return plan_id


class _Progress(RunObserver[Any]):
    """An operation's counts so far (the run's result after each batch)."""

    def __init__(self, operation: Operation) -> None:
        self._operation = operation

    def on_progress(self, result: Any) -> None:
        self._operation.progress = result

    def on_problem(self, problem: str) -> None:
        self._operation.problems.append(problem)


@dataclass(eq=False)
class Operation:
    """One executed plan: who started it, on which DLQ, how far it got, how it ended."""

    id: str
    plan_id: str
    kind: str
    target: str
    person: Person
    started_at: float
    stop: threading.Event = field(default_factory=threading.Event)
    state: str = "running"
    """``running``, then ``completed``, ``needs-attention``, ``interrupted`` or ``failed``."""
    progress: Any = None
    result: dict[str, Any] | None = None
    error: str | None = None
    ended_at: float | None = None
    problems: list[str] = field(default_factory=list)
    thread: threading.Thread | None = None

    def to_json(self) -> dict[str, Any]:
        progress = self.progress
        counts = progress.run_counts() if hasattr(progress, "run_counts") else None
        return {
            "id": self.id,
            "plan": self.plan_id,
            "kind": self.kind,
            "target": self.target,
            "person": self.person.to_json(),
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "state": self.state,
            "progress": counts,
            "result": self.result,
            "error": self.error,
            "problems": list(self.problems),
        }


class Operations:
    """The server's operations; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._all: dict[str, Operation] = {}
        self._closed = False

    def start(
        self,
        *,
        plan_id: str,
        kind: str,
        target: str,
        person: Person,
        work: Callable[[threading.Event, RunObserver[Any]], Outcome[Any]],
    ) -> Operation:
        """Run ``work`` (given the stop and the observer) in a thread of the server's."""
        op = Operation(new_id(), plan_id, kind, target, person, self._clock())
        with self._lock:
            if self._closed:
                raise UsageProblem("the console is stopping: no new operation")
            self._all[op.id] = op
        op.thread = threading.Thread(
            target=self._run, args=(op, work), name=f"redrive-op-{op.id}", daemon=True
        )
        op.thread.start()
        return op

    def _run(
        self, op: Operation, work: Callable[[threading.Event, RunObserver[Any]], Outcome[Any]]
    ) -> None:
        try:
            outcome = work(op.stop, _Progress(op))
            result = outcome.result
            op.result = result.to_json() if result is not None else None
            if outcome.error is not None:
                op.error, op.state = str(outcome.error), "failed"
            elif result is not None and result.interrupted:
                op.state = "interrupted"
            elif result is not None and result.needs_attention:
                op.state = "needs-attention"
            else:
                op.state = "completed"
        except Exception as exc:  # an operation's end is shown, never lost
            op.error, op.state = f"{type(exc).__name__}: {exc}", "failed"
        finally:
            op.ended_at = self._clock()

    def get(self, op_id: str) -> Operation:
        with self._lock:
            found = self._all.get(checked_id(op_id))
        if found is None:
            raise UsageProblem(f"no such operation: {op_id}")
        return found

    def all(self) -> list[Operation]:
        with self._lock:
            return sorted(self._all.values(), key=lambda o: o.started_at, reverse=True)

    def stop(self, op_id: str) -> Operation:
        op = self.get(op_id)
        op.stop.set()
        return op

    def close(self, timeout: float | None = 120.0) -> None:
        """The server stops: every operation is stopped and waited for (each finishes its
        batch in flight and gives back what it holds), as Ctrl-C stops the CLI's."""
        with self._lock:
            self._closed = True
            running = list(self._all.values())
        for op in running:
            op.stop.set()
        for op in running:
            if op.thread is not None:
                op.thread.join(timeout)
