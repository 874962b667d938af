"""A RabbitMQ queue's effective delivery limit (redrive/broker/rabbitmq/limits.py, issue 24):
the lower of its argument's and its policy's; on 4.x a default of 20 for a quorum queue that
sets none, and -1 as unlimited; and the refusal that says where the limit comes from. And
a channel the broker closed for a hold past consumer_timeout, as one line. Pure: no node
(the 3.10.8 node's side is tests/test_rabbitmq_delivery_limit.py's)."""

from __future__ import annotations

import amqp.exceptions
import pytest

from redrive.broker.base import QueueRef
from redrive.broker.rabbitmq.broker import CAPABILITIES
from redrive.broker.rabbitmq.limits import (
    DEFAULT_ORIGIN,
    DeliveryLimit,
    effective_limit,
    major_version,
)
from redrive.broker.rabbitmq.link import holds_timed_out
from redrive.dlq.delivery_limit import refusal
from redrive.errors import BrokerError, HoldsTimedOut

ARGUMENT = DeliveryLimit(5, " as its own argument")
POLICY = DeliveryLimit(7, " from policy dlq-limit")


@pytest.mark.parametrize(
    ("version", "major"),
    [("3.10.8", 3), ("4.0.0", 4), ("4.1.0-rc.2", 4), ("", None), (None, None), ("x", None)],
)
def test_the_major_version(version: str | None, major: int | None) -> None:
    assert major_version(version) == major


def test_a_quorum_queue_without_a_limit_has_none_on_3x_and_20_on_4x() -> None:
    assert effective_limit([], "3.10.8", "quorum") is None
    assert effective_limit([], "3.13.7", "quorum") is None
    assert effective_limit([], "4.0.0", "quorum") == DeliveryLimit(20, DEFAULT_ORIGIN)
    assert effective_limit([], "4.1.3", "quorum") == DeliveryLimit(20, DEFAULT_ORIGIN)
    # No version to be had: read as 4.x (a guard errs toward seeing a limit), and said so.
    unknown = effective_limit([], None, "quorum")
    assert unknown is not None and unknown.value == 20 and "not known" in unknown.origin


@pytest.mark.parametrize("version", ["3.10.8", "4.0.0", None])
def test_an_explicit_limit_wins_over_the_default_and_the_lower_of_two_wins(
    version: str | None,
) -> None:
    assert effective_limit([ARGUMENT], version, "quorum") == ARGUMENT
    assert effective_limit([POLICY], version, "quorum") == POLICY
    assert effective_limit([ARGUMENT, POLICY], version, "quorum") == ARGUMENT
    assert (
        effective_limit([DeliveryLimit(30, " as its own argument"), POLICY], version, "quorum")
        == POLICY
    )


def test_on_4x_minus_one_is_unlimited_and_on_either_side_the_higher_wins() -> None:
    unlimited = DeliveryLimit(-1, " from policy no-limit")
    assert effective_limit([unlimited], "4.0.0", "quorum") is None
    # RabbitMQ 4.x: a negative limit on either side makes the higher of the two win.
    assert effective_limit([ARGUMENT, unlimited], "4.0.0", "quorum") == ARGUMENT
    assert (
        effective_limit([DeliveryLimit(-1, " as its own argument"), POLICY], "4.0.0", "quorum")
        == POLICY
    )


@pytest.mark.parametrize("version", ["3.10.8", "4.0.0", None])
def test_a_classic_queue_has_no_default_and_an_explicit_limit_only(version: str | None) -> None:
    assert effective_limit([], version, "classic") is None
    assert effective_limit([], version, "stream") is None
    assert effective_limit([POLICY], version, "classic") == POLICY


def dlq(limit: DeliveryLimit | None) -> QueueRef:
    return QueueRef(
        url="jobs/onion-checkout-dlq",
        name="onion-checkout-dlq",
        ident="jobs/onion-checkout-dlq",
        fifo=False,
        max_receive_count=limit.value if limit is not None else None,
        receive_limit_origin=limit.origin if limit is not None else "",
    )


def test_the_refusal_says_where_the_limit_comes_from_and_the_way_out() -> None:
    line = refusal(dlq(DeliveryLimit(5, " from policy P")), CAPABILITIES, lambda: None)
    assert line is not None
    assert line.startswith("DLQ onion-checkout-dlq has x-delivery-limit 5 from policy P: ")
    assert "rabbitmqctl set_policy -p jobs" in line and "--allow-delivery-limit" in line

    default = effective_limit([], "4.0.0", "quorum")
    line = refusal(dlq(default), CAPABILITIES, lambda: None)
    assert line is not None
    assert line.startswith(
        "DLQ onion-checkout-dlq has x-delivery-limit 20, RabbitMQ 4.x's default of 20 for "
        "quorum queues (none is set): every read by redrive"
    ), line
    assert "rabbitmqctl set_policy" in line and "--allow-delivery-limit" in line

    assert refusal(dlq(effective_limit([], "3.10.8", "quorum")), CAPABILITIES, lambda: None) is None


# -- a hold past consumer_timeout (issue 24) ----------------------------------------------------

TIMED_OUT = (
    "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value "
    "used: 1800000 ms. This timeout value can be configured, see consumers doc guide to "
    "learn more"
)


def test_a_channel_closed_for_a_hold_past_consumer_timeout_is_one_line() -> None:
    """The broker's close (406, as py-amqp raises it) becomes one line of redrive's errors
    (a BrokerError: exit 1, printed without a traceback) that says what happened, that the
    holds are back, and the way out. The session's node cannot take a lower consumer_timeout
    per test, so the mapping is tested here."""
    closed = amqp.exceptions.PreconditionFailed(TIMED_OUT, (60, 80), reply_code=406)
    error = holds_timed_out(closed, "amqp://ops:***@rabbit:5672/jobs")
    assert isinstance(error, HoldsTimedOut) and isinstance(error, BrokerError)
    (line,) = str(error).splitlines()
    assert line.startswith(
        "RabbitMQ at amqp://ops:***@rabbit:5672/jobs closed the channel holding redrive's "
        "copies (delivery acknowledgement on channel 1 timed out): a copy was held longer "
        "than the broker's consumer_timeout. "
    ), line
    assert "back in its queue" in line and "--limit" in line and "raise consumer_timeout" in line


def test_another_precondition_failure_is_not_a_timeout() -> None:
    other = amqp.exceptions.PreconditionFailed(
        "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q'", (50, 10),
        reply_code=406,
    )  # fmt: skip
    assert holds_timed_out(other, "amqp://rabbit") is None
