"""Tests for redrive.dlq.queues: turning a TARGET into a DLQ and its source queues (moto)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Family as QueueFamily
from conftest import make_family

from redrive.broker import resolve_target
from redrive.broker.sqs import SqsBroker
from redrive.broker.sqs.queues import _max_receive_count as max_receive_count_of
from redrive.broker.sqs.queues import describe_queue
from redrive.config import Family, Layout, built_in_layout
from redrive.errors import NoDeadLetterQueue, QueueNotFound

BUILT_IN = built_in_layout({})


@pytest.fixture
def sqs_for(sqs_client: Any) -> Callable[[str | None], SqsBroker]:
    return lambda region: SqsBroker(sqs_client)


def arn_of(client: Any, url: str) -> str:
    return str(
        client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
    )


def plain_queue(client: Any, name: str, **attributes: str) -> str:
    return str(client.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"])


def source_of(client: Any, name: str, dlq_url: str, max_receive: int = 5) -> str:
    policy = {"deadLetterTargetArn": arn_of(client, dlq_url), "maxReceiveCount": max_receive}
    return plain_queue(client, name, RedrivePolicy=json.dumps(policy))


# -- families and source queues --------------------------------------------------------


def test_family_name(family: QueueFamily, sqs_for: Callable[[str | None], SqsBroker]) -> None:
    target = resolve_target(BUILT_IN, "checkout", sqs_for)
    assert target.label == "checkout"
    assert target.family == BUILT_IN.family("checkout")
    assert target.dlq.name == "onion-checkout-dlq"
    assert target.dlq.url == family.dlq_url
    assert target.dlq.ident == family.dlq_arn
    assert target.dlq.retention_seconds == 14 * 86400
    assert target.dlq.fifo is False
    assert [s.name for s in target.sources] == ["onion-checkout"]
    source = target.single_source
    assert source is not None and source.url == family.queue_url
    assert source.max_receive_count == 5
    assert target.source_for(source.ident) == source
    assert target.source_for(family.dlq_arn) is None


@pytest.mark.parametrize("how", ["name", "url"])
def test_source_queue_of_a_family_is_labelled_with_the_family(
    family: QueueFamily, sqs_for: Callable[[str | None], SqsBroker], how: str
) -> None:
    name = "onion-checkout" if how == "name" else family.queue_url
    target = resolve_target(BUILT_IN, name, sqs_for)
    assert target.label == "checkout"
    assert target.family is not None and target.family.name == "checkout"
    assert target.dlq.url == family.dlq_url


@pytest.mark.parametrize("how", ["name", "url"])
def test_source_queue_outside_the_layout(
    sqs_client: Any, sqs_for: Callable[[str | None], SqsBroker], how: str
) -> None:
    billing = make_family(sqs_client, "billing", max_receive=3)
    name = "billing" if how == "name" else billing.queue_url
    target = resolve_target(BUILT_IN, name, sqs_for)
    assert target.label == "billing"
    assert target.family is None
    assert target.dlq.name == "billing-dlq"
    assert [s.url for s in target.sources] == [billing.queue_url]
    assert target.sources[0].max_receive_count == 3


def test_env_override_with_a_queue_url(
    sqs_client: Any, sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    staging = make_family(sqs_client, "staging-checkout")
    layout = built_in_layout({"CELERY_CHECKOUT_QUEUE": staging.queue_url})
    by_family = resolve_target(layout, "checkout", sqs_for)
    assert by_family.dlq.url == staging.dlq_url
    # Naming the overridden queue still finds its family.
    by_queue = resolve_target(layout, "staging-checkout", sqs_for)
    assert by_queue.label == "checkout"
    assert by_queue.dlq.url == staging.dlq_url


def test_fifo_family(sqs_client: Any, sqs_for: Callable[[str | None], SqsBroker]) -> None:
    fifo = make_family(sqs_client, "orders.fifo")
    target = resolve_target(BUILT_IN, "orders.fifo", sqs_for)
    assert target.dlq.name == "orders-dlq.fifo"
    assert target.dlq.fifo and target.sources[0].fifo
    assert target.dlq.url == fifo.dlq_url


def test_family_region_picks_the_client(sqs_client: Any) -> None:
    make_family(sqs_client, "atlas-eu")
    asked: list[str | None] = []

    def sqs_for(region: str | None) -> SqsBroker:
        asked.append(region)
        return SqsBroker(sqs_client)

    layout = Layout(families=(Family("eu", "atlas-eu", region="eu-west-1"),), source="t")
    resolve_target(layout, "eu", sqs_for)
    assert asked == ["eu-west-1"]


# -- DLQs ------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["name", "url"])
def test_dlq_finds_its_source_with_list_dead_letter_source_queues(
    family: QueueFamily, sqs_for: Callable[[str | None], SqsBroker], how: str
) -> None:
    name = "onion-checkout-dlq" if how == "name" else family.dlq_url
    target = resolve_target(BUILT_IN, name, sqs_for)
    assert target.dlq.url == family.dlq_url
    assert target.label == "checkout"
    assert target.family is not None and target.family.name == "checkout"
    assert [s.url for s in target.sources] == [family.queue_url]


def test_dlq_outside_the_layout_is_labelled_with_its_name(
    sqs_client: Any, sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    billing = make_family(sqs_client, "billing")
    target = resolve_target(BUILT_IN, "billing-dlq", sqs_for)
    assert target.label == "billing-dlq"
    assert target.family is None
    assert [s.url for s in target.sources] == [billing.queue_url]


def test_dlq_with_two_sources(sqs_client: Any, sqs_for: Callable[[str | None], SqsBroker]) -> None:
    dlq = plain_queue(sqs_client, "shared-dlq")
    b = source_of(sqs_client, "b-queue", dlq)
    a = source_of(sqs_client, "a-queue", dlq, max_receive=2)
    target = resolve_target(BUILT_IN, "shared-dlq", sqs_for)
    # Two sources: no family can speak for the DLQ, so it keeps its own name.
    assert target.label == "shared-dlq"
    assert [s.url for s in target.sources] == [a, b]
    assert target.single_source is None
    a_ref = target.source_for(arn_of(sqs_client, a))
    assert a_ref is not None and a_ref.name == "a-queue" and a_ref.max_receive_count == 2
    assert target.source_for(arn_of(sqs_client, b)) == target.sources[1]


def test_dlq_shared_by_a_family_queue_and_another(
    family: QueueFamily, sqs_client: Any, sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    other = source_of(sqs_client, "legacy-checkout", family.dlq_url)
    target = resolve_target(BUILT_IN, "onion-checkout-dlq", sqs_for)
    assert target.label == "onion-checkout-dlq"
    assert {s.url for s in target.sources} == {family.queue_url, other}


def test_queue_with_no_redrive_policy_and_no_sources(
    sqs_client: Any, sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    plain_queue(sqs_client, "lonely")
    with pytest.raises(NoDeadLetterQueue, match="lonely") as info:
        resolve_target(BUILT_IN, "lonely", sqs_for)
    assert "no RedrivePolicy" in str(info.value)


def test_family_whose_queue_has_no_redrive_policy(
    sqs_client: Any, sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    plain_queue(sqs_client, "onion")
    with pytest.raises(NoDeadLetterQueue, match="queue onion has no RedrivePolicy"):
        resolve_target(BUILT_IN, "default", sqs_for)


# -- what does not exist ---------------------------------------------------------------


def test_unknown_name_lists_the_families(
    sqs_client: Any, sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    with pytest.raises(QueueNotFound) as info:
        resolve_target(BUILT_IN, "nonesuch", sqs_for)
    message = str(info.value)
    assert "'nonesuch'" in message
    assert "checkout, default, progress" in message


def test_family_whose_queue_is_missing(
    sqs_client: Any, sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    with pytest.raises(QueueNotFound, match="family progress: queue onion-progress does not"):
        resolve_target(BUILT_IN, "progress", sqs_for)


@pytest.mark.parametrize("target", ["checkout", "onion-checkout"])
def test_redrive_policy_pointing_at_a_missing_dlq(
    family: QueueFamily, sqs_for: Callable[[str | None], SqsBroker], target: str
) -> None:
    family.client.delete_queue(QueueUrl=family.dlq_url)
    with pytest.raises(QueueNotFound) as info:
        resolve_target(BUILT_IN, target, sqs_for)
    message = str(info.value)
    assert family.dlq_arn in message
    assert "onion-checkout's RedrivePolicy" in message
    assert "does not exist" in message


# -- families with an explicit DLQ -----------------------------------------------------

ATLAS = Layout(
    families=(
        Family("atlas", queue="atlas-prod-default", dlq="atlas-prod-default-errors", priority=1),
    ),
    source="atlas.toml",
)


def test_family_with_explicit_dlq_needs_no_redrive_policy(
    sqs_client: Any, sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    source = plain_queue(sqs_client, "atlas-prod-default")
    dlq = plain_queue(sqs_client, "atlas-prod-default-errors", MessageRetentionPeriod="345600")
    target = resolve_target(ATLAS, "atlas", sqs_for)
    assert target.label == "atlas"
    assert target.dlq.url == dlq
    assert target.dlq.retention_seconds == 345600
    assert [s.url for s in target.sources] == [source]


def test_explicit_dlq_wins_over_the_redrive_policy(
    sqs_client: Any, sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    make_family(sqs_client, "atlas-prod-default")  # its RedrivePolicy names another DLQ
    dlq = plain_queue(sqs_client, "atlas-prod-default-errors")
    assert resolve_target(ATLAS, "atlas", sqs_for).dlq.url == dlq
    assert resolve_target(ATLAS, "atlas-prod-default", sqs_for).dlq.url == dlq


def test_explicit_dlq_named_directly_resolves_to_its_family(
    sqs_client: Any, sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    # The config says which DLQ belongs to the family; the source queue need not say so.
    source = plain_queue(sqs_client, "atlas-prod-default")
    dlq = plain_queue(sqs_client, "atlas-prod-default-errors")
    target = resolve_target(ATLAS, "atlas-prod-default-errors", sqs_for)
    assert target.label == "atlas"
    assert target.dlq.url == dlq
    assert [s.url for s in target.sources] == [source]


def test_explicit_dlq_that_does_not_exist(
    sqs_client: Any, sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    plain_queue(sqs_client, "atlas-prod-default")
    with pytest.raises(QueueNotFound, match="family atlas: DLQ atlas-prod-default-errors"):
        resolve_target(ATLAS, "atlas", sqs_for)


# -- describe_queue and friends --------------------------------------------------------


def test_describe_queue(family: QueueFamily, sqs_client: Any) -> None:
    ref = describe_queue(SqsBroker(sqs_client), "onion-checkout")
    assert ref.url == family.queue_url
    assert ref.name == "onion-checkout"
    assert ref.ident.endswith(":onion-checkout")
    # The RedrivePolicy, as the seam keeps it: where it dead-letters, and after how many.
    assert (ref.dead_letter_target, ref.max_receive_count) == (family.dlq_arn, 5)
    assert ref.retention_seconds == 4 * 86400  # SQS's default
    with pytest.raises(QueueNotFound, match="nope"):
        describe_queue(SqsBroker(sqs_client), "nope")


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (None, None),
        ({}, None),
        ({"maxReceiveCount": 7}, 7),
        ({"maxReceiveCount": "9"}, 9),
        ({"maxReceiveCount": "lots"}, None),
    ],
)
def test_queue_ref_max_receive_count(
    policy: dict[str, object] | None, expected: int | None
) -> None:
    assert max_receive_count_of(policy) == expected
