"""Smoke tests of what people read: status, inspect, report and move output."""

from __future__ import annotations

from collections import Counter

from redrive.inspection.groups import TaskGroup
from redrive.inspection.scan import InspectResult
from redrive.operations.move import Listed, MoveResult, TaskCounts
from redrive.render.inspect import inspect_text
from redrive.render.move import move_text
from redrive.render.report import report_text
from redrive.render.status import status_table
from redrive.render.tables import when
from redrive.reporting.report import FamilyReport, Report
from redrive.reporting.status import FamilyStatus, QueueCounts

NOW = 1_800_000_000.0  # 2027-01-15 08:00 UTC
HOUR = 3600.0


def group(task: str, count: int, **kw: object) -> TaskGroup:
    g = TaskGroup(task=task, count=count, oldest=NOW - 5 * HOUR, newest=NOW - HOUR)
    for name, value in kw.items():
        setattr(g, name, value)
    return g


def inspect_result(*groups: TaskGroup, **kw: object) -> InspectResult:
    values: dict[str, object] = {
        "label": "checkout",
        "dlq": "onion-checkout-dlq",
        "dlq_url": "https://sqs.us-east-1.amazonaws.com/123456789012/onion-checkout-dlq",
        "sources": ["onion-checkout"],
        "total": sum(g.count for g in groups),
        "groups": list(groups),
        "oldest": min((g.oldest for g in groups if g.oldest), default=None),
        "scanned_at": NOW,
        "seconds": 0.5,
        "depth_before": sum(g.count for g in groups),
        "hidden_before": 0,
        "partial": False,
    }
    values.update(kw)
    return InspectResult(**values)  # type: ignore[arg-type]


def test_when() -> None:
    assert when(None) == "-"
    assert when(NOW - 3 * HOUR, NOW) == "2027-01-15 05:00Z (3h ago)"


def test_status_table_lists_families_counts_and_errors() -> None:
    rows = [
        FamilyStatus(
            "checkout",
            "onion-checkout",
            "onion-checkout-dlq",
            QueueCounts(12, 3, 0),
            QueueCounts(1042, 0, 7),
            14 * 86400,
        ),
        FamilyStatus("progress", "onion-progress", None, None, None, None, "queue is gone"),
    ]
    text = status_table(rows)
    lines = text.splitlines()
    assert "family" in lines[0] and "dlq" in lines[0]
    checkout = next(line for line in lines if line.startswith("checkout"))
    assert "onion-checkout-dlq" in checkout
    assert "12 / 3 / 0" in checkout
    assert "1042 / 0 / 7" in checkout
    assert "14d" in checkout
    progress = next(line for line in lines if line.startswith("progress"))
    assert "queue is gone" in progress


def test_inspect_text_groups_by_task() -> None:
    result = inspect_result(
        group(
            "apps.shop.tasks.charge",
            40,
            max_receive_count=5,
            expired=2,
            poison=1,
            sample_task_ids=["t-1", "t-2"],
        ),
        group("(unknown)", 3, sample_message_ids=["mid-1"]),
    )
    text = inspect_text(result)
    first = text.splitlines()[0]
    assert "onion-checkout-dlq" in first and "checkout" in first and "onion-checkout" in first
    assert "43 message(s)" in first
    assert "2027-01-15 03:00Z (5h ago)" in first
    charge = next(line for line in text.splitlines() if line.startswith("apps.shop.tasks.charge"))
    assert " 40 " in charge
    assert "t-1, t-2" in charge
    unknown = next(line for line in text.splitlines() if line.startswith("(unknown)"))
    assert "mid-1" in unknown
    assert "note:" not in text


def test_inspect_text_empty_dlq() -> None:
    text = inspect_text(inspect_result())
    assert "0 message(s)" in text
    assert "task" not in text


def test_inspect_text_sample_args_and_notes() -> None:
    result = inspect_result(
        group("apps.mail.send", 2, sample_args=[{"args": "(1,)", "kwargs": "{'to': 'a@b'}"}]),
        partial=True,
        hidden_before=4,
    )
    text = inspect_text(result)
    assert "sample arguments of apps.mail.send:" in text
    assert "args=(1,) kwargs={'to': 'a@b'}" in text
    assert "--limit" in text
    assert "4 message(s) were in flight" in text


def test_inspect_text_fifo_note() -> None:
    text = inspect_text(inspect_result(group("t", 1), fifo=True))
    assert "FIFO" in text


def test_report_markdown() -> None:
    report = Report(
        generated_at=NOW,
        layout="built-in",
        queues=[
            FamilyReport(
                "checkout",
                "onion-checkout-dlq",
                inspect_result(group("apps.shop.tasks.charge", 7, poison=2)),
            ),
            FamilyReport("default", "onion-dlq", inspect_result()),
            FamilyReport("progress", None, None, "queue onion-progress does not exist"),
        ],
    )
    text = report_text(report, markdown=True)
    lines = text.splitlines()
    assert lines[0] == "# DLQ report, 2027-01-15 08:00 UTC"
    assert "7 message(s) in 3 DLQ(s)." in text
    checkout = next(line for line in lines if line.startswith("| checkout"))
    assert "| onion-checkout-dlq" in checkout and "| 7 " in checkout and "| 5h " in checkout
    assert any(line.startswith("| default") and "| 0 " in line for line in lines)
    assert any(
        line.startswith("| progress") and "queue onion-progress does not exist" in line
        for line in lines
    )
    assert "## checkout (onion-checkout-dlq)" in lines
    assert any(line.startswith("| apps.shop.tasks.charge") for line in lines)
    # Empty DLQs and failed families get no task section.
    assert not any(
        line.startswith("## default") or line.startswith("## progress") for line in lines
    )
    assert text.endswith("\n")


def test_report_plain_text() -> None:
    report = Report(
        NOW, "built-in", [FamilyReport("checkout", "dlq", inspect_result(group("t", 2)))]
    )
    text = report_text(report)
    assert text.startswith("DLQ report, 2027-01-15 08:00 UTC: 2 message(s)")
    assert "checkout (dlq):" in text
    assert "|" not in text


def move_result(**kw: object) -> MoveResult:
    result = MoveResult(dry_run=False, target="checkout", dlq="onion-checkout-dlq")
    for name, value in kw.items():
        setattr(result, name, value)
    return result


def test_move_text_summary_and_tasks() -> None:
    result = move_result(
        scanned=6,
        matched=5,
        moved=4,
        duplicates=1,
        skipped=Counter({"expired": 1}),
        tasks={
            "apps.shop.tasks.charge": TaskCounts(
                matched=4, moved=4, targets=Counter({"onion-checkout": 4})
            ),
            "apps.mail.send": TaskCounts(matched=1, skipped=Counter({"expired": 1})),
        },
    )
    text = move_text(result)
    head = text.splitlines()[0]
    assert head.startswith(
        "DLQ onion-checkout-dlq (checkout): 6 scanned, 5 matched, 4 moved, 1 skipped"
    )
    assert "0 failed, 0 in doubt, 1 duplicate copy deleted" in head
    charge = next(line for line in text.splitlines() if line.startswith("apps.shop.tasks.charge"))
    assert "onion-checkout" in charge
    mail = next(line for line in text.splitlines() if line.startswith("apps.mail.send"))
    assert "expired: 1" in mail
    assert "in doubt:" not in text


def test_move_text_dry_run_wording() -> None:
    result = move_result(dry_run=True, matched=2, moved=2, duplicates=2)
    head = move_text(result).splitlines()[0]
    assert head.startswith("DRY RUN: ")
    assert "2 would move" in head
    assert "2 duplicate copies would be deleted" in head


def test_move_text_lists_in_doubt_task_and_id() -> None:
    listed = [
        Listed("apps.shop.tasks.charge", "task-id-1", "mid-1", "celery:task-id-1:r0:g0:ab"),
        Listed("(unknown)", None, "mid-2", "sqs:mid-2:g0"),
    ]
    result = move_result(matched=2, in_doubt=2, in_doubt_messages=listed)
    text = move_text(result)
    assert "2 message(s) in doubt" in text
    assert "--in-doubt resend" in text and "--in-doubt skip" in text
    charge = next(line for line in text.splitlines() if line.startswith("apps.shop.tasks.charge"))
    assert "task-id-1" in charge and "mid-1" in charge
    unknown = next(line for line in text.splitlines() if line.startswith("(unknown)"))
    assert "mid-2" in unknown


def test_move_text_lists_failures_and_notes() -> None:
    result = move_result(
        matched=1,
        failed=1,
        failed_messages=[Listed("t", "id", "mid-9", "k", "KMS.DisabledException: off")],
        skipped=Counter({"no-target": 3}),
        still_hidden=2,
        interrupted=True,
    )
    text = move_text(result)
    assert "1 message(s) failed to send" in text
    assert "mid-9" in text and "KMS.DisabledException: off" in text
    assert "--to QUEUE" in text
    assert "2 message(s) are still hidden" in text
    assert "interrupted" in text


def no_target_line(text: str) -> str:
    return next(line for line in text.splitlines() if "skipped as no-target" in line)


def test_no_target_advice_only_offers_ways_that_work() -> None:
    """Issue 22, 15: never --to a queue that does not exist, never an option the command
    lacks, one sentence of advice."""
    missing = move_result(
        skipped=Counter({"no-target": 2}),
        no_target_reason="task t routes to onion-gone (app a:app), which cannot be used: gone",
        no_target_missing="onion-gone",
        no_target_by_route=True,
    )
    line = no_target_line(move_text(missing))
    assert "--to onion-gone" not in line and "one of: onion-gone" not in line
    assert "create queue onion-gone" in line
    assert "pass --route source" in line and "pass --to an existing queue" in line
    # A replay has no source queue: --route source is no way for it.
    replayed = no_target_line(move_text(missing, verb="replay"))
    assert "--route source" not in replayed and "create queue onion-gone" in replayed
    # apply has no --to: a new plan is the way.
    applied = no_target_line(move_text(missing, plan=True))
    assert "pass --to" not in applied
    assert "redrive move checkout --to QUEUE --plan-out FILE" in applied
    router = move_result(
        skipped=Counter({"no-target": 1}),
        no_target_reason="the router of a:app raised ValueError: boom for task t",
        no_target_by_route=True,
    )
    line = no_target_line(move_text(router))
    assert line.count("--route source") == 1 and line.count("--to QUEUE") == 1
    plain = no_target_line(move_text(move_result(skipped=Counter({"no-target": 1}))))
    assert plain.endswith("pass --to QUEUE to send them there.")


def test_skip_advice_names_only_what_the_command_can_do() -> None:
    """Issue 22, 15: a replay's messages are in an archive (purge cannot reach them there);
    apply has no --include-expired, --include-unknown or --ambiguous (a new plan has)."""
    skipped = move_result(
        skipped=Counter({"not-celery": 1, "unregistered": 1, "already-succeeded": 1, "expired": 1}),
        ambiguous_messages=[Listed("t", "id", "mid-1", "k", "copy?")],
    )
    skipped.skipped["ambiguous-copy"] = 1
    replayed = move_text(skipped, verb="replay")
    assert "purge" not in replayed.lower()
    assert "redrive inspect ARCHIVE --show-args" in replayed
    assert "They stay in the DLQ" not in replayed
    assert "pass --include-unknown" in replayed and "rerun with --ambiguous move" in replayed
    applied = move_text(skipped, plan=True)
    for flag in ("--include-expired", "--include-unknown", "--ambiguous move"):
        assert f"pass {flag}" not in applied and "moves them anyway" not in applied
        assert f"`redrive move checkout {flag} --plan-out FILE`" in applied, flag
    # apply does have --include-succeeded and --include-unregistered.
    assert "pass --include-succeeded" in applied and "pass --include-unregistered" in applied
    moved = move_text(skipped)
    assert "redrive inspect checkout --show-args" in moved and "purge them (archived)" in moved
    assert "--include-expired moves them anyway" in moved


def test_move_text_replay_verb() -> None:
    result = move_result(matched=1, moved=1)
    assert "1 replayed" in move_text(result, verb="replay")


# -- what a DLQ holds is attacker-controlled: it must not break tables or the terminal ----


def test_task_names_cannot_break_a_markdown_table() -> None:
    evil = "apps.a|b.task"
    report = Report(
        NOW, "built-in", [FamilyReport("checkout", "dlq", inspect_result(group(evil, 1)))]
    )
    text = report_text(report, markdown=True)
    row = next(line for line in text.splitlines() if "apps.a" in line and "task" in line)
    header = next(line for line in text.splitlines() if line.startswith("| task"))
    # A table row has as many unescaped cell separators as its header.
    assert row.replace("\\|", "").count("|") == header.count("|")


def test_control_characters_are_not_printed_raw() -> None:
    evil = "apps.task\x1b]0;pwned\x07\nfake line"
    result = inspect_result(
        group(
            evil,
            1,
            sample_task_ids=["id\x1b[2J"],
            sample_args=[{"args": "\x1b[31m", "kwargs": "{}"}],
        )
    )
    for text in (
        inspect_text(result),
        report_text(Report(NOW, "x", [FamilyReport("f", "d", result)])),
        report_text(Report(NOW, "x", [FamilyReport("f", "d", result)]), markdown=True),
        move_text(
            move_result(
                in_doubt=1,
                in_doubt_messages=[Listed(evil, "id\x1b[2J", "m", "k")],
                tasks={evil: TaskCounts(matched=1)},
            )
        ),
    ):
        assert "\x1b" not in text and "\x07" not in text
        assert not any(line.startswith("fake line") for line in text.splitlines())
