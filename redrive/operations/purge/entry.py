"""``purge`` and ``archive``'s one entry: the run in this process (its ``--workers``
threads) or spread over ``--processes`` (redrive.operations.purge.processes)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from redrive.broker.base import Broker, DlqTarget
from redrive.dlq.receive_log import ReceiveLog
from redrive.ledger import Ledger
from redrive.operations.purge.engine import PurgeOptions, PurgeResult, run_purge
from redrive.operations.purge.processes import purge_in_processes
from redrive.runs.observer import NULL_OBSERVER, RunObserver
from redrive.runs.processes import ProcessesResult, Wiring, needs_wiring


def purge(
    target: DlqTarget,
    options: PurgeOptions,
    *,
    broker_factory: Callable[[], Broker],
    ledger: Ledger | None = None,
    command: str = "purge",
    record: Mapping[str, Any] | None = None,
    s3_client_factory: Callable[[], Any] | None = None,
    receive_log: ReceiveLog | None = None,
    wiring: Wiring | None = None,
    observer: RunObserver[PurgeResult] = NULL_OBSERVER,
    stop: threading.Event | None = None,
    processes: int = 1,
) -> PurgeResult | ProcessesResult[PurgeResult]:
    """Archive (and, unless ``options.delete`` is off, delete) the selected messages of
    ``target``'s DLQ (:func:`run_purge`): with ``processes`` above 1, in that many
    processes, each built from ``wiring`` and archiving to its own file."""
    if processes > 1:
        return purge_in_processes(
            target,
            options,
            processes=processes,
            wiring=needs_wiring(wiring),
            ledger=ledger,
            command=command,
            record=record,
            observer=observer,
            stop=stop,
        )
    return run_purge(
        target,
        options,
        broker_factory=broker_factory,
        ledger=ledger,
        command=command,
        record=record,
        s3_client_factory=s3_client_factory,
        observer=observer,
        stop=stop,
        receive_log=receive_log,
    )
