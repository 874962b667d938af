"""A RabbitMQ queue's delivery limit, as the server works it out (issue 24).

Only quorum queues count deliveries. A limit comes from the queue's ``x-delivery-limit``
argument or its (operator) policy's ``delivery-limit``: the lower of the two, except on 4.x,
where a negative one (``-1``: unlimited) on either side makes the higher win. With neither,
RabbitMQ 3.x sets none, and 4.x gives every quorum queue a default of 20 (rabbitmq-server
#11937): a quorum DLQ declared with no limit at all still drops (or dead-letters) a message
past its 20th delivery there, and every read by redrive is one. The server's version is the
management API's ``/api/overview`` ``rabbitmq_version``.

Pure: the caller gathers what is set (:mod:`.queues`) and the version.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

#: RabbitMQ 4.x's delivery limit of a quorum queue that sets none.
DEFAULT_QUORUM_LIMIT: Final = 20
DEFAULT_ORIGIN: Final = (
    f", RabbitMQ 4.x's default of {DEFAULT_QUORUM_LIMIT} for quorum queues (none is set)"
)
UNKNOWN_VERSION_ORIGIN: Final = (
    f", RabbitMQ 4.x's default of {DEFAULT_QUORUM_LIMIT} for quorum queues (none is set, "
    "and the server's version is not known: 3.x has no default)"
)


@dataclass(frozen=True, slots=True)
class DeliveryLimit:
    """A limit and where it comes from, as words that follow ``x-delivery-limit N`` in a
    sentence (`` from policy P``, `` as its own argument``)."""

    value: int
    origin: str


def major_version(version: str | None) -> int | None:
    """``3`` of ``3.10.8``, ``4`` of ``4.0.0-rc.2``; None for no version or another form."""
    head = (version or "").split(".", 1)[0]
    return int(head) if head.isdigit() else None


def effective_limit(
    set_limits: Sequence[DeliveryLimit], version: str | None, queue_type: str
) -> DeliveryLimit | None:
    """The limit RabbitMQ ``version`` applies to a queue of ``queue_type`` (``classic``,
    ``quorum``, ``stream``) given the limits set on it (its argument's, its policy's), or
    None for no limit. An unknown version is read as 4.x: a guard against reading toward a
    limit errs toward seeing one. A limit set on a classic queue is taken as set (RabbitMQ
    ignores it there), never a default."""
    major = major_version(version)
    four = major is None or major >= 4
    if not set_limits:
        if queue_type != "quorum" or not four:
            return None
        origin = DEFAULT_ORIGIN if major is not None else UNKNOWN_VERSION_ORIGIN
        return DeliveryLimit(DEFAULT_QUORUM_LIMIT, origin)
    negative = any(limit.value < 0 for limit in set_limits)
    pick = max if four and negative else min
    chosen = pick(set_limits, key=lambda limit: limit.value)
    # 0 or less: none (4.x reads -1 as unlimited; 3.x's own limits are positive).
    return chosen if chosen.value > 0 else None
