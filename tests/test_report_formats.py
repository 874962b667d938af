"""``report --format prometheus`` and ``report --since-last``."""

from __future__ import annotations

import json
import re

from conftest import Cli, Family

from redrive.inspection.groups import TaskGroup
from redrive.inspection.scan import InspectResult
from redrive.render.report import report_prometheus, since_last_text
from redrive.reporting.alerts import changes_since, snapshot
from redrive.reporting.report import FamilyReport, Report
from redrive.sandbox.encoder import encode

NOW = 1_800_000_000.0
CHARGE = "apps.shop.tasks.charge"
MAIL = "apps.mail.tasks.send_receipt"

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL_VALUE = r'"(?:[^"\\\n]|\\["\\n])*"'
LABELS = rf"\{{(?:{NAME}={LABEL_VALUE})(?:,{NAME}={LABEL_VALUE})*\}}"
SAMPLE = re.compile(rf"^({NAME})({LABELS})? (-?[0-9.]+(?:e[+-]?\d+)?)$")
HELP = re.compile(rf"^# HELP ({NAME}) \S.*$")
TYPE = re.compile(rf"^# TYPE ({NAME}) (gauge|counter|untyped)$")


def parse_exposition(text: str) -> dict[str, list[tuple[str, float]]]:
    """A strict reading of the text format: name -> [(labels, value)]; fails on bad lines."""
    assert text.endswith("\n")
    samples: dict[str, list[tuple[str, float]]] = {}
    helped: set[str] = set()
    typed: set[str] = set()
    for line in text.splitlines():
        if m := HELP.match(line):
            assert m.group(1) not in helped
            helped.add(m.group(1))
        elif m := TYPE.match(line):
            assert m.group(1) in helped and m.group(1) not in typed
            assert m.group(1) not in samples  # TYPE before the samples
            typed.add(m.group(1))
        else:
            m = SAMPLE.match(line)
            assert m, f"not a valid sample line: {line!r}"
            assert m.group(1) in typed
            samples.setdefault(m.group(1), []).append((m.group(2) or "", float(m.group(3))))
    for lines in samples.values():
        labels = [labels for labels, _ in lines]
        assert len(labels) == len(set(labels)), "a series appears twice"
    return samples


def add(family: Family, task: str, n: int) -> None:
    for i in range(n):
        family.send_to_dlq(encode(task, [i], {}))


# -- prometheus -------------------------------------------------------------------------------


def test_prometheus_escapes_label_values() -> None:
    odd = 'tasks.weird"name\\with\nnewline'
    result = InspectResult(
        label="checkout",
        dlq="onion-checkout-dlq",
        dlq_url="u",
        sources=[],
        total=3,
        groups=[TaskGroup(task=odd, count=2), TaskGroup(task=CHARGE, count=1)],
        oldest=NOW - 90,
        scanned_at=NOW,
        seconds=0.1,
        depth_before=3,
        hidden_before=0,
        partial=False,
    )
    report = Report(
        generated_at=NOW,
        layout="built-in",
        queues=[
            FamilyReport("checkout", "onion-checkout-dlq", result),
            FamilyReport("progress", None, None, "queue onion-progress does not exist"),
        ],
    )
    text = report_prometheus(report)
    samples = parse_exposition(text)
    tasks = dict(samples["redrive_dlq_task_messages"])
    base = 'family="checkout",dlq="onion-checkout-dlq"'
    assert tasks[f'{{{base},task="tasks.weird\\"name\\\\with\\nnewline"}}'] == 2
    assert tasks[f'{{{base},task="{CHARGE}"}}'] == 1
    assert dict(samples["redrive_dlq_oldest_message_age_seconds"])[f"{{{base}}}"] == 90
    errors = dict(samples["redrive_dlq_scan_error"])
    assert errors == {f"{{{base}}}": 0, '{family="progress",dlq=""}': 1}
    assert samples["redrive_report_generated_timestamp_seconds"] == [("", NOW)]


def test_prometheus_through_the_cli(all_families: dict[str, Family], cli: Cli) -> None:
    add(all_families["checkout"], CHARGE, 2)
    add(all_families["checkout"], MAIL, 1)
    add(all_families["progress"], MAIL, 1)
    # The default family's queue goes missing: its scan-error gauge is 1.
    all_families["default"].client.delete_queue(QueueUrl=all_families["default"].queue_url)
    result = cli("report", "--format", "prometheus")
    assert result.exit_code == 1  # a family could not be read
    samples = parse_exposition(result.stdout)
    for name in (
        "redrive_dlq_messages",
        "redrive_dlq_task_messages",
        "redrive_dlq_oldest_message_age_seconds",
        "redrive_dlq_poison_messages",
        "redrive_dlq_expired_messages",
        "redrive_dlq_leaving_within_24h_messages",
        "redrive_dlq_scan_error",
        "redrive_report_generated_timestamp_seconds",
    ):
        assert f"# HELP {name} " in result.stdout and f"# TYPE {name} gauge" in result.stdout
    messages = dict(samples["redrive_dlq_messages"])
    assert messages == {
        '{family="checkout",dlq="onion-checkout-dlq"}': 3,
        '{family="progress",dlq="onion-progress-dlq"}': 1,
    }
    tasks = dict(samples["redrive_dlq_task_messages"])
    assert tasks[f'{{family="checkout",dlq="onion-checkout-dlq",task="{CHARGE}"}}'] == 2
    assert tasks[f'{{family="checkout",dlq="onion-checkout-dlq",task="{MAIL}"}}'] == 1
    assert tasks[f'{{family="progress",dlq="onion-progress-dlq",task="{MAIL}"}}'] == 1
    errors = {labels: v for labels, v in samples["redrive_dlq_scan_error"]}
    assert [labels for labels, v in errors.items() if v == 1] == [
        next(labels for labels in errors if 'family="default"' in labels)
    ]
    assert sum(errors.values()) == 1
    assert "warning: default:" in result.stderr


# -- since-last -------------------------------------------------------------------------------


def test_changes_since_core() -> None:
    def rep(**tasks: int) -> Report:
        groups = [TaskGroup(task=t.replace("_", "."), count=n) for t, n in tasks.items()]
        total = sum(tasks.values())
        result = InspectResult(
            "checkout", "d", "u", [], total, groups, None, NOW, 0.1, total, 0, False
        )
        return Report(NOW, "built-in", [FamilyReport("checkout", "d", result)])

    first = changes_since({}, rep(a_x=1))
    assert first[0].previous_messages is None and first[0].delta is None
    assert first[0].new_tasks == {}  # the first report has no "new" tasks
    assert "first report" in since_last_text(first)
    previous = {"generated_at": NOW - 60, "families": snapshot(rep(a_x=1, a_y=2))}
    [change] = changes_since(previous, rep(a_x=4, a_y=1, a_z=2))
    assert change.previous_at == NOW - 60
    assert (change.previous_messages, change.messages, change.delta) == (3, 7, 4)
    assert change.new_tasks == {"a.z": 2} and change.grown_tasks == {"a.x": 3}
    text = since_last_text([change], markdown=True)
    assert text.startswith("## Since the last report")
    assert "+4" in text and "a.z (2)" in text and "a.x (+3)" in text


def test_since_last_through_the_cli(all_families: dict[str, Family], cli: Cli) -> None:
    family = all_families["checkout"]
    add(family, CHARGE, 1)
    first = cli.ok("report", "--since-last").stdout
    assert "since the last report:" in first and "first report" in first

    unchanged = cli.ok("report", "--since-last").stdout
    assert "unchanged" in unchanged

    add(family, CHARGE, 2)
    add(family, MAIL, 1)
    text = cli.ok("report", "--since-last", "--format", "markdown").stdout
    assert "## Since the last report" in text
    row = next(line for line in text.splitlines() if line.startswith("| checkout") and "+3" in line)
    assert f"{MAIL} (1)" in row and f"{CHARGE} (+2)" in row

    add(family, MAIL, 2)
    data = json.loads(cli.ok("report", "--since-last", "--format", "json").stdout)
    change = next(c for c in data["since_last"] if c["family"] == "checkout")
    assert (change["previous_messages"], change["messages"], change["delta"]) == (4, 6, 2)
    assert change["new_tasks"] == {} and change["grown_tasks"] == {MAIL: 2}
    assert isinstance(change["previous_report_at"], float)
    # Without --since-last: no section, and the snapshot is not touched.
    plain = json.loads(cli.ok("report", "--format", "json").stdout)
    assert "since_last" not in plain
    again = json.loads(cli.ok("report", "--since-last", "--format", "json").stdout)
    assert next(c for c in again["since_last"] if c["family"] == "checkout")["delta"] == 0
