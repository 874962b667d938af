"""Timelines (issue 16): when each group's messages were enqueued, bucketed over the DLQ's
span, streamed (counts per bucket, never the messages), and drawn in a terminal."""

from __future__ import annotations

import itertools
import json
from typing import Any

from conftest import Cli, Family, as_json
from hypothesis import given
from hypothesis import strategies as st

from redrive.inspection.groups import Grouping, TaskGroup
from redrive.inspection.scan import InspectResult
from redrive.inspection.timeline import (
    BUCKET_LADDER,
    KEPT_BUCKETS,
    MAX_BUCKETS,
    SentTimes,
    choose_bucket,
    fit_timelines,
)
from redrive.render.inspect import inspect_text
from redrive.render.report import report_text
from redrive.render.sparkline import sparkline, timeline_lines, wants_ascii
from redrive.reporting.report import FamilyReport, Report
from redrive.sandbox.encoder import encode

NOW = 1_800_000_000.0  # 2027-01-15 08:00 UTC, aligned to every bucket up to a day
MINUTE, HOUR, DAY = 60.0, 3600.0, 86_400.0


def grouping_of(times: dict[str, list[float]]) -> list[TaskGroup]:
    grouping = Grouping(now=NOW)
    for task, sent in times.items():
        for i, ts in enumerate(sent):
            grouping.add(
                _info(task),
                message_id=f"{task}-{i}",
                sent_at=ts,
                receive_count=5,
                redrive_count=0,
            )
    return grouping.sorted_groups()


def _info(task: str) -> Any:
    from redrive.messages import decode

    return decode(encode(task, []))


def result_of(groups: list[TaskGroup]) -> InspectResult:
    return InspectResult(
        label="checkout",
        dlq="onion-checkout-dlq",
        dlq_url="https://sqs.us-east-1.amazonaws.com/1/onion-checkout-dlq",
        sources=["onion-checkout"],
        total=sum(g.count for g in groups),
        groups=groups,
        oldest=min((g.oldest for g in groups if g.oldest), default=None),
        scanned_at=NOW,
        seconds=0.1,
        depth_before=sum(g.count for g in groups),
        hidden_before=0,
        partial=False,
    )


# -- the bucket ------------------------------------------------------------------------------


def test_the_bucket_goes_from_minutes_to_days_with_the_span() -> None:
    assert choose_bucket(NOW, NOW) == 60
    assert choose_bucket(NOW - 30 * MINUTE, NOW) == 60
    assert choose_bucket(NOW - 6 * HOUR, NOW) == 900
    assert choose_bucket(NOW - 2 * DAY, NOW) == 3600
    assert choose_bucket(NOW - 14 * DAY, NOW) == 21_600
    assert choose_bucket(NOW - 90 * DAY, NOW) == 86_400 * 7
    for first, last in ((NOW - 6 * HOUR, NOW), (NOW - 14 * DAY, NOW)):
        width = choose_bucket(first, last)
        assert int(last // width) - int(first // width) + 1 <= MAX_BUCKETS


def test_each_width_divides_the_next_so_coarsening_is_exact() -> None:
    for finer, coarser in itertools.pairwise(BUCKET_LADDER):
        assert coarser % finer == 0


def test_a_deploy_blip_stands_out_in_one_bucket_over_two_weeks() -> None:
    """Forty tasks killed within five minutes, in a DLQ whose oldest message is 14 days old."""
    blip = [NOW - DAY + i * 7 for i in range(40)]
    groups = grouping_of({"apps.a.tasks.old": [NOW - 14 * DAY], "apps.b.tasks.blip": blip})
    blipped = next(g for g in groups if g.task == "apps.b.tasks.blip")
    assert blipped.timeline is not None
    assert sum(1 for c in blipped.timeline.counts if c) == 1
    assert max(blipped.timeline.counts) == 40
    # Every group of the DLQ shares the start, the width and the length: bars line up.
    assert {
        (g.timeline.start, g.timeline.bucket_seconds, len(g.timeline.counts))
        for g in groups
        if g.timeline
    } == {(blipped.timeline.start, 21_600, len(blipped.timeline.counts))}


def test_timeline_json_shape() -> None:
    (group,) = grouping_of({"apps.t": [NOW - 10 * MINUTE, NOW - 10 * MINUTE + 5, NOW]})
    data = json.loads(json.dumps(group.to_json()))
    assert data["timeline"] == {
        "start": "2027-01-15T07:50:00Z",
        "bucket_seconds": 60,
        "counts": [2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
    }


def test_a_group_with_no_enqueue_time_has_no_timeline() -> None:
    grouping = Grouping(now=NOW)
    grouping.add(_info("t"), message_id="m", sent_at=None, receive_count=1, redrive_count=0)
    (group,) = grouping.sorted_groups()
    assert group.timeline is None and group.to_json()["timeline"] is None
    assert fit_timelines([]) == []


def test_a_group_keeps_counts_per_bucket_never_the_messages() -> None:
    times = SentTimes()
    for i in range(100_000):
        times.add(NOW - (i % 20_000) * 61.0)  # two weeks, every minute
    assert len(times.counts) <= KEPT_BUCKETS
    assert sum(times.counts.values()) == 100_000


@given(
    st.lists(
        st.lists(st.floats(min_value=NOW - 30 * DAY, max_value=NOW), min_size=0, max_size=300),
        min_size=1,
        max_size=4,
    )
)
def test_fitted_timelines_count_every_message_once_in_its_own_bucket(
    per_group: list[list[float]],
) -> None:
    accumulators = []
    for times in per_group:
        acc = SentTimes()
        for ts in times:
            acc.add(ts)
        accumulators.append(acc)
    fitted = fit_timelines(accumulators)
    for times, timeline in zip(per_group, fitted, strict=True):
        if not times:
            assert timeline is None
            continue
        assert timeline is not None
        expected = [0] * len(timeline.counts)
        for ts in times:
            expected[int((ts - timeline.start) // timeline.bucket_seconds)] += 1
        assert list(timeline.counts) == expected
        assert len(timeline.counts) <= MAX_BUCKETS


# -- the terminal ----------------------------------------------------------------------------


def test_sparkline_scales_to_its_peak_and_leaves_empty_buckets_blank() -> None:
    assert sparkline([0, 1, 4, 8]) == " ▁▄█"
    assert sparkline([0, 1, 4, 8], ascii_only=True) == " .=@"
    assert sparkline([0, 0]) == "  "


def test_timeline_lines_fit_the_width_and_say_the_span() -> None:
    times = {
        "apps.payments.tasks.capture_payment_with_a_really_long_name": [
            NOW - 2 * DAY + i * HOUR for i in range(48)
        ],
        "apps.b": [NOW],
    }
    groups = grouping_of(times)
    full = timeline_lines(groups)
    assert full[0] == "enqueued 2027-01-13 08:00Z .. 2027-01-15 09:00Z (one mark: 1h):"
    assert "apps.payments.tasks.capture_payment_with_a_really_long_name" in full[1]
    for width in (60, 80, 120):
        narrow = timeline_lines(groups, width=width)
        assert all(len(line) <= width for line in "\n".join(narrow).splitlines()), narrow
        assert "capture_payment" in narrow[1]
    # 49 hours in 16 columns (60 less the label): four hours a mark.
    assert "(one mark:\n4h)" in timeline_lines(groups, width=60)[0]
    assert "(one mark: 1h)" in timeline_lines(groups, width=120)[0]


def test_inspect_and_report_text_show_a_timeline_per_group() -> None:
    groups = grouping_of({"apps.a": [NOW - HOUR, NOW], "apps.b": [NOW - 30 * MINUTE]})
    result = result_of(groups)
    for text in (
        inspect_text(result),
        report_text(Report(NOW, "x", [FamilyReport("checkout", "dlq", result)])),
    ):
        lines = text.splitlines()
        assert any(line.startswith("enqueued 2027-01-15 07:00Z") for line in lines), text
        assert any(line.startswith("  apps.a  █") for line in lines), text
        assert any(line.startswith("  apps.b  ") and "█" in line for line in lines), text
    ascii_text = inspect_text(result, ascii_only=True)
    assert "█" not in ascii_text and "  apps.a  @" in ascii_text
    markdown = report_text(Report(NOW, "x", [FamilyReport("f", "d", result)]), markdown=True)
    # In Markdown the timeline is an indented code block: nothing in it is markup.
    assert "\n\n    enqueued 2027-01-15 07:00Z" in markdown
    assert "\n      apps.a  █" in markdown


def test_ascii_where_the_output_is_not_utf8() -> None:
    assert not wants_ascii("utf-8") and not wants_ascii("UTF8")
    assert wants_ascii("ascii") and wants_ascii("ANSI_X3.4-1968") and wants_ascii(None)
    assert wants_ascii("latin-1")


# -- the commands ----------------------------------------------------------------------------


def test_inspect_json_and_text_have_a_timeline_per_group(family: Family, cli: Cli) -> None:
    for i in range(3):
        family.send_to_dlq(encode("apps.shop.tasks.charge", [i]))
    family.send_to_dlq("not celery")
    data = as_json(cli.ok("inspect", "checkout", "--json"))
    for group in data["groups"]:
        timeline = group["timeline"]
        assert set(timeline) == {"start", "bucket_seconds", "counts"}
        assert timeline["bucket_seconds"] in BUCKET_LADDER
        assert sum(timeline["counts"]) == group["count"]
    text = cli.ok("inspect", "checkout").stdout
    assert "enqueued " in text and "(one mark: " in text
    assert "█" in cli.ok("inspect", "checkout").stdout
    ascii_text = cli.ok("inspect", "checkout", "--ascii").stdout
    assert "█" not in ascii_text and "@" in ascii_text
    assert "--ascii" in cli("inspect", "--help").stdout


def test_report_json_and_text_have_timelines(all_families: dict[str, Family], cli: Cli) -> None:
    all_families["checkout"].send_to_dlq(encode("apps.shop.tasks.charge", [1]))
    data = as_json(cli.ok("report", "--format", "json"))
    (group,) = data["queues"][0]["groups"]
    assert sum(group["timeline"]["counts"]) == 1
    assert "(one mark: " in cli.ok("report").stdout
    assert "█" not in cli.ok("report", "--ascii").stdout
    assert "--ascii" in cli("report", "--help").stdout


def test_an_output_that_is_not_utf8_gets_ascii_timelines(
    all_families: dict[str, Family], cli: Cli
) -> None:
    """Block characters on an ASCII stdout would be an encoding error, not a picture."""
    all_families["checkout"].send_to_dlq(encode("apps.shop.tasks.charge", [1]))
    for args in (["inspect", "checkout"], ["report"]):
        result = cli(*args, charset="ascii")
        assert result.exit_code == 0, (result.output, result.exception)
        assert "(one mark: " in result.stdout and "@" in result.stdout


def test_a_task_name_cannot_forge_a_timeline_line() -> None:
    groups = grouping_of({"apps.t\x1b[2J\nfake line": [NOW]})
    text = "\n".join(timeline_lines(groups))
    assert "\x1b" not in text and not any(
        line.startswith("fake line") for line in text.splitlines()
    )


def test_with_group_by_exception_each_line_names_its_exception() -> None:
    (group,) = grouping_of({"apps.t": [NOW]})
    group.exception = "ValueError"
    assert timeline_lines([group])[1].startswith("  apps.t (ValueError)  █")


def test_a_state_group_is_named_with_one_pair_of_parentheses() -> None:
    # --group-by exception names a group with no exception by its state, in parentheses
    # already: the label must not double them, in the timeline nor in the sample headings.
    groups = []
    for state in ("(SUCCESS)", "(no record)", "ValueError"):
        (group,) = grouping_of({"apps.t": [NOW]})
        group.exception = state
        groups.append(group)
    lines = timeline_lines(groups)
    assert [line.split("  ")[1] for line in lines[1:]] == [
        "apps.t (SUCCESS)",
        "apps.t (no record)",
        "apps.t (ValueError)",
    ]
    assert not any("((" in line for line in lines)
