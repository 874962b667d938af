"""``move``'s one entry: the move in this process (the engine, its ``--workers`` threads) or
spread over ``--processes`` (redrive.operations.move.processes)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from redrive.broker.base import Broker, DlqTarget
from redrive.dlq.receive_log import ReceiveLog
from redrive.ledger import Ledger
from redrive.operations.move import MoveEngine, MoveOptions, MoveResult
from redrive.operations.move.processes import move_in_processes
from redrive.operations.move.repair_step import repair_step
from redrive.runs.lifecycle import RunRecord
from redrive.runs.observer import NULL_OBSERVER, RunObserver
from redrive.runs.processes import ProcessesResult, Wiring, needs_wiring


def move(
    target: DlqTarget,
    ledger: Ledger | None,
    options: MoveOptions,
    *,
    broker_factory: Callable[[], Broker],
    receive_log: ReceiveLog | None = None,
    wiring: Wiring | None = None,
    observer: RunObserver[MoveResult] = NULL_OBSERVER,
    stop: threading.Event | None = None,
    record: RunRecord | None = None,
    processes: int = 1,
    s3_client_factory: Callable[[], Any] | None = None,
) -> MoveResult | ProcessesResult[MoveResult]:
    """Move the selected messages of ``target``'s DLQ: with ``processes`` above 1, in that
    many processes, each built from ``wiring``; else here, with ``broker_factory``. With
    edits (``options.repair``) the originals are archived first (``s3_client_factory``: for
    an ``s3://`` archive)."""
    if processes > 1:
        return move_in_processes(
            target,
            ledger,
            options,
            processes=processes,
            wiring=needs_wiring(wiring),
            observer=observer,
            stop=stop,
            record=record,
        )
    with repair_step(
        options.repair, execute=options.execute, s3_client_factory=s3_client_factory
    ) as repair:
        return MoveEngine(
            target,
            ledger,
            options,
            broker_factory=broker_factory,
            observer=observer,
            stop=stop,
            record=record,
            receive_log=receive_log,
            repair=repair,
        ).run()
