"""A DLQ that itself counts deliveries toward a limit: reading it is not harmless.

A RabbitMQ quorum DLQ with a delivery limit (an ``x-delivery-limit`` argument or a
``delivery-limit`` policy) raises a message's ``x-delivery-count`` on every delivery, a held
copy given back included, and past the limit drops or dead-letters the message; an SQS DLQ
with a RedrivePolicy of its own does the same with its receive count. Every inspect, report,
dry run and move delivers each message once more, so redrive refuses to receive from such a
DLQ unless told (``--allow-delivery-limit``): the refusal says the limit, the highest
delivery count redrive saw there and how many of those deliveries were its own (from the
receive log, redrive.dlq.receive_log), and the way out.

Why an explicit option as well as the way out: a limit may be wanted (a DLQ of a DLQ), and
lifting it needs rights redrive's user may not have; the option makes the risk a decision.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from redrive.errors import UsageProblem

if TYPE_CHECKING:
    from redrive.broker.base import Capabilities, QueueRef
    from redrive.dlq.receive_log import ReceiveLog

ALLOW_OPTION = "--allow-delivery-limit"


class DeliveryLimitRisk(UsageProblem):
    """Receiving from a DLQ would take its messages toward the DLQ's own delivery limit."""


def refusal(
    dlq: QueueRef, words: Capabilities, receive_log: Callable[[], ReceiveLog | None]
) -> str | None:
    """The one line refusing to receive from ``dlq``, or None when it has no limit.
    ``receive_log`` is called only when there is a limit to tell about: opening the log is
    the command's business (it closes with the command), and most DLQs have none."""
    limit = dlq.max_receive_count
    if limit is None or limit <= 0:
        return None
    log = receive_log()
    highs = log.queue_highs(dlq.url) if log is not None else None
    if highs is None:
        seen = "the highest delivery count there is not known (redrive never read it)"
    else:
        deliveries, own = highs
        seen = (
            f"the highest delivery count redrive saw there is {deliveries} "
            f"(up to {own} of a message's receives were redrive's own)"
        )
        if deliveries + 1 > limit:
            seen += ": a message at it goes on the next delivery"
    scope = dlq.ident[: -len(dlq.name)].rstrip("/:") or "/"
    way_out = words.receive_limit_way_out.format(name=dlq.name, scope=scope)
    return (
        f"DLQ {dlq.name} has {words.receive_limit_setting} {limit}{dlq.receive_limit_origin}: "
        "every read by redrive "
        f"(inspect, report, dry run, move) is a delivery that counts toward it, and past it "
        f"the broker drops or dead-letters the message; {seen}. "
        f"{way_out + '; or ' if way_out else ''}pass {ALLOW_OPTION} to read it anyway"
    )


def guard(
    dlq: QueueRef,
    words: Capabilities,
    receive_log: Callable[[], ReceiveLog | None],
    *,
    allowed: bool,
) -> None:
    """Raise :class:`DeliveryLimitRisk` before a receive from a DLQ with a delivery limit,
    unless ``allowed``."""
    if allowed:
        return
    line = refusal(dlq, words, receive_log)
    if line is not None:
        raise DeliveryLimitRisk(line)
