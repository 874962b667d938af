"""``replay``'s one entry: the replay in this process (its ``--workers`` threads) or spread
over ``--processes`` (redrive.operations.replay.processes)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from redrive.broker.base import Broker, QueueRef
from redrive.ledger import Ledger
from redrive.operations.move import MoveOptions, MoveResult
from redrive.operations.replay.engine import ReplayResult, replay_archive
from redrive.operations.replay.processes import replay_in_processes
from redrive.runs.lifecycle import RunRecord
from redrive.runs.observer import NULL_OBSERVER, RunObserver
from redrive.runs.processes import ProcessesResult, Wiring, needs_wiring


def replay(
    source: str,
    to: QueueRef | None,
    ledger: Ledger | None,
    options: MoveOptions,
    *,
    broker_factory: Callable[[], Broker],
    s3_client_factory: Callable[[], Any] | None = None,
    wiring: Wiring | None = None,
    observer: RunObserver[MoveResult] = NULL_OBSERVER,
    stop: threading.Event | None = None,
    record: RunRecord | None = None,
    allow_partial: bool = False,
    processes: int = 1,
) -> ReplayResult | ProcessesResult[ReplayResult]:
    """Replay the archive at ``source`` (:func:`replay_archive`): with ``processes`` above
    1, in that many processes, each built from ``wiring``."""
    if processes > 1:
        return replay_in_processes(
            source,
            to,
            ledger,
            options,
            processes=processes,
            wiring=needs_wiring(wiring),
            s3_client_factory=s3_client_factory,
            observer=observer,
            stop=stop,
            record=record,
            allow_partial=allow_partial,
        )
    return replay_archive(
        source,
        to,
        ledger,
        options,
        broker_factory=broker_factory,
        s3_client_factory=s3_client_factory,
        observer=observer,
        stop=stop,
        record=record,
        allow_partial=allow_partial,
    )
