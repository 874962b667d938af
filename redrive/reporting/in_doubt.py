"""Every in-doubt key of a ledger: claimed by a run that ended (or died) before the broker
confirmed its send, so its task may or may not be in the target queue.

A move's summary lists the first :data:`redrive.operations.move.MAX_LISTED` it meets; this
lists them all, read from the ledger a page at a time (:meth:`Ledger.iter_keys`), so a
ledger of any size lists in bounded memory: a page of keys, and the record of each run that
owns one (runs are few; keys may be millions).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from redrive.durations import iso_utc
from redrive.keys import task_id_of_key
from redrive.ledger import Entry, KeyState, Ledger
from redrive.ledger.base import KEY_PAGE
from redrive.reporting.audit import find_run, own_runs
from redrive.runs.lifecycle import run_is_live


@dataclass(frozen=True, slots=True)
class InDoubt:
    """One in-doubt key as the ledger has it: the DLQ message it was claimed for, the run
    that claimed it, and the queue it was being sent to."""

    entry: Entry

    @property
    def task_id(self) -> str | None:
        return task_id_of_key(self.entry.key)

    def to_json(self) -> dict[str, Any]:
        entry = self.entry
        return {
            "message_id": entry.message_id,
            "task": entry.task,
            "task_id": self.task_id,
            "key": entry.key,
            "target": entry.target,
            "run_id": entry.run_id,
            "claimed_at": iso_utc(entry.updated_at),
        }


@dataclass(slots=True)
class Tally:
    """What a listing counted as it went: the keys it listed, and the claims it left out
    because their run is live (being sent now: not in doubt)."""

    listed: int = 0
    busy: int = 0


def in_doubt(
    ledger: Ledger,
    *,
    run_id: str | None = None,
    tally: Tally | None = None,
    now: Callable[[], float] = time.time,
    page_size: int = KEY_PAGE,
) -> Iterator[InDoubt]:
    """The ledger's in-doubt keys (those of the run ``run_id`` names, or a prefix of it, and
    of its processes, when given), as :meth:`Ledger.iter_keys` reads them. A RedriveError
    for a ``run_id`` the ledger does not have, before anything is listed."""
    owners: list[str | None] = [None]
    if run_id is not None:
        owners = [*own_runs(ledger, find_run(ledger, run_id))]
    return _listing(ledger, owners, tally or Tally(), now, page_size)


def _listing(
    ledger: Ledger,
    owners: list[str | None],
    tally: Tally,
    now: Callable[[], float],
    page_size: int,
) -> Iterator[InDoubt]:
    live: dict[str, bool] = {}
    for owner in owners:
        for entry in ledger.iter_keys(KeyState.CLAIMED, run_id=owner, page_size=page_size):
            if entry.run_id not in live:
                run = ledger.run(entry.run_id)
                # As the engine decides: a claim whose run record is gone is in doubt too.
                live[entry.run_id] = run is not None and run_is_live(run, now())
            if live[entry.run_id]:
                tally.busy += 1
                continue
            tally.listed += 1
            yield InDoubt(entry)
