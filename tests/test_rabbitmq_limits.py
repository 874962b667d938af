"""A RabbitMQ queue's effective delivery limit (redrive/broker/rabbitmq/limits.py, issue 24):
the lower of its argument's and its policy's; on 4.x a default of 20 for a quorum queue that
sets none, and -1 as unlimited; and the refusal that says where the limit comes from. Pure:
no node (the 3.10.8 node's side is tests/test_rabbitmq_delivery_limit.py's)."""

from __future__ import annotations

import pytest

from redrive.broker.base import QueueRef
from redrive.broker.rabbitmq.broker import CAPABILITIES
from redrive.broker.rabbitmq.limits import (
    DEFAULT_ORIGIN,
    DeliveryLimit,
    effective_limit,
    major_version,
)
from redrive.dlq.delivery_limit import refusal

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
