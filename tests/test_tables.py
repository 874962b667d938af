"""Tables fit the terminal: the least useful columns go first, long names are shortened in
the middle, a row is never wrapped into noise; ``--wide`` (or a pipe without COLUMNS) shows
everything."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import wcwidth
from click.testing import Result
from conftest import Cli, Family, as_json

from redrive.broker.sqs.native import MoveTask
from redrive.cli import console as cli_module
from redrive.inspection.groups import TaskGroup
from redrive.inspection.scan import InspectResult
from redrive.ledger import RunInfo
from redrive.render.audit import audit_table, run_detail_text
from redrive.render.check import findings_table
from redrive.render.inspect import inspect_text
from redrive.render.native import move_tasks_table
from redrive.render.report import report_text
from redrive.render.status import status_table
from redrive.render.tables import fitted_table, shorten_middle, shorten_task, table
from redrive.reporting.audit import RunDetail
from redrive.reporting.check import Finding
from redrive.reporting.report import FamilyReport, Report
from redrive.reporting.status import FamilyStatus, QueueCounts
from redrive.sandbox.encoder import encode

NOW = 1_800_000_000.0
HOUR = 3600.0
LONG_TASKS = [
    "apps.webhooks.tasks.save_checkout_ibft",
    "apps.payments.tasks.capture_payment",
    "apps.engagements.tasks.save_progress_lesson",
    "(unknown)",
]
UUIDS = [f"{i:08x}-a3e5-4f26-af97-7888ba8c22c6" for i in range(3)]


def widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def groups() -> list[TaskGroup]:
    out = []
    for i, task in enumerate(LONG_TASKS):
        g = TaskGroup(task=task, count=20 - i, oldest=NOW - 5 * HOUR, newest=NOW - HOUR)
        g.max_receive_count = 6
        g.expired = i
        g.leaving_within_24h = 2
        g.sample_task_ids = list(UUIDS)
        out.append(g)
    return out


def inspect_result() -> InspectResult:
    gs = groups()
    return InspectResult(
        label="checkout",
        dlq="onion-checkout-dlq",
        dlq_url="https://sqs.us-east-1.amazonaws.com/123456789012/onion-checkout-dlq",
        sources=["onion-checkout"],
        total=sum(g.count for g in gs),
        groups=gs,
        oldest=NOW - 5 * HOUR,
        scanned_at=NOW,
        seconds=0.5,
        depth_before=sum(g.count for g in gs),
        hidden_before=3,
        partial=False,
    )


# -- the pieces -----------------------------------------------------------------------------


def test_a_task_name_keeps_its_last_dotted_part() -> None:
    name = "apps.payments.tasks.capture_payment"
    assert shorten_task(name, 40) == name
    short = shorten_task(name, 24)
    assert len(short) == 24 and short.endswith(".capture_payment") and short.startswith("apps.")
    assert shorten_task("(unknown)", 5) == "(unk\u2026"
    # The last dotted part is whole even where it is wider than the cell (it was cut to
    # `a.xxxxxxxxx…`, the README's promise broken): the table makes room another way.
    assert shorten_task("a." + "x" * 30, 12) == "\u2026." + "x" * 30
    assert shorten_task("apps.notifications.tasks.send_welcome_email", 12).endswith(
        ".send_welcome_email"
    )


def test_a_queue_name_keeps_both_ends() -> None:
    short = shorten_middle("atlas-prod-notifications-dlq", 16)
    assert len(short) == 16 and short.startswith("atlas-p") and short.endswith("ons-dlq")


def test_without_a_width_a_fitted_table_is_the_whole_table() -> None:
    rows = [["a" * 50, "b" * 50, "c"]]
    assert fitted_table(rows, ["x", "y", "z"], width=None) == table(rows, ["x", "y", "z"])


# -- each table at 80 columns ---------------------------------------------------------------


def test_inspect_at_80_columns_drops_sample_ids_first_and_keeps_task_names_recognisable() -> None:
    result = inspect_result()
    full = inspect_text(result)
    assert widest(full) > 200, "the full table is as wide as its cells"
    assert UUIDS[0] in full and "2027-01-15 03:00Z (5h ago)" in full
    narrow = inspect_text(result, width=80)
    assert widest(narrow) <= 80, narrow
    assert UUIDS[0] not in narrow
    lines = narrow.splitlines()
    for task in LONG_TASKS:
        last = task.rsplit(".", 1)[-1]
        assert any(last in line for line in lines), (task, narrow)
    # What an incident needs stays: counts, age, receives, expired, poison, leaving <24h.
    header = " ".join(lines[2:4])
    for column in ("task", "count", "oldest", "consumer", "expired", "poison", "leaving"):
        assert column in header, header
    assert "5h ago" in narrow
    # The notes are folded to the width too.
    assert "in flight" in narrow


def test_inspect_at_120_columns_keeps_more() -> None:
    text = inspect_text(inspect_result(), width=120)
    assert widest(text) <= 120
    assert "apps.engagements.tasks.save_progress_lesson" in text
    assert "newest" in text


def test_status_has_no_error_column_unless_a_family_has_an_error() -> None:
    ok_rows = [
        FamilyStatus(
            name,
            f"onion-{name}",
            f"onion-{name}-dlq",
            QueueCounts(12, 3, 0),
            QueueCounts(1042, 0, 7),
            14 * 86400,
        )
        for name in ("checkout", "progress")
    ]
    assert "error" not in status_table(ok_rows)
    broken = [*ok_rows, FamilyStatus("default", "onion", None, None, None, None, "queue is gone")]
    assert "error" in status_table(broken).splitlines()[0]
    for rows in (ok_rows, broken):
        narrow = status_table(rows, width=80)
        assert widest(narrow) <= 80, narrow
        assert "1042 / 0 / 7" in narrow and "12 / 3 / 0" in narrow
    assert "14d" in status_table(ok_rows, width=80)
    assert "queue is gone" in status_table(broken, width=80)


def test_report_at_80_columns() -> None:
    result = inspect_result()
    report = Report(
        NOW,
        "built-in",
        [
            FamilyReport("checkout", "onion-checkout-dlq", result),
            FamilyReport("progress", "onion-progress-dlq", result),
        ],
    )
    full = report_text(report)
    assert widest(full) > 80 and "error" not in full.splitlines()[2]
    narrow = report_text(report, width=80)
    assert widest(narrow) <= 80, narrow
    assert "save_progress_lesson" in narrow
    # Markdown is for documents: never narrowed.
    assert report_text(report, markdown=True, width=80) == report_text(report, markdown=True)


def audit_runs() -> list[RunInfo]:
    command = (
        "redrive move checkout --task 'apps.payments.*' --older-than 1h --execute --yes "
        "--ledger dynamodb://atlas-prod-redrive-ledger"
    )
    return [
        RunInfo(
            run_id=f"{i:016x}",
            command="move",
            started_at=NOW - i * HOUR,
            heartbeat_at=NOW,
            lease_until=NOW,
            ended_at=NOW,
            outcome="completed",
            info={
                "command_line": command,
                "target": "checkout",
                "aws_arn": "arn:aws:sts::123456789012:assumed-role/oncall-admin/jane.doe",
            },
            counts={"matched": 120, "moved": 118, "skipped": 2, "duplicates_deleted": 1},
        )
        for i in range(3)
    ]


def test_audit_at_80_columns() -> None:
    runs = audit_runs()
    full = audit_table(runs, now=NOW)
    assert widest(full) > 200
    narrow = audit_table(runs, width=80, now=NOW)
    assert widest(narrow) <= 80, narrow
    for each in runs:
        assert each.run_id in narrow, "the run id is what `audit RUN` takes"
    assert "completed" in narrow and "redrive move checkout" in narrow


def test_tasks_at_80_columns() -> None:
    tasks = [
        MoveTask(
            status="FAILED",
            moved=1200,
            to_move=5000,
            started=NOW - HOUR,
            failure_reason="AWS.SimpleQueueService.NonExistentQueue: the destination queue "
            "does not exist or you do not have access to it",
            handle=None,
            source_arn="arn:aws:sqs:us-east-1:123456789012:onion-checkout-dlq",
            destination_arn="arn:aws:sqs:us-east-1:123456789012:atlas-prod-checkout-replay",
            rate=100,
        ),
        MoveTask("COMPLETED", 40, 40, NOW - 2 * HOUR, None, None, "arn:src", None, None),
    ]
    narrow = move_tasks_table(tasks, dlq="onion-checkout-dlq", now=NOW, width=80)
    assert widest(narrow) <= 80, narrow
    # A failure reason is a sentence: wrapped within its column, never cut.
    assert "doesnotexistoryoudonothaveaccesstoit" in "".join(narrow.split())
    assert "failure reason" not in move_tasks_table(tasks[1:], dlq="d", now=NOW)


def test_check_findings_at_80_columns_are_wrapped_not_cut() -> None:
    problem = (
        "RedrivePolicy points to atlas-prod-notifications-old-dlq, expected "
        "atlas-prod-notifications-dlq: fix the queue's RedrivePolicy"
    )
    findings = [Finding("notify", "atlas-prod-notifications", problem)]
    narrow = findings_table(findings, width=80)
    assert widest(narrow) <= 80, narrow
    assert " ".join(narrow.split()).count("RedrivePolicy") == 2


def test_run_detail_is_unchanged_by_width() -> None:
    run = audit_runs()[0]
    text = run_detail_text(RunDetail(run=run, keys=[]))
    assert "counts:   matched 120, moved 118, skipped 2, duplicates deleted 1" in text


# -- through the CLI -------------------------------------------------------------------------


def seed(family: Family) -> None:
    for i, task in enumerate(LONG_TASKS[:3] * 3):
        family.send_to_dlq(encode(task, [i], {}, task_id=f"{i:04d}-{UUIDS[0]}"))


def lines_of(result: Result) -> list[str]:
    return result.stdout.splitlines()


@pytest.fixture
def columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


def test_cli_inspect_fits_columns_and_wide_shows_everything(
    family: Family, columns: None, cli: Cli
) -> None:
    seed(family)
    narrow = cli.ok("inspect", "checkout")
    assert max(len(line) for line in lines_of(narrow)) <= 80, narrow.stdout
    assert "sample ids" not in narrow.stdout
    wide = cli.ok("inspect", "checkout", "--wide")
    assert "sample ids" in wide.stdout and f"0000-{UUIDS[0]}" in wide.stdout
    assert "apps.engagements.tasks.save_progress_lesson" in wide.stdout
    assert max(len(line) for line in lines_of(wide)) > 80


def test_cli_status_report_check_audit_fit_columns(
    all_families: dict[str, Family], columns: None, tmp_path: Path, cli: Cli
) -> None:
    seed(all_families["checkout"])
    assert cli.ok("move", "checkout", "--execute", "--yes").exit_code == 0
    seed(all_families["checkout"])
    for args in (("status",), ("report",), ("check",), ("audit",)):
        result = cli(*args)
        assert result.exit_code in (0, 1), result.output
        assert max(len(line) for line in lines_of(result)) <= 80, (args, result.stdout)
    wide = cli.ok("audit", "--wide").stdout
    assert "who" in wide and "redrive move checkout --execute --yes" in wide
    # A report to a file has no terminal: every column, whatever COLUMNS says.
    out = tmp_path / "report.txt"
    cli.ok("report", "--output", str(out))
    assert "apps.engagements.tasks.save_progress_lesson" in out.read_text()


def test_a_pipe_without_columns_shows_everything(family: Family, cli: Cli) -> None:
    seed(family)
    text = cli.ok("inspect", "checkout").stdout
    assert "sample ids" in text and "apps.engagements.tasks.save_progress_lesson" in text


def test_table_width(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(
        shutil, "get_terminal_size", lambda fallback=(80, 24): os.terminal_size((97, 30))
    )
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert cli_module.table_width(False) is None, "a pipe: no limit"
    monkeypatch.setenv("COLUMNS", "60")
    assert cli_module.table_width(False) == 60, "a pipe with COLUMNS: that"
    assert cli_module.table_width(True) is None, "--wide: no limit"
    monkeypatch.delenv("COLUMNS")
    monkeypatch.setattr(sys, "stdout", Terminal())
    assert cli_module.table_width(False) == 97, "a terminal: its width"


def test_json_is_never_narrowed(family: Family, columns: None, cli: Cli) -> None:
    seed(family)
    data = as_json(cli.ok("inspect", "checkout", "--json"))
    assert {g["task"] for g in data["groups"]} == set(LONG_TASKS[:3])


# -- every view, with every wide column -------------------------------------------------------

WIDE_TASKS = {
    # task -> (state, exception) recorded in the result backend for its messages
    "apps.notifications.tasks.send_welcome_email": (
        "FAILURE",
        ConnectionRefusedError(
            "smtp.internal.example.com:587 refused the connection: the relay's pool of "
            "connections for tenant 42 is exhausted, and the fallback relay is not configured"
        ),
    ),
    "apps.payments.tasks.capture_payment": ("STARTED", None),
    "apps.reports.tasks.export_quarterly_revenue_csv": (
        "FAILURE",
        LookupError("no column named created_at_in_the_tenants_own_timezone"),
    ),
    "apps.通知.tasks.发送欢迎邮件给新用户": (
        "FAILURE",
        UnicodeEncodeError("ascii", "é", 0, 1, "x"),
    ),
    "apps.fun.tasks.🎉_celebrate_order": ("PENDING", None),
    "apps.legacy.tasks.resync_inventory_of_every_warehouse": ("FAILURE", None),
}

ROUTER_ERROR = (
    "the routing service at https://routing.internal.example.com/v2/queues answered 503 "
    "Service Unavailable while it looked up the queue of this task for the current tenant"
)

WIDE_APP = f"""
from celery import Celery

app = Celery("wide", set_as_current=False)
app.conf.task_default_queue = "onion-checkout"


def route(name, args, kwargs, options, task=None, **kw):
    if name.endswith("send_welcome_email"):
        raise RuntimeError({ROUTER_ERROR!r})
    if name.startswith("apps.payments."):
        return {{"queue": "onion-progress"}}
    return None


app.conf.task_routes = (route,)

def _task(name):
    def run(*args, **kwargs):
        return None

    return app.task(name=name, shared=False)(run)


for _name in {sorted(WIDE_TASKS)[:-1]!r}:
    _task(_name)
"""


def wide_world(all_families: dict[str, Family], tmp_path: Path) -> list[str]:
    """A DLQ whose views have every wide column: the result backend's states and
    exceptions, a router's routes and its error, unregistered tasks, long and CJK/emoji task
    names. Returns the global options that show them."""
    from celery import Celery

    url = f"db+sqlite:///{tmp_path}/results.sqlite"
    backend = Celery("wide-results", backend=url, set_as_current=False).backend
    n = 0
    for task, (state, exc) in WIDE_TASKS.items():
        for i in range(3):
            n += 1
            task_id = f"{n:04d}-{UUIDS[0][5:]}"
            all_families["checkout"].send_to_dlq(encode(task, [i], {"n": i}, task_id=task_id))
            backend.store_result(task_id, exc, "FAILURE" if i == 2 and exc else state)
            if i == 1 and state == "FAILURE":
                backend.store_result(task_id, RuntimeError("Worker exited prematurely"), "FAILURE")
    # A finding: progress's queue dead-letters into checkout's DLQ.
    policy = {"deadLetterTargetArn": all_families["checkout"].dlq_arn, "maxReceiveCount": "5"}
    all_families["progress"].client.set_queue_attributes(
        QueueUrl=all_families["progress"].queue_url,
        Attributes={"RedrivePolicy": json.dumps(policy)},
    )
    module = f"wide_app_{os.getpid()}_{tmp_path.name[-6:].replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(WIDE_APP)
    return ["--celery-app", f"{module}:app", "--result-backend", url]


def assert_fits(text: str, width: int, what: object) -> None:
    for line in text.splitlines():
        # The columns a terminal gives the line (a CJK character or an emoji: two).
        if wcwidth.wcswidth(line) <= width:
            continue
        # Only a suggested command, on its own line, may be wider: it must paste whole.
        alone = re.fullmatch(r"[(]?`redrive [^`]*`[);:,.]*", line.strip())
        assert line.strip().startswith("redrive ") or alone, (what, width, line, text)


def assert_task_names_keep_their_last_part(text: str, what: object, *, every: bool) -> None:
    """``every``: each task is listed, so each last dotted part must show."""
    for task in WIDE_TASKS if every else ():
        last = task.rsplit(".", 1)[-1]
        assert last in text, (what, task, text)
    lasts = tuple("." + task.rsplit(".", 1)[-1] for task in WIDE_TASKS)
    for word in text.split():
        # A shortened name is cut in its module path, never in its last dotted part.
        if word.startswith(("apps.", "\u2026.")) and "\u2026" in word:
            assert word.split("\u2026", 1)[1] in lasts, (what, word, text)


@pytest.mark.parametrize("width", [80, 200])
def test_every_view_fits_its_width_with_every_wide_column(
    all_families: dict[str, Family],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli: Cli,
    width: int,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    app = wide_world(all_families, tmp_path)
    monkeypatch.setenv("COLUMNS", str(width))
    # --wide: the full table, whatever COLUMNS says (the router's error in its cell).
    wide = cli(*app, "inspect", "checkout", "--wide").stdout
    assert max(len(line) for line in wide.splitlines()) > 250
    assert any(
        ROUTER_ERROR in line and "send_welcome_email  " in line for line in wide.splitlines()
    )
    moved = cli(*app, "move", "checkout", "--wide").stdout.splitlines()
    assert any(len(line) > 120 and "(by route; source onion-checkout)" in line for line in moved)
    plan = str(tmp_path / "plan.json")
    archive = str(tmp_path / "wide.jsonl.gz")
    where = ["--where", "kwargs.n == `2` || kwargs.n == `1` || kwargs.n == `0` || task == 'x'"]
    views: list[tuple[str, ...]] = [
        ("status",),
        ("inspect", "checkout", *where),
        ("inspect", "checkout", "--group-by", "exception"),
        ("inspect", "checkout", "--show-args"),
        ("report", "--since-last"),
        ("report", "--since-last"),
        ("check",),
        ("check", "--celery"),
        ("move", "checkout", *where),
        ("move", "checkout", "--plan-out", plan),
        ("apply", plan),
        ("purge", "checkout", "--archive", archive),
        ("purge", "checkout", "--archive", archive, "--task", "apps.fun.*", "--execute", "--yes"),
        ("replay", archive, "--to", "onion-checkout"),
        ("move", "checkout", "--to", "onion-checkout", "--execute", "--yes"),
        ("audit",),
    ]
    for view in views:
        result = cli(*app, *view)
        assert result.exit_code in (0, 1, 3), (view, result.output)
        assert "Traceback" not in result.output, result.output
        assert_fits(result.stdout, width, view)
        every = view[0] in ("inspect", "report", "move") and "--execute" not in view
        assert_task_names_keep_their_last_part(result.stdout, view, every=every)
    run_id = as_json(cli.ok("audit", "--json"))["runs"][0]["run_id"]
    assert_fits(cli(*app, "audit", run_id).stdout, width, "audit RUN")


def test_cjk_and_emoji_task_names_are_measured_by_display_width() -> None:
    # Two columns a character in a terminal: measured by len() the table was cut too
    # late and its columns (and the timelines' marks) stood out of line.
    from redrive.inspection.groups import Grouping
    from redrive.messages import decode

    tasks = [
        "apps.通知.tasks.发送欢迎邮件给所有新用户",
        "apps.fun.tasks.🎉_party",
        "apps.a.tasks.b",
    ]
    grouping = Grouping(now=NOW)
    for i, task in enumerate(tasks):
        for n in range(10):  # the same hours for each: the same marks
            info = decode(encode(task, [n], task_id=f"{i}-{n}"))
            sent = NOW - (n + 1) * HOUR
            grouping.add(
                info, message_id=f"{i}-{n}", sent_at=sent, receive_count=1, redrive_count=0
            )
    result = inspect_result()
    result.groups = grouping.sorted_groups()
    for width in (60, 80, 200, None):
        text = inspect_text(result, width=width)
        lines = text.splitlines()
        if width is not None:
            assert max(wcwidth.wcswidth(line) for line in lines) <= width, text
        rows = [
            line
            for line in lines
            if "  1" in line and line.split()[0].endswith(("新用户", "party", ".b"))
        ]
        assert len(rows) == 3, text
        # Each count starts in the same terminal column: the names were padded by width.
        starts = {wcwidth.wcswidth(row[: row.index("  1") + 2]) for row in rows}
        assert len(starts) == 1, text
        marks = [line for line in lines if "\u2588" in line]
        assert len(marks) == 3, text
        # The same marks after names padded by width: lines of one width.
        assert len({wcwidth.wcswidth(line) for line in marks}) == 1, marks


def test_inspects_hints_name_only_options_of_the_command_they_name(
    all_families: dict[str, Family], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    # inspect has no --include-unregistered, --include-expired or --route: a hint that
    # offers one says whose it is (`move --route source`), as the command to run.
    from datetime import UTC, datetime, timedelta

    from redrive.cli import cli as group

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    app = wide_world(all_families, tmp_path)
    expired = datetime.now(UTC) - timedelta(hours=1)
    all_families["checkout"].send_to_dlq(encode("apps.a.tasks.b", [1], expires=expired))
    options = {name: {o for p in c.params for o in p.opts} for name, c in group.commands.items()}
    archive = str(tmp_path / "all.jsonl.gz")
    cli.ok(*app, "archive", "checkout", "--archive", archive)
    for target, command in (("checkout", "move"), (archive, "replay")):
        text = cli(*app, "inspect", target, "--wide").stdout
        hints = [line for line in text.splitlines() if line.startswith(("hint:", "note:"))]
        offered = [m for line in hints for m in re.findall(r"(?:`(\w+) )?(--[a-z][a-z-]*)", line)]
        assert {"--include-unregistered", "--include-expired", "--route"} <= {o for _, o in offered}
        for named, option in offered:
            assert option in options[named or "inspect"], (target, named, option, hints)
            assert named in ("", command), (target, named, option, hints)
