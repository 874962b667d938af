"""The delivery tags a channel holds unacked, about one byte each (issue 24).

A read-only scan holds every delivery until its end (RabbitMQ has no peek): a dict of tag ->
queue name cost ~85 bytes per held delivery, 8.4 MB at 100,000. Delivery tags on a channel
are consecutive integers from 1, so a bytearray indexed by tag holds each one's queue as a
small slot (0: not held). A pointer to the lowest held tag moves only forward, found by a
C-level regex search over the bytes it skips, so finding it is amortised O(1) per tag
however long a run of settled tags it passes; the bytes below it are dropped once they are
half of the array (a move that acks as it goes keeps it small).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

#: A slot value: the tag's queue is in the overflow map (a channel that held more than
#: MAX_SLOTS queues at once, which redrive's scans never do).
_OVERFLOW: Final = 255
MAX_SLOTS: Final = _OVERFLOW - 1
_HELD: Final = re.compile(b"[^\x00]")
#: Dead bytes below the lowest held tag kept before the array is compacted.
_COMPACT_AT: Final = 4096


class HeldTags:
    """Delivery tags held on one channel and their queues' names, added in delivery order
    (tags only grow on a channel). Not thread-safe: the lane's lock guards it."""

    __slots__ = ("_counts", "_lowest", "_names", "_offset", "_overflow", "_slot_of", "_slots")

    def __init__(self) -> None:
        self._slots = bytearray()
        """Index ``tag - _offset``: the tag's queue slot, 0 if not held."""
        self._offset = 1
        self._lowest = 1
        """Every tag below it is not held; it is held itself unless none is."""
        self._names: list[str] = [""]
        self._slot_of: dict[str, int] = {}
        self._counts: dict[str, int] = {}
        self._overflow: dict[int, str] = {}

    def __len__(self) -> int:
        return sum(self._counts.values())

    def __contains__(self, tag: object) -> bool:
        if not isinstance(tag, int):
            return False
        i = tag - self._offset
        return 0 <= i < len(self._slots) and self._slots[i] != 0

    def add(self, tag: int, queue: str) -> None:
        """Hold ``tag`` (not below any tag ever added since the last clear)."""
        i = tag - self._offset
        if i < 0:
            raise ValueError(f"delivery tag {tag} is below the channel's settled ones")
        if i < len(self._slots):
            if self._slots[i]:
                raise ValueError(f"delivery tag {tag} is held already")
        else:
            self._slots.extend(bytes(i + 1 - len(self._slots)))
        empty = not self._counts
        slot = self._slot(queue)
        self._slots[i] = slot
        if slot == _OVERFLOW:
            self._overflow[tag] = queue
        self._counts[queue] = self._counts.get(queue, 0) + 1
        if empty or tag < self._lowest:
            self._lowest = tag

    def _slot(self, queue: str) -> int:
        slot = self._slot_of.get(queue)
        if slot is None:
            if len(self._names) > MAX_SLOTS:
                return _OVERFLOW
            slot = self._slot_of[queue] = len(self._names)
            self._names.append(queue)
        return slot

    def remove(self, tag: int) -> str:
        """Settle a held tag: its queue's name (KeyError if it is not held)."""
        if tag not in self:
            raise KeyError(tag)
        i = tag - self._offset
        slot = self._slots[i]
        queue = self._overflow.pop(tag) if slot == _OVERFLOW else self._names[slot]
        self._slots[i] = 0
        self._counts[queue] -= 1
        if not self._counts[queue]:
            del self._counts[queue]
        if tag == self._lowest:
            self._lowest = self._next_held(tag + 1)
            self._compact()
        return queue

    def held(self, queue: str) -> int:
        return self._counts.get(queue, 0)

    def lowest(self) -> int | None:
        """The channel's lowest held tag (None: none is held)."""
        return self._lowest if self._counts else None

    def lowest_run(self, tags: Sequence[int]) -> int:
        """How many of ``tags`` (ascending) are, from the first, exactly the channel's
        lowest held tags: those one ``multiple`` ack settles and nothing else. Scans only
        the settled gaps between them, which the lowest pointer then skips once they go."""
        expected = self.lowest()
        for count, tag in enumerate(tags):
            if tag != expected:
                return count
            expected = self._next_held(tag + 1)
        return len(tags)

    def _next_held(self, tag: int) -> int:
        """The lowest held tag from ``tag`` on (past the array's end if none)."""
        found = _HELD.search(self._slots, max(0, tag - self._offset))
        return self._offset + (found.start() if found is not None else len(self._slots))

    def _compact(self) -> None:
        dead = self._lowest - self._offset
        if dead >= _COMPACT_AT and dead * 2 >= len(self._slots):
            del self._slots[:dead]
            self._offset = self._lowest

    def clear(self) -> None:
        """A new channel: its tags start from 1 again."""
        self._slots = bytearray()
        self._offset = self._lowest = 1
        self._names = [""]
        self._slot_of.clear()
        self._counts.clear()
        self._overflow.clear()
