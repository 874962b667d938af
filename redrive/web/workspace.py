"""What the console reads with: the layout, the brokers, Celery's result backend, the receive
log and the ledger, resolved once from the CLI's global options when ``redrive web`` starts
(as every command resolves them), then shared by the server's threads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redrive.broker import BrokerSettings, resolve_target
from redrive.broker.base import Broker, DlqTarget
from redrive.celery.knowledge import TaskKnowledge
from redrive.celery.results import ResultLookup
from redrive.config import Layout
from redrive.dlq import delivery_limit
from redrive.dlq.receive_log import ReceiveLog
from redrive.dlq.scan import shared_by_workers
from redrive.errors import UsageProblem
from redrive.inspection.scan import DEFAULT_LEASE
from redrive.ledger import Ledger, default_ledger_path, open_ledger


@dataclass
class Workspace:
    """``open_broker(region)`` opens a new broker (the CLI's options decided which);
    each server thread keeps its own, but for a broker every worker may share."""

    layout: Layout
    open_broker: Callable[[str | None], Broker]
    broker: BrokerSettings = field(default_factory=BrokerSettings)
    """What ``open_broker`` opens (the CLI's broker options): whose credentials it runs on."""
    results: ResultLookup | None = None
    receive_log: ReceiveLog | None = None
    knowledge: TaskKnowledge | None = None
    """The Celery app's routes and registry (inspect's annotations), when one is named."""
    ledger_uri: str | None = None
    """--ledger (or the config's); None: the default file."""
    allow_delivery_limit: bool = False
    lease: int = DEFAULT_LEASE
    client_factory: Callable[..., Any] | None = None
    """AWS clients (a DynamoDB ledger's)."""
    ignores_result: Callable[[str], bool] = lambda task: False
    """Whether the Celery app says a task keeps no result (``ledger resolve``'s evidence)."""
    _local: threading.local = field(default_factory=threading.local, repr=False)
    _shared: dict[str | None, Broker] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def broker_for(self, region: str | None = None) -> Broker:
        with self._lock:
            if (shared := self._shared.get(region)) is not None:
                return shared
        own: dict[str | None, Broker] = self._local.__dict__.setdefault("brokers", {})
        if region not in own:
            broker = self.open_broker(region)
            if shared_by_workers(broker):
                with self._lock:
                    broker = self._shared.setdefault(region, broker)
            own[region] = broker
        return own[region]

    def broker_of(self, region: str | None) -> Callable[[], Broker]:
        """Brokers for a scan's worker threads (each its own, as the CLI's)."""
        return lambda: self.broker_for(region)

    def target(self, name: str) -> DlqTarget:
        """The TARGET as a DLQ and its sources; one whose DLQ counts deliveries toward a
        limit is refused as the CLI refuses it (without --allow-delivery-limit)."""
        found = resolve_target(self.layout, name, self.broker_for)
        try:
            delivery_limit.guard(
                found.dlq,
                self.broker_for(found.region).capabilities,
                lambda: self.receive_log,
                allowed=self.allow_delivery_limit,
            )
        except delivery_limit.DeliveryLimitRisk as exc:
            raise UsageProblem(str(exc)) from None
        return found

    def ledger(self) -> Ledger | None:
        """The ledger, opened for one read (the caller closes it); None when there is none
        yet (the console never makes one by reading)."""
        uri = self.ledger_uri
        if uri is None and not default_ledger_path().exists():
            return None
        return open_ledger(uri, client_factory=self.client_factory)

    def ledger_for_audit(self) -> Ledger:
        """The ledger the audit trail is written to (made if it is a file not made yet)."""
        return open_ledger(self.ledger_uri, client_factory=self.client_factory)

    def close(self) -> None:
        if self.results is not None:
            self.results.close()
        if self.receive_log is not None:
            self.receive_log.close()
