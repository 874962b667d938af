"""Tests for redrive.reporting.report: every family's DLQ inspected, in one document."""

from __future__ import annotations

import html
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli, make_family, unreachable
from conftest import Family as QueueFamily

from redrive.broker.sqs import SqsBroker
from redrive.config import Family, Layout, built_in_layout
from redrive.errors import AwsError, AwsUnavailable
from redrive.messages import UNKNOWN_TASK
from redrive.render.report import report_text
from redrive.reporting.alerts import snapshot
from redrive.reporting.report import Report, build_report
from redrive.sandbox.encoder import encode

BUILT_IN = built_in_layout({})
CHECKOUT = "apps.webhooks.tasks.save_checkout_ibft"
PROGRESS = "apps.engagements.tasks.save_progress_lesson"


def test_every_family(
    all_families: dict[str, QueueFamily], sqs_for: Callable[[str | None], SqsBroker]
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
    all_families: dict[str, QueueFamily], sqs_for: Callable[[str | None], SqsBroker]
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
    sqs_client: Any, sqs_for: Callable[[str | None], SqsBroker]
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
        "coverage": "none",
    }
    assert report.total == 2


def test_family_whose_client_cannot_be_made_gives_an_error_row(
    all_families: dict[str, QueueFamily], sqs_for: Callable[[str | None], SqsBroker]
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

    def sqs_for(region: str | None) -> SqsBroker:
        asked.append(region)
        return dead(region) if region else SqsBroker(sqs_client)

    with pytest.raises(AwsUnavailable):
        build_report(layout, sqs_for)
    assert "eu-west-1" in asked


def test_progress_is_reported_per_family(
    all_families: dict[str, QueueFamily], sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    for i in range(12):
        all_families["progress"].send_to_dlq(encode(PROGRESS, [i]))
    seen: list[tuple[str, int]] = []
    build_report(BUILT_IN, sqs_for, on_progress=lambda name, n: seen.append((name, n)))
    assert seen == [("progress", 10), ("progress", 12)]


def test_stop_ends_the_report_after_the_family_in_hand(
    all_families: dict[str, QueueFamily], sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    for i in range(15):
        all_families["checkout"].send_to_dlq(encode(CHECKOUT, [i]))
    all_families["progress"].send_to_dlq(encode(PROGRESS, [1]))
    stop = threading.Event()
    report = build_report(BUILT_IN, sqs_for, stop=stop, on_progress=lambda name, n: stop.set())
    # The families after it are not scanned, and listed as such (not left out).
    assert [(q.family, q.coverage) for q in report.queues] == [
        ("checkout", "partial"),
        ("default", "none"),
        ("progress", "none"),
    ]
    assert all(q.skipped and q.result is None for q in report.queues[1:])
    assert report.interrupted
    result = report.queues[0].result
    assert result is not None and result.interrupted and result.total == 10
    assert all_families["checkout"].depth() == (15, 0)


class DeniedReceives(SqsBroker):
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

    def sqs_for(region: str | None) -> SqsBroker:
        return DeniedReceives(sqs_client) if region else SqsBroker(sqs_client)

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


# -- an interrupted report (issue 22) ---------------------------------------------------------


def _interrupted_in_default(
    all_families: dict[str, QueueFamily], sqs_for: Callable[[str | None], SqsBroker]
) -> Report:
    """checkout scanned in full, default stopped after its first batch (the operator's
    Ctrl-C, as the CLI's handler sets the stop), progress never reached."""
    for i in range(3):
        all_families["checkout"].send_to_dlq(encode(CHECKOUT, [i]))
    for i in range(15):
        all_families["default"].send_to_dlq(encode(CHECKOUT, [i]))
    all_families["progress"].send_to_dlq(encode(PROGRESS, [1]))
    stop = threading.Event()

    def on_progress(family: str, n: int) -> None:
        if family == "default":
            stop.set()

    return build_report(BUILT_IN, sqs_for, stop=stop, on_progress=on_progress)


FAMILIES = ("checkout", "default", "progress")


def test_an_interrupted_report_says_what_each_dlq_covers(
    all_families: dict[str, QueueFamily], sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    report = _interrupted_in_default(all_families, sqs_for)
    assert report.interrupted
    assert [(q.family, q.coverage, q.skipped) for q in report.queues] == [
        ("checkout", "full", False),
        ("default", "partial", False),
        ("progress", "none", True),
    ]
    data = json.loads(json.dumps(report.to_json()))
    assert data["interrupted"] is True
    assert [(q["family"], q["coverage"], q["messages"]) for q in data["queues"]] == [
        ("checkout", "full", 3),
        ("default", "partial", 10),
        ("progress", "none", None),
    ]
    assert data["queues"][1]["depth_before"] == 15
    note = (
        "note: interrupted; counts cover only what was scanned (DLQs scanned in full: "
        "checkout; in part: default (10 of ~15 scanned); not at all: progress)"
    )
    for markdown in (False, True):
        text = report_text(report, markdown=markdown)
        assert note in " ".join(text.split()), text
        # The summary table says it per DLQ too.
        assert "scanned" in next(line for line in text.splitlines() if "family" in line)
        lines = text.splitlines()
        row = {f: next(x for x in lines if x.strip("| ").startswith(f + " ")) for f in FAMILIES}
        assert row["progress"].rstrip(" |").endswith("none")
        assert row["default"].rstrip(" |").endswith("10 of ~15")
        assert row["checkout"].rstrip(" |").endswith("all")
    # What a later report compares with, or alerts on, is only what was scanned in full.
    assert set(snapshot(report)) == {"checkout"}
    # Every DLQ was given back as it was.
    assert all_families["default"].depth() == (15, 0)


def test_a_whole_report_says_nothing_of_coverage_but_full(
    all_families: dict[str, QueueFamily], sqs_for: Callable[[str | None], SqsBroker]
) -> None:
    report = build_report(BUILT_IN, sqs_for, stop=threading.Event())
    assert not report.interrupted and report.to_json()["interrupted"] is False
    assert {q.coverage for q in report.queues} == {"full"}
    assert "interrupted" not in report_text(report) and "scanned" not in report_text(report)


def ctrl_c_after_first_receive(monkeypatch: pytest.MonkeyPatch, dlq: str) -> None:
    """The operator's first Ctrl-C at a set point, not at a time: SIGINT raised in the main
    thread (where a one-worker scan receives) just after the first batch from ``dlq``
    arrives. The CLI's own handler hears it before the scan asks for another batch."""
    receive = SqsBroker.receive
    fired: list[str] = []

    def receive_then_interrupt(self: SqsBroker, url: str, **kwargs: Any) -> Any:
        batch = receive(self, url, **kwargs)
        if url.endswith("/" + dlq) and not fired:
            fired.append(url)
            signal.raise_signal(signal.SIGINT)
        return batch

    monkeypatch.setattr(SqsBroker, "receive", receive_then_interrupt)


def _fill(all_families: dict[str, QueueFamily]) -> None:
    for i in range(3):
        all_families["checkout"].send_to_dlq(encode(CHECKOUT, [i]))
    for i in range(15):
        all_families["default"].send_to_dlq(encode(CHECKOUT, [i]))
    all_families["progress"].send_to_dlq(encode(PROGRESS, [1]))


NOTE = (
    "note: interrupted; counts cover only what was scanned (DLQs scanned in full: checkout; "
    "in part: default (10 of ~15 scanned); not at all: progress)"
)


@pytest.mark.parametrize("fmt", ["table", "markdown", "html"])
def test_an_interrupted_report_says_so_in_every_format(
    all_families: dict[str, QueueFamily], monkeypatch: pytest.MonkeyPatch, cli: Cli, fmt: str
) -> None:
    _fill(all_families)
    ctrl_c_after_first_receive(monkeypatch, "onion-dlq")
    result = cli("report", "--format", fmt)
    assert result.exit_code == 130, result.output
    assert "stopping:" in result.stderr and "Traceback" not in result.output
    text = result.stdout
    if fmt == "html":
        text = html.unescape(re.sub(r"<[^>]+>", " ", text))
        assert "not scanned: the report was interrupted first" in " ".join(text.split())
        assert "scanned in part (10 of ~15 scanned)" in " ".join(text.split())
    assert NOTE in " ".join(text.split()), text
    # The DLQ never reached is listed (its name unknown: the built-in layout reads it from
    # SQS, which an interrupted run does not ask again).
    for family in ("checkout", "default", "progress"):
        assert re.search(rf"^\W*{family}\b", text, re.MULTILINE), f"{family} left out"


def test_an_interrupted_report_in_json_has_interrupted_and_each_dlqs_coverage(
    all_families: dict[str, QueueFamily], monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    _fill(all_families)
    ctrl_c_after_first_receive(monkeypatch, "onion-dlq")
    result = cli("report", "--format", "json", "--since-last")
    assert result.exit_code == 130, result.output
    data = json.loads(result.stdout)
    assert data["interrupted"] is True
    assert [(q["family"], q["coverage"], q["messages"]) for q in data["queues"]] == [
        ("checkout", "full", 3),
        ("default", "partial", 10),
        ("progress", "none", None),
    ]
    assert data["total"] == 13
    # What changed is said only of what was scanned in full, and the baseline the next
    # --since-last compares with is not replaced by part of the DLQs.
    assert [c["family"] for c in data["since_last"]] == ["checkout"]
    state_dir = Path(os.environ["REDRIVE_STATE_DIR"])
    assert not list(state_dir.glob("report-last-*.json"))
    for family in all_families.values():
        assert family.depth()[1] == 0, "every message given back"


def test_an_interrupted_report_publishes_no_prometheus_metrics(
    all_families: dict[str, QueueFamily],
    monkeypatch: pytest.MonkeyPatch,
    cli: Cli,
    tmp_path: Path,
) -> None:
    _fill(all_families)
    metrics = tmp_path / "redrive.prom"
    cli.ok("report", "--format", "prometheus", "--output", str(metrics))
    before = metrics.read_text()
    assert 'redrive_dlq_messages{family="default",dlq="onion-dlq"} 15' in before
    ctrl_c_after_first_receive(monkeypatch, "onion-dlq")
    result = cli("report", "--format", "prometheus", "--output", str(metrics))
    assert result.exit_code == 130, result.output
    assert metrics.read_text() == before, "the previous metrics are kept"
    assert "interrupted: no Prometheus metrics written" in result.stderr
    assert "the previous --output file is kept" in result.stderr
    ctrl_c_after_first_receive(monkeypatch, "onion-dlq")  # a second run, a second Ctrl-C
    to_stdout = cli("report", "--format", "prometheus")
    assert to_stdout.exit_code == 130 and to_stdout.stdout == ""
