"""Killing the real ``redrive`` at a named step, never at a moment: the tests' one way to
crash a run where they mean to (no ``--rate`` pacing a run while a test polls and races it).

``python tests/kill_points.py ARGS`` is ``redrive ARGS`` with a few methods wrapped, in this
process and in every process it spawns (``--processes``: multiprocessing's spawn runs this
file again in each child as ``__mp_main__``), so that reaching a point acts on the process:

``move.received``, ``move.claimed``, ``move.sent``, ``move.recorded``, ``move.deleted``
    the points between a move's steps (what the engine tells its observer: ``claimed`` is
    after the claim, before the send; ``sent`` after the broker answered, before the ledger
    records it; ``recorded`` after SENT is recorded, before the DLQ copies are deleted).
``purge.received``, ``purge.archived``, ``purge.deleted``
    the same for a purge (``archived``: written to the archive, not yet deleted).
``amqp.unconfirmed``
    RabbitMQ: publishes written to the socket, their confirms not yet awaited (the first
    frame read after them, outside a publish). Found at the frame writer's level (every
    frame py-amqp writes for redrive goes through redrive's CorkedWriter), so it does not
    depend on how redrive's link pipelines its confirms.
``broker.extend``
    a hold renewed (the broker's ``extend`` answered).

Each rule (:class:`At`) acts on the ``nth`` time its point is reached in a process, and once
for the whole run: the process that acts first writes the rule's note (its pid and what it
knows), created exclusively, and every other process passes on. Actions: ``kill`` (SIGKILL
itself), ``stop`` (SIGSTOP itself: the test looks at what is left, then kills it),
``hang`` (the thread that reached it waits forever: the run stays alive at that step),
``hold`` (the thread waits until the test releases it, :meth:`KillPoints.release`: a run
paused at a step while the test looks, then let go) and ``kill-parent`` (SIGKILL the
process that spawned it: a ``--processes`` parent).

Rules travel in the environment (``REDRIVE_KILL_POINTS``), so spawned children read them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ENV = "REDRIVE_KILL_POINTS"
ACTIONS = ("kill", "stop", "hang", "hold", "kill-parent")


@dataclass(frozen=True)
class At:
    """Act at the ``nth`` time a process reaches ``point``."""

    point: str
    nth: int = 1
    do: str = "kill"

    def __post_init__(self) -> None:
        assert self.do in ACTIONS, self.do
        assert self.nth >= 1


class KillPoints:
    """The rules of one run, and the notes left by the processes that acted on them."""

    def __init__(self, folder: Path, *rules: At) -> None:
        self.folder = folder
        self.rules = rules
        folder.mkdir(parents=True, exist_ok=True)

    def argv(self, *args: str) -> list[str]:
        """The command line of ``redrive ARGS`` with these kill points."""
        return [sys.executable, str(Path(__file__).resolve()), *args]

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        spec = [
            {**asdict(rule), "note": str(self.note_path(i))} for i, rule in enumerate(self.rules)
        ]
        return {**(os.environ if base is None else base), ENV: json.dumps(spec)}

    def note_path(self, index: int) -> Path:
        rule = self.rules[index]
        return self.folder / f"{index}-{rule.point}-{rule.nth}.json"

    def note(self, index: int = 0) -> dict[str, Any] | None:
        """What the process that acted on rule ``index`` wrote (None: nobody acted yet)."""
        path = self.note_path(index)
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        # Written in one write before acting; an empty file is one being written.
        return json.loads(text) if text else None

    def release(self, index: int = 0) -> None:
        """Let go of the thread a ``hold`` rule keeps waiting (or, released before it is
        reached, let it pass)."""
        _release_path(str(self.note_path(index))).touch()

    def wait_for_note(self, index: int = 0, *, timeout: float = 120) -> dict[str, Any]:
        """The note of rule ``index``, once written (a bound for a run that never got there)."""
        deadline = time.monotonic() + timeout
        while (note := self.note(index)) is None:
            assert time.monotonic() < deadline, f"{self.rules[index]} not reached in {timeout} s"
            time.sleep(0.02)
        return note


def _release_path(note: str) -> Path:
    return Path(note + ".release")


def wait_until_leases_end(ledger: Path, *, timeout: float = 120) -> None:
    """Until no unended run of the ledger holds a lease: a killed run's claims can be taken
    over or skipped only then (its pid being gone already makes them in doubt)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.closing(sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)) as db:
            (leased,) = db.execute(
                "SELECT count(*) FROM runs WHERE ended_at IS NULL AND lease_until > ?",
                (time.time(),),
            ).fetchone()
        if not leased:
            return
        assert time.monotonic() < deadline, f"a run's lease outlived {timeout} s"
        time.sleep(0.1)


def end_leases(ledger: Path) -> None:
    """What waiting out the leases comes to, without the wait: the lease of every unended
    run of the ledger made to have run out. For a killed run given a long lease, so that a
    rerun started at once is inside it however slow the machine, and then past it."""
    with contextlib.closing(sqlite3.connect(ledger)) as db, db:
        db.execute(
            "UPDATE runs SET lease_until = ? WHERE ended_at IS NULL AND lease_until > ?",
            (time.time() - 1, time.time() - 1),
        )


def wait_until_stopped(pid: int, *, timeout: float = 60) -> None:
    """Until ``pid`` is stopped (SIGSTOP): the state ``T`` in /proc."""
    deadline = time.monotonic() + timeout
    while _state(pid) != "T":
        assert time.monotonic() < deadline, f"process {pid} did not stop in {timeout} s"
        time.sleep(0.01)


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    return stat.rsplit(")", 1)[1].split()[0]


# -- in the redrive process ---------------------------------------------------------------


class _Armed:
    """This process's rules and how often it reached each point."""

    def __init__(self, spec: Sequence[Mapping[str, Any]]) -> None:
        self.rules = list(spec)
        self.reached: Counter[str] = Counter()
        self.lock = threading.Lock()

    def reach(self, point: str, **detail: Any) -> None:
        with self.lock:
            self.reached[point] += 1
            n = self.reached[point]
            due = [r for r in self.rules if r["point"] == point and r["nth"] == n]
            acting = [r for r in due if self._claim_note(r, point, n, detail)]
        for rule in acting:
            _act(rule["do"], rule["note"])

    @staticmethod
    def _claim_note(rule: Mapping[str, Any], point: str, n: int, detail: Mapping[str, Any]) -> bool:
        """Write the rule's note unless another process did (then it acted, not this one)."""
        try:
            fd = os.open(rule["note"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return False
        note = {"pid": os.getpid(), "ppid": os.getppid(), "point": point, "nth": n, **detail}
        with os.fdopen(fd, "w") as file:
            file.write(json.dumps(note))
            file.flush()
            os.fsync(file.fileno())
        return True


def _act(action: str, note: str) -> None:
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "kill-parent":
        os.kill(os.getppid(), signal.SIGKILL)
    elif action == "hang":
        threading.Event().wait()
    elif action == "hold":
        # Another process's file: nothing here can be woken by the test, so it looks.
        release = _release_path(note)
        while not release.exists():
            time.sleep(0.02)


def _watch_observers(armed: _Armed) -> None:
    """Wrap the observer every move and purge run is given: its steps are the points."""
    from redrive.operations.move import engine
    from redrive.operations.purge import engine as purge
    from redrive.runs.observer import NULL_OBSERVER, RunObserver

    class Watched(RunObserver[Any]):
        def __init__(self, inner: RunObserver[Any], family: str) -> None:
            self.inner = inner
            self.family = family

        @property
        def wants_progress(self) -> bool:
            return self.inner.wants_progress

        def on_progress(self, result: Any) -> None:
            self.inner.on_progress(result)

        def on_plan(self, item: Any) -> None:
            self.inner.on_plan(item)

        def on_step(self, step: str) -> None:
            self.inner.on_step(step)
            armed.reach(f"{self.family}.{step}")

        def on_check(self, read: int) -> None:
            self.inner.on_check(read)

        def on_problem(self, problem: str) -> None:
            self.inner.on_problem(problem)

    def watching(cls: type, family: str) -> None:
        original: Callable[..., None] = cls.__init__  # type: ignore[misc]

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            kwargs["observer"] = Watched(kwargs.get("observer", NULL_OBSERVER), family)
            original(self, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[misc]

    watching(engine.MoveEngine, "move")
    watching(purge._Purge, "purge")


def _watch_amqp(armed: _Armed) -> None:
    """Publishes framed since the last frame read outside a publish: that read is the
    point before their confirms are awaited (py-amqp hears a confirm only by reading a
    frame). py-amqp's own ``basic_publish`` may read first (``drain_events(timeout=0)`` for
    a connection.blocked notice, which may settle earlier confirms): not that point."""
    import amqp.channel
    import amqp.connection
    from amqp import spec

    from redrive.broker.rabbitmq.frames import CorkedWriter

    written = Counter[str]()
    publishing = threading.local()
    write_frame = CorkedWriter.__call__
    write_publish = CorkedWriter.publish
    basic_publish = amqp.channel.Channel.basic_publish
    blocking_read = amqp.connection.Connection.blocking_read

    def counted_write(self: Any, *args: Any) -> Any:
        result = write_frame(self, *args)
        if args[0] == 1 and args[2] == spec.Basic.Publish:  # (type, channel, method, ...)
            with armed.lock:
                written["publishes"] += 1
        return result

    def counted_publish(self: Any, *args: Any) -> Any:
        result = write_publish(self, *args)
        with armed.lock:
            written["publishes"] += 1
        return result

    def marked_publish(self: Any, *args: Any, **kwargs: Any) -> Any:
        publishing.inside = True
        try:
            return basic_publish(self, *args, **kwargs)
        finally:
            publishing.inside = False

    def watched_read(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(publishing, "inside", False):
            with armed.lock:
                publishes, written["publishes"] = written["publishes"], 0
            if publishes:
                armed.reach("amqp.unconfirmed", publishes=publishes)
        return blocking_read(self, *args, **kwargs)

    CorkedWriter.__call__ = counted_write  # type: ignore[method-assign]
    CorkedWriter.publish = counted_publish  # type: ignore[method-assign]
    amqp.channel.Channel.basic_publish = marked_publish
    amqp.connection.Connection.blocking_read = watched_read


def _watch_extends(armed: _Armed) -> None:
    from redrive.broker.rabbitmq.broker import RabbitBroker
    from redrive.broker.sqs.broker import SqsBroker

    for cls in (SqsBroker, RabbitBroker):
        original = cls.extend

        def extend(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            result = _original(self, *args, **kwargs)
            armed.reach("broker.extend", entries=len(result.ok))
            return result

        cls.extend = extend  # type: ignore[method-assign]


def arm() -> None:
    """Wrap the points this process's rules name (none: change nothing)."""
    spec = json.loads(os.environ.get(ENV) or "[]")
    if not spec:
        return
    armed = _Armed(spec)
    points = {rule["point"] for rule in spec}
    if any(p.startswith(("move.", "purge.")) for p in points):
        _watch_observers(armed)
    if "amqp.unconfirmed" in points:
        _watch_amqp(armed)
    if "broker.extend" in points:
        _watch_extends(armed)


if __name__ in ("__main__", "__mp_main__"):
    # This checkout's redrive, as ``python -m redrive`` from the root finds it.
    sys.path.insert(0, str(ROOT))
    with contextlib.suppress(ValueError):
        sys.path.remove(str(Path(__file__).resolve().parent))
    arm()
    if __name__ == "__main__":
        from redrive.cli import main

        sys.argv[0] = "redrive"
        main()
