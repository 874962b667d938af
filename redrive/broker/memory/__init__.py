"""An in-memory broker, one backend of the broker seam (:mod:`redrive.broker.base`), for
tests only: ``memory://NAME`` opens the broker called NAME of this process (its queues are
gone with the process; nothing persists, and ``--processes`` children cannot see them).

In a test::

    store = memory_store("onion")            # or open_broker("memory://onion", ...)
    store.create_queue("onion-dlq")
    store.create_queue("onion", dead_letter_queue="onion-dlq", max_receive_count=3)
    broker = MemoryBroker(store)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from redrive.broker.memory.broker import MemoryBroker
from redrive.broker.memory.store import SCHEME, MemoryStore, forget_store, memory_store

if TYPE_CHECKING:
    from redrive.broker import BrokerSettings

__all__ = [
    "SCHEME",
    "MemoryBroker",
    "MemoryStore",
    "forget_store",
    "memory_store",
    "open_from_settings",
    "open_memory",
]


def open_memory(url: str) -> MemoryBroker:
    """The broker ``memory://NAME`` names."""
    return MemoryBroker(memory_store(url.partition("://")[2].rstrip("/")))


def open_from_settings(
    settings: BrokerSettings, aws: object, region: str | None = None
) -> MemoryBroker:
    """The in-memory broker at the settings' URL (its row in
    :data:`redrive.broker.BACKENDS`); AWS settings and regions are not its."""
    return open_memory(str(settings.url))
