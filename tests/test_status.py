"""Tests for redrive.reporting.status: every family's queue counts from GetQueueAttributes alone."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Family as QueueFamily
from conftest import make_family, unreachable

from redrive.broker.sqs import SqsBroker
from redrive.broker.sqs.broker import counts_of
from redrive.config import Family, Layout, built_in_layout
from redrive.errors import AwsUnavailable
from redrive.reporting.status import QueueCounts, family_status

BUILT_IN = built_in_layout({})


def test_every_family(
    all_families: dict[str, QueueFamily], sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    checkout = all_families["checkout"]
    for i in range(3):
        checkout.send_to_dlq(f"dead {i}")
    checkout.send_to_dlq("later", DelaySeconds=60)
    checkout.client.receive_message(QueueUrl=checkout.dlq_url, VisibilityTimeout=60)
    progress = all_families["progress"]
    progress.client.send_message(QueueUrl=progress.queue_url, MessageBody="live")
    rows = family_status(BUILT_IN, sqs_for)
    assert [(r.family, r.queue, r.dlq) for r in rows] == [
        ("checkout", "onion-checkout", "onion-checkout-dlq"),
        ("default", "onion", "onion-dlq"),
        ("progress", "onion-progress", "onion-progress-dlq"),
    ]
    by_family = {r.family: r for r in rows}
    assert by_family["checkout"].dlq_counts == QueueCounts(visible=2, in_flight=1, delayed=1)
    assert by_family["checkout"].queue_counts == QueueCounts(0, 0, 0)
    assert by_family["progress"].queue_counts == QueueCounts(1, 0, 0)
    assert by_family["default"].dlq_counts == QueueCounts(0, 0, 0)
    assert all(r.error is None for r in rows)
    assert all(r.dlq_retention_seconds == 14 * 86400 for r in rows)
    # Status only reads counts: nothing was received or hidden by it.
    assert checkout.depth() == (2, 1)


def test_json_shape(all_families: dict[str, QueueFamily], sqs_for: Any) -> None:
    all_families["default"].send_to_dlq("x")
    rows = [json.loads(json.dumps(r.to_json())) for r in family_status(BUILT_IN, sqs_for)]
    assert rows[1] == {
        "family": "default",
        "queue": "onion",
        "dlq": "onion-dlq",
        "queue_counts": {"visible": 0, "in_flight": 0, "delayed": 0},
        "dlq_counts": {"visible": 1, "in_flight": 0, "delayed": 0},
        "dlq_retention_seconds": 14 * 86400,
        "error": None,
    }


def test_missing_queue_gives_an_error_row_and_the_others_still_report(
    sqs_client: Any, sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    make_family(sqs_client, "onion-checkout").send_to_dlq("x")
    make_family(sqs_client, "onion-progress")
    rows = family_status(BUILT_IN, sqs_for)
    assert [r.family for r in rows] == ["checkout", "default", "progress"]
    broken = rows[1]
    assert broken.error is not None and "queue onion does not exist" in broken.error
    assert broken.queue == "onion" and broken.dlq is None
    assert broken.queue_counts is None and broken.dlq_counts is None
    assert broken.to_json()["queue_counts"] is None
    assert rows[0].error is None and rows[0].dlq_counts == QueueCounts(1, 0, 0)
    assert rows[2].error is None


def test_missing_dlq_gives_an_error_row(
    all_families: dict[str, QueueFamily], sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    progress = all_families["progress"]
    progress.client.delete_queue(QueueUrl=progress.dlq_url)
    rows = family_status(BUILT_IN, sqs_for)
    assert [r.error is None for r in rows] == [True, True, False]
    assert "RedrivePolicy names DLQ" in (rows[2].error or "")


def test_family_whose_client_cannot_be_made_gives_an_error_row(
    all_families: dict[str, QueueFamily], sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    # A typo in one family's region breaks that family, not the whole status.
    layout = Layout(
        families=(
            Family("checkout", "onion-checkout", priority=1),
            Family("typo", "onion", region="eu west 1", priority=2),
        ),
        source="t.toml",
    )
    rows = family_status(layout, sqs_for)
    assert rows[0].error is None
    assert rows[1].family == "typo"
    assert rows[1].error is not None and "eu west 1" in rows[1].error


def test_aws_unavailable_propagates() -> None:
    with pytest.raises(AwsUnavailable, match="cannot reach SQS"):
        family_status(BUILT_IN, unreachable())


def test_aws_unavailable_after_a_good_family_still_propagates(sqs_client: Any) -> None:
    make_family(sqs_client, "onion-checkout")
    dead = unreachable()
    layout = Layout(
        families=(
            Family("checkout", "onion-checkout", priority=1),
            Family("far", "onion-far", region="eu-west-1", priority=2),
        ),
        source="t.toml",
    )

    def sqs_for(region: str | None) -> SqsBroker:
        return dead(region) if region else SqsBroker(sqs_client)

    with pytest.raises(AwsUnavailable):
        family_status(layout, sqs_for)


@pytest.mark.parametrize(
    ("attrs", "counts"),
    [
        ({}, QueueCounts(0, 0, 0)),
        (
            {
                "ApproximateNumberOfMessages": "7",
                "ApproximateNumberOfMessagesNotVisible": "2",
                "ApproximateNumberOfMessagesDelayed": "1",
            },
            QueueCounts(7, 2, 1),
        ),
        ({"ApproximateNumberOfMessages": "-1"}, QueueCounts(0, 0, 0)),
        ({"ApproximateNumberOfMessages": "n/a"}, QueueCounts(0, 0, 0)),
    ],
)
def test_queue_counts_from_attributes(attrs: dict[str, str], counts: QueueCounts) -> None:
    assert QueueCounts.of(counts_of(attrs)) == counts
