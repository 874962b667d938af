"""Copying one ledger into another (``redrive ledger copy SRC DST``): a team moving from one
machine's SQLite file to a shared PostgreSQL ledger keeps every key it has ever claimed, so
the copy still guards each one (a task sent before the move is never sent again after it).

Every run and every key is copied as it stands, with its owner, its times and its lease,
so a claim in doubt stays in doubt, and a key already in the destination is kept as it is
there (its word stands: it may be newer). Runs go first, so that a copied claim's owner and
lease are there before the claim is. A source with a live run is refused: a key that run
claimed after the copy read would be missing from the destination.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from redrive.errors import LedgerError
from redrive.ledger.base import Entry, KeyState, Ledger, RunInfo

COPY_PAGE = 500
# Runs that heartbeated within this long (or whose lease runs) may still claim keys.
LIVE_AFTER_S = 120.0


@runtime_checkable
class Loadable(Protocol):
    """A ledger that takes rows as they stand in another (a copy's destination)."""

    def load_runs(self, runs: Sequence[RunInfo]) -> int:
        """Insert each run absent here, as it stands; the number inserted."""
        ...

    def load_entries(self, entries: Sequence[Entry], *, legacy_keys: bool) -> int:
        """Insert each key absent here, as it stands (one transaction); the number
        inserted. ``legacy_keys``: the source may hold keys of the legacy form, and so now
        may this ledger."""
        ...


@dataclass(frozen=True, slots=True)
class CopyResult:
    runs: int  # runs in the source
    runs_copied: int  # of them, absent from the destination, so copied
    keys: int
    keys_copied: int

    def describe(self, source: str, destination: str) -> str:
        kept = (self.runs - self.runs_copied, self.keys - self.keys_copied)
        line = (
            f"copied {self.keys_copied} keys and {self.runs_copied} runs from {source} to "
            f"{destination}"
        )
        if any(kept):
            line += f" ({kept[0]} runs and {kept[1]} keys were there already, kept as they were)"
        return line


def copy_ledger(source: Ledger, destination: Ledger) -> CopyResult:
    """Copy every run and key of ``source`` into ``destination`` (see the module)."""
    if not isinstance(destination, Loadable):
        raise LedgerError(
            f"a ledger cannot be copied into {destination.location} (its kind takes no "
            "copies); copy into a SQLite file, a DynamoDB table or a PostgreSQL database"
        )
    if source.location == destination.location:
        raise LedgerError(f"{source.location} is both the source and the destination of the copy")
    live = source.live_runs(stale_after=LIVE_AFTER_S)
    if live:
        raise LedgerError(
            f"run {live[0].run_id} is live on {source.location} (it may still claim keys); "
            "let every run end, then copy"
        )
    runs = source.runs()
    runs_copied = destination.load_runs(runs)
    if source.legacy_keys:
        destination.load_entries([], legacy_keys=True)
    keys = keys_copied = 0
    for state in KeyState:
        page: list[Entry] = []
        for entry in source.iter_keys(state, page_size=COPY_PAGE):
            page.append(entry)
            if len(page) == COPY_PAGE:
                keys_copied += destination.load_entries(page, legacy_keys=source.legacy_keys)
                keys, page = keys + len(page), []
        if page:
            keys_copied += destination.load_entries(page, legacy_keys=source.legacy_keys)
            keys += len(page)
    return CopyResult(len(runs), runs_copied, keys, keys_copied)
