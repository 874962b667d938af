"""One run's life in the ledger, for every operation that changes something (move, purge,
archive, replay, apply): its id, the record of its start (the audit trail's who, what and
filters), its heartbeats, and the record of its end with its counts.

A run is *live* while it may still be sending what it claimed: the next run treats the
claims of a live run as busy and those of a dead one as in doubt (:func:`run_is_live`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol

from redrive.archive.storage import absolute_location
from redrive.ledger import Ledger, RunInfo
from redrive.selection import Selection

Outcome = Literal["completed", "interrupted", "failed"]


class Finished(Protocol):
    """A run's result as a command ends with it (move, purge, replay, apply, and the merged
    result of a ``--processes`` run of any of them)."""

    @property
    def dry_run(self) -> bool: ...

    @property
    def interrupted(self) -> bool: ...

    @property
    def needs_attention(self) -> bool: ...

    def to_json(self) -> dict[str, Any]: ...


# A run that has not heartbeaten for this long, and whose lease has run out, is dead.
STALE_AFTER = 120.0
HEARTBEAT_EVERY = 5.0

_ACTIVE_RUNS: set[str] = set()
"""Runs alive in this process: a run id recorded with our pid but not in here has crashed."""


@dataclass(frozen=True, slots=True)
class RunRecord:
    """What an executed run's ledger record says of it: the command line, and the audit
    trail's who and what (:func:`audit_record`)."""

    command: str
    info: Mapping[str, Any] = field(default_factory=dict)
    run_id: str | None = None
    """The run's id, when its caller chose it (a child of ``--processes``: its parent's id
    and its number); None: a new one."""


def audit_record(
    *,
    command_line: str,
    target: str,
    filters: Mapping[str, Any],
    ledger: str,
    archive: str | None,
    identity: Mapping[str, str],
    caller: Mapping[str, Any] | None = None,
    sqs_client: str | None = None,
    broker_server: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What an executed run records about itself when it starts: the audit trail's who
    (``identity``: the person and where they asked from; ``caller``: whom the broker knows
    the run as) and what.

    Paths are made absolute and the working directory is kept: an incident note written
    from another shell must still find the archive and paste the command back.
    ``sqs_client``: which client called SQS (``--sqs-client``), kept when given;
    ``broker_server``: the broker and its version (:class:`~redrive.broker.server.BrokerServer`
    as JSON), kept when known.
    """
    return {
        "command_line": command_line,
        "target": target,
        "filters": dict(filters),
        "ledger": ledger,
        "archive": absolute_location(archive),
        "cwd": working_directory(),
        **({"sqs_client": sqs_client} if sqs_client is not None else {}),
        **({"broker_server": dict(broker_server)} if broker_server is not None else {}),
        **identity,
        **(caller or {}),
    }


def audit_filters(selection: Selection) -> dict[str, Any]:
    """A run's filters as the audit trail keeps them."""
    filters = selection.describe()
    if len(filters["message_ids"]) > 10:
        # A plan's ids belong in the plan file, not in every audit listing.
        filters["message_ids"] = f"{len(filters['message_ids'])} ids (from a plan)"
    return filters


def working_directory() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # the directory was removed under the shell
        return None


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


class RunLifecycle:
    """The ledger's record of one run. As a context manager it records the start, and on the
    way out the end: ``failed`` on an exception, ``interrupted`` on KeyboardInterrupt or when
    ``stop`` is set, else ``completed`` (unless :meth:`end` recorded one already).

    A BaseException other than KeyboardInterrupt (a simulated crash in the tests) records
    nothing, as a real kill would not: the run's claims are then in doubt.

    A run that is not executed has no id and records nothing; an executed one without a
    ledger (``archive``) has an id (its archive records name it) and records nothing.
    """

    def __init__(
        self,
        ledger: Ledger | None,
        *,
        execute: bool,
        command: str,
        info: Mapping[str, Any] | None = None,
        lease: float = 30.0,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.time,
        counts: Callable[[], Mapping[str, int]] = dict,
        end_info: Callable[[], Mapping[str, Any] | None] = lambda: None,
        run_id: str | None = None,
    ) -> None:
        self.ledger = ledger
        self.run_id = (run_id or new_run_id()) if execute else None
        self.command = command
        self.info = dict(info or {})
        self.lease = lease
        self.stop = stop or threading.Event()
        self.clock = clock
        self.counts = counts
        """The counts the end records (read when the run ends)."""
        self.end_info = end_info
        """What the end adds to the run's info (read when the run ends)."""
        self.outcome: Outcome | None = None
        self._lock = threading.Lock()
        self._last_heartbeat = 0.0

    @property
    def recording(self) -> bool:
        return self.ledger is not None and self.run_id is not None

    def start(self) -> None:
        if self.ledger is None or self.run_id is None:
            return
        self.ledger.start_run(
            self.run_id,
            command=self.command,
            info={"pid": os.getpid(), "host": socket.gethostname(), **self.info},
        )
        _ACTIVE_RUNS.add(self.run_id)

    def heartbeat(self) -> None:
        """Say the run lives (at most every HEARTBEAT_EVERY seconds), leasing ``lease`` on."""
        if self.ledger is None or self.run_id is None:
            return
        now = time.monotonic()
        with self._lock:
            if now - self._last_heartbeat < HEARTBEAT_EVERY:
                return
            self._last_heartbeat = now
        self.ledger.heartbeat(self.run_id, lease_until=self.clock() + self.lease)

    def end(self, outcome: Outcome) -> None:
        """Record the run's end (once): its outcome, :attr:`counts` and :attr:`end_info`."""
        if self.outcome is not None:
            return
        self.outcome = outcome
        if self.ledger is None or self.run_id is None:
            return
        try:
            self.ledger.end_run(
                self.run_id, outcome=outcome, counts=dict(self.counts()), info=self.end_info()
            )
        finally:
            _ACTIVE_RUNS.discard(self.run_id)

    def __enter__(self) -> RunLifecycle:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is None:
                self.end("interrupted" if self.stop.is_set() else "completed")
            elif isinstance(exc, (Exception, KeyboardInterrupt)):
                # A second Ctrl-C is an interruption the operator asked for, not a failure.
                how: Outcome = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
                with contextlib.suppress(Exception):
                    self.end(how)
        finally:
            # Process-local, dropped however the run ends: after a crash that skipped the
            # end, this run sends nothing more, so its claims are in doubt (as they are
            # when a real crash takes the whole process and this set with it).
            if self.run_id is not None:
                _ACTIVE_RUNS.discard(self.run_id)


def run_is_live(run: RunInfo, now: float) -> bool:
    """Whether the run that holds a claim may still be sending it."""
    if run.ended_at is not None:
        return False
    info = run.info or {}
    if info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int):
        pid = int(info["pid"])
        if pid == os.getpid():
            return run.run_id in _ACTIVE_RUNS
        if not _process_runs(pid):
            return False
    return run.is_live(now=now, stale_after=STALE_AFTER)


def _process_runs(pid: int) -> bool:
    """Whether process ``pid`` of this host still runs. A killed process its parent has not
    yet reaped (a zombie) still answers a signal 0, but it sends nothing more: dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        # /proc/PID/stat: "PID (COMM) STATE ...": the state follows the last ")".
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (not Linux), or it went meanwhile: the lease decides
    return stat.rpartition(")")[2].split()[:1] != ["Z"]
