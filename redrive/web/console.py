"""The console's state, one per server: its settings, what it reads with, where its scans
come from, its clock, and the audit of what people do in it."""

from __future__ import annotations

import getpass
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from redrive.web.scans import ScanPerRequest, ScanSource
from redrive.web.security import LoginLimiter, Person
from redrive.web.settings import ConsoleSettings
from redrive.web.workspace import Workspace


def _local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's)
        return "local"


@dataclass
class Console:
    settings: ConsoleSettings
    workspace: Workspace
    scans: ScanSource | None = None
    """Where pages read scans (None: :class:`~redrive.web.scans.ScanPerRequest`)."""
    clock: Callable[[], float] = time.time
    local_user: str = field(default_factory=_local_user)
    limiter: LoginLimiter = field(init=False)
    extras: dict[str, Any] = field(default_factory=dict)
    """Room for what other modules keep per server (the actions' operations)."""

    def __post_init__(self) -> None:
        if self.scans is None:
            self.scans = ScanPerRequest(self.workspace, clock=self.clock)
        self.limiter = LoginLimiter(
            self.clock, self.settings.login_failures, self.settings.login_window
        )

    @property
    def source(self) -> ScanSource:
        assert self.scans is not None  # set in __post_init__
        return self.scans

    def audit(self, person: Person, what: str, details: Mapping[str, Any]) -> str:
        """Record in the ledger's audit trail (``redrive audit`` lists it) that ``person``
        did ``what``: an event is a run that starts and ends at once. Raises a
        RedriveError when it cannot be recorded: what is not audited is not done."""
        ledger = self.workspace.ledger_for_audit()
        run_id = f"web-{uuid.uuid4().hex[:12]}"
        try:
            ledger.start_run(
                run_id,
                command=f"web {what}",
                info={"person": person.to_json(), **details},
            )
            ledger.end_run(run_id, outcome="completed", counts={})
        finally:
            ledger.close()
        return run_id

    def close(self) -> None:
        # The actions' operations first (redrive.web.operations): each stops as Ctrl-C stops
        # the CLI's, giving back what it holds, before what they run with is closed.
        operations = self.extras.get("operations")
        if operations is not None:
            operations.close()
        self.source.close()
        self.workspace.close()
