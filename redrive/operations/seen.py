"""What a run's ``--task`` or ``--message-id`` filter saw, to say what it missed when it
matched nothing (:class:`redrive.selection.Sightings`), shared by the run's workers."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from redrive.broker.base import Delivery
from redrive.messages import TaskInfo
from redrive.selection import FilterMisses, Selection, Sightings


class SeenByFilters:
    """Sightings under a lock of their own; nothing is kept for a selection without a task
    or message-id filter."""

    def __init__(self, selection: Selection) -> None:
        wanted = selection.tasks or selection.message_ids
        self._sightings = Sightings(selection) if wanted else None
        self._lock = threading.Lock()

    def add(self, decoded: Sequence[tuple[Delivery, TaskInfo]]) -> None:
        if self._sightings is None:
            return
        with self._lock:
            for message, info in decoded:
                self._sightings.add(info.task, message.message_id)

    def misses(self) -> FilterMisses | None:
        with self._lock:
            return self._sightings.misses() if self._sightings is not None else None

    def sightings(self) -> Sightings | None:
        """What was seen, for merging with other processes' (``--processes``)."""
        with self._lock:
            return self._sightings
