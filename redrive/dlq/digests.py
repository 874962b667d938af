"""A set of 8-byte message digests at 11 to 22 bytes each (issue 24).

A scan remembers every message it has seen until it ends (an inspect: the whole queue) as a
64-bit digest. A ``set[int]`` costs ~78 bytes apiece (an int object and its share of the hash
table): 7.8 MB at 100,000. Here the digests themselves are the table: open addressing with
linear probing over an ``array('Q')``, kept at most three quarters full. Digests are blake2b
output, so their low bits are a good enough slot. Deletion shifts the entries after a hole
back (no tombstones), so a move that forgets what it deleted leaves the table clean.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Final

_EMPTY: Final = 0
_FIRST_SLOTS: Final = 1024


class DigestSet:
    """Unsigned 64-bit digests; what a DlqScan asks of a set of them. Not thread-safe."""

    __slots__ = ("_count", "_has_zero", "_mask", "_table")

    def __init__(self, digests: Iterable[int] = ()) -> None:
        self._table = array("Q", bytes(8 * _FIRST_SLOTS))
        self._mask = _FIRST_SLOTS - 1
        self._count = 0
        self._has_zero = False
        """The digest 0 marks an empty slot, so it is kept aside."""
        self.update(digests)

    def __len__(self) -> int:
        return self._count + self._has_zero

    def __contains__(self, digest: object) -> bool:
        if not isinstance(digest, int):
            return False
        if digest == _EMPTY:
            return self._has_zero
        return self._table[self._probe(digest)] == digest

    def _probe(self, digest: int) -> int:
        """The slot holding ``digest``, else the empty slot that ends its run."""
        table, mask = self._table, self._mask
        i = digest & mask
        while (held := table[i]) != _EMPTY and held != digest:
            i = (i + 1) & mask
        return i

    def add(self, digest: int) -> None:
        if digest == _EMPTY:
            self._has_zero = True
            return
        i = self._probe(digest)
        if self._table[i] == digest:
            return
        self._table[i] = digest
        self._count += 1
        if self._count * 4 > len(self._table) * 3:
            self._grow()

    def update(self, digests: Iterable[int]) -> None:
        for digest in digests:
            self.add(digest)

    def discard(self, digest: int) -> None:
        if digest == _EMPTY:
            self._has_zero = False
            return
        i = self._probe(digest)
        table, mask = self._table, self._mask
        if table[i] != digest:
            return
        # Move back each later entry of the run that the hole would hide from its own slot.
        j = i
        while (held := table[j := (j + 1) & mask]) != _EMPTY:
            home = held & mask
            if (i < home <= j) if i <= j else (home > i or home <= j):
                continue
            table[i] = held
            i = j
        table[i] = _EMPTY
        self._count -= 1

    def _grow(self) -> None:
        old = self._table
        table = self._table = array("Q", bytes(16 * len(old)))
        mask = self._mask = len(table) - 1
        for digest in old:
            if digest != _EMPTY:
                i = digest & mask
                while table[i] != _EMPTY:
                    i = (i + 1) & mask
                table[i] = digest
