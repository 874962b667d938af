"""Tests for redrive.reporting.report: every family's DLQ inspected, in one document."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Family as QueueFamily
from conftest import make_family, unreachable

from redrive.aws.sqs import Sqs
from redrive.config import Family, Layout, built_in_layout
from redrive.errors import AwsError, AwsUnavailable
from redrive.messages import UNKNOWN_TASK
from redrive.reporting.report import build_report
from redrive.sandbox.encoder import encode

BUILT_IN = built_in_layout({})
CHECKOUT = "apps.webhooks.tasks.save_checkout_ibft"
PROGRESS = "apps.engagements.tasks.save_progress_lesson"


def test_every_family(
    all_families: dict[str, QueueFamily], sqs_for: Callable[[str | None], Sqs]
) -> None:
    for i in range(3):
        all_families["checkout"].send_to_dlq(encode(CHECKOUT, [i]))
    all_families["checkout"].send_to_dlq("not celery")
    for i in range(2):
        all_families["progress"].send_to_dlq(encode(PROGRESS, [i], protocol=1))
    now = time.time()
    report = build_report(BUILT_IN, sqs_for, now=now)
    assert report.layout == "built-in"
    assert report.generated_at == now
    assert [(q.family, q.dlq, q.messages, q.error) for q in report.queues] == [
        ("checkout", "onion-checkout-dlq", 4, None),
        ("default", "onion-dlq", 0, None),
        ("progress", "onion-progress-dlq", 2, None),
    ]
    assert report.total == 6
    assert report.errors == []
    checkout = report.queues[0].result
    assert checkout is not None
    assert [(g.task, g.count) for g in checkout.groups] == [(CHECKOUT, 3), (UNKNOWN_TASK, 1)]
    # A report leaves every DLQ as it found it.
    assert all_families["checkout"].depth() == (4, 0)
    assert all_families["progress"].depth() == (2, 0)


def test_json_shape(
    all_families: dict[str, QueueFamily], sqs_for: Callable[[str | None], Sqs]
) -> None:
    all_families["default"].send_to_dlq(encode(CHECKOUT, [1]))
    data = json.loads(json.dumps(build_report(BUILT_IN, sqs_for).to_json()))
    assert data["layout"] == "built-in"
    assert data["total"] == 1
    assert data["generated_at"].endswith("Z")
    assert [q["family"] for q in data["queues"]] == ["checkout", "default", "progress"]
    for queue in data["queues"]:
        assert {"family", "dlq", "messages", "groups", "error"} <= set(queue)
        assert isinstance(queue["groups"], list)
        assert queue["error"] is None
    default = data["queues"][1]
    assert default["dlq"] == "onion-dlq"
    assert default["messages"] == 1
    (group,) = default["groups"]
    assert group["task"] == CHECKOUT and group["count"] == 1
    assert {"oldest", "oldest_age_seconds", "expired", "poison", "leaving_within_24h"} <= set(
        default
    )
    assert data["queues"][0]["messages"] == 0 and data["queues"][0]["groups"] == []


def test_missing_queue_gives_an_error_row_and_the_others_still_report(
    sqs_client: Any, sqs_for: Callable[[str | None], Sqs]
) -> None:
    make_family(sqs_client, "onion-checkout").send_to_dlq(encode(CHECKOUT, [1]))
    make_family(sqs_client, "onion-progress").send_to_dlq(encode(PROGRESS, [1]))
    report = build_report(BUILT_IN, sqs_for)
    assert [(q.family, q.messages) for q in report.queues] == [
        ("checkout", 1),
        ("default", 0),
        ("progress", 1),
    ]
    broken = report.queues[1]
    assert broken.result is None
    assert broken.error is not None and "queue onion does not exist" in broken.error
    assert report.errors == [f"default: {broken.error}"]
    row = broken.to_json()
    assert row == {
        "family": "default",
        "dlq": None,
        "messages": 0,
        "groups": [],
        "error": broken.error,
    }
    assert report.total == 2


def test_family_whose_client_cannot_be_made_gives_an_error_row(
    all_families: dict[str, QueueFamily], sqs_for: Callable[[str | None], Sqs]
) -> None:
    layout = Layout(
        families=(
            Family("typo", "onion", region="eu west 1", priority=1),
            Family("checkout", "onion-checkout", priority=2),
        ),
        source="t.toml",
    )
    report = build_report(layout, sqs_for)
    assert report.queues[0].error is not None and "eu west 1" in report.queues[0].error
    assert report.queues[1].error is None
    assert report.layout == "t.toml"


def test_aws_unavailable_propagates() -> None:
    with pytest.raises(AwsUnavailable, match="cannot reach SQS"):
        build_report(BUILT_IN, unreachable())


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
    asked: list[str | None] = []

    def sqs_for(region: str | None) -> Sqs:
        asked.append(region)
        return dead(region) if region else Sqs(sqs_client)

    with pytest.raises(AwsUnavailable):
        build_report(layout, sqs_for)
    assert "eu-west-1" in asked


def test_progress_is_reported_per_family(
    all_families: dict[str, QueueFamily], sqs_for: Callable[[str | None], Sqs]
) -> None:
    for i in range(12):
        all_families["progress"].send_to_dlq(encode(PROGRESS, [i]))
    seen: list[tuple[str, int]] = []
    build_report(BUILT_IN, sqs_for, on_progress=lambda name, n: seen.append((name, n)))
    assert seen == [("progress", 10), ("progress", 12)]


def test_stop_ends_the_report_after_the_family_in_hand(
    all_families: dict[str, QueueFamily], sqs_for: Callable[[str | None], Sqs]
) -> None:
    for i in range(15):
        all_families["checkout"].send_to_dlq(encode(CHECKOUT, [i]))
    all_families["progress"].send_to_dlq(encode(PROGRESS, [1]))
    stop = threading.Event()
    report = build_report(BUILT_IN, sqs_for, stop=stop, on_progress=lambda name, n: stop.set())
    assert [q.family for q in report.queues] == ["checkout"]
    result = report.queues[0].result
    assert result is not None and result.interrupted and result.total == 10
    assert all_families["checkout"].depth() == (15, 0)


class DeniedReceives(Sqs):
    """A client whose every ReceiveMessage is refused (no sqs:ReceiveMessage on that DLQ)."""

    def receive(self, url: str, **kwargs: Any) -> list[Any]:
        raise AwsError(f"access denied: the caller may not sqs:ReceiveMessage on {url}")


def test_a_family_failing_mid_scan_does_not_end_the_report(
    all_families: dict[str, QueueFamily], sqs_client: Any
) -> None:
    # The CLI always passes its Ctrl-C event as `stop`; a failing scan stops its own workers
    # through it, and that must not read as the operator stopping the whole report.
    all_families["progress"].send_to_dlq(encode(PROGRESS, [1]))
    layout = Layout(
        families=(
            Family("denied", "onion-checkout", region="eu-west-1", priority=1),
            Family("default", "onion", priority=2),
            Family("progress", "onion-progress", priority=3),
        ),
        source="t.toml",
    )

    def sqs_for(region: str | None) -> Sqs:
        return DeniedReceives(sqs_client) if region else Sqs(sqs_client)

    stop = threading.Event()
    report = build_report(layout, sqs_for, stop=stop)
    assert [(q.family, q.messages) for q in report.queues] == [
        ("denied", 0),
        ("default", 0),
        ("progress", 1),
    ]
    assert "access denied" in (report.queues[0].error or "")
    assert not stop.is_set()
    assert report.queues[2].result is not None and not report.queues[2].result.interrupted
