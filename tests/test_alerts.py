"""Scheduled-report alerting: ``decide_alert`` (throttle, not debounce) and
``report --fail-on-messages --alert-state F --alert-throttle DUR``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from conftest import Cli, Family

from redrive.cli.exit_codes import EXIT_ERROR, EXIT_USAGE
from redrive.errors import ConfigError
from redrive.inspection.groups import TaskGroup
from redrive.inspection.scan import InspectResult
from redrive.reporting import alerts
from redrive.reporting.alerts import decide_alert, load_state, save_state
from redrive.reporting.report import FamilyReport, Report
from redrive.sandbox.encoder import encode

NOW = 1_800_000_000.0
HOUR = 3600.0
CHARGE = "apps.shop.tasks.charge"
MAIL = "apps.mail.tasks.send_receipt"


def family_report(family: str, tasks: dict[str, int]) -> FamilyReport:
    groups = [TaskGroup(task=t, count=n) for t, n in tasks.items()]
    total = sum(tasks.values())
    result = InspectResult(
        label=family,
        dlq=f"{family}-dlq",
        dlq_url=f"https://sqs/{family}-dlq",
        sources=[family],
        total=total,
        groups=groups,
        oldest=None,
        scanned_at=NOW,
        seconds=0.1,
        depth_before=total,
        hidden_before=0,
        partial=False,
    )
    return FamilyReport(family, f"{family}-dlq", result)


def report(now: float = NOW, **families: dict[str, int]) -> Report:
    return Report(
        generated_at=now,
        layout="built-in",
        queues=[family_report(name, tasks) for name, tasks in families.items()],
    )


class Alerter:
    """Runs decide_alert the way the CLI does: the state of one run feeds the next."""

    def __init__(self, throttle: float | None = HOUR) -> None:
        self.state: dict[str, Any] = {}
        self.throttle = throttle

    def __call__(self, now: float, **families: dict[str, int]) -> alerts.AlertDecision:
        decision, self.state = decide_alert(
            self.state, report(now, **families), throttle=self.throttle, now=now
        )
        return decision


# -- decide_alert ---------------------------------------------------------------------------


def test_fires_at_once_the_first_time() -> None:
    decision = Alerter()(NOW, checkout={CHARGE: 3})
    assert decision.fire
    assert "checkout" in decision.reasons


def test_unchanged_dlq_is_throttled_then_fires_again_after_the_throttle() -> None:
    alert = Alerter(throttle=HOUR)
    assert alert(NOW, checkout={CHARGE: 3}).fire
    held = alert(NOW + 300, checkout={CHARGE: 3})
    assert not held.fire
    assert "unchanged" in held.reasons["checkout"]
    assert not alert(NOW + HOUR - 1, checkout={CHARGE: 3}).fire
    again = alert(NOW + HOUR, checkout={CHARGE: 3})
    assert again.fire and "still 3" in again.reasons["checkout"]
    # The throttle restarts from the last alert.
    assert not alert(NOW + HOUR + 300, checkout={CHARGE: 3}).fire
    assert alert(NOW + 2 * HOUR + 1, checkout={CHARGE: 3}).fire


def test_a_growing_dlq_fires_on_every_run() -> None:
    alert = Alerter(throttle=HOUR)
    for i, count in enumerate([1, 2, 3, 5, 8]):
        decision = alert(NOW + 60 * i, checkout={CHARGE: count})
        assert decision.fire, (count, decision)
        assert f"grew to {count}" in decision.reasons["checkout"] or i == 0


def test_growth_is_against_the_previous_run_not_the_previous_alert() -> None:
    alert = Alerter(throttle=HOUR)
    assert alert(NOW, checkout={CHARGE: 5}).fire
    assert not alert(NOW + 60, checkout={CHARGE: 3}).fire  # shrank: held
    # 4 is less than at the last alert (5) but more than at the previous run (3).
    decision = alert(NOW + 120, checkout={CHARGE: 4})
    assert decision.fire and "grew to 4" in decision.reasons["checkout"]


def test_a_shrinking_but_non_empty_dlq_is_held_within_the_throttle() -> None:
    alert = Alerter(throttle=HOUR)
    assert alert(NOW, checkout={CHARGE: 10}).fire
    assert not alert(NOW + 60, checkout={CHARGE: 7}).fire
    assert not alert(NOW + 120, checkout={CHARGE: 2}).fire
    assert alert(NOW + HOUR, checkout={CHARGE: 2}).fire


def test_a_new_task_group_fires_at_once() -> None:
    alert = Alerter(throttle=HOUR)
    assert alert(NOW, checkout={CHARGE: 3}).fire
    # Same total, but a task the DLQ did not hold before.
    decision = alert(NOW + 60, checkout={CHARGE: 2, MAIL: 1})
    assert decision.fire
    assert MAIL in decision.reasons["checkout"]
    assert not alert(NOW + 120, checkout={CHARGE: 2, MAIL: 1}).fire


def test_an_empty_dlq_never_fires() -> None:
    alert = Alerter(throttle=HOUR)
    for i in range(3):
        decision = alert(NOW + i * 2 * HOUR, checkout={})
        assert not decision.fire and decision.reasons == {}
    assert alert(NOW + 7 * HOUR, checkout={CHARGE: 1}).fire
    assert not alert(NOW + 8 * HOUR, checkout={}).fire
    # Refilled to the same content after being empty: it grew since the previous run.
    assert alert(NOW + 8 * HOUR + 60, checkout={CHARGE: 1}).fire


def test_families_are_judged_separately() -> None:
    alert = Alerter(throttle=HOUR)
    assert alert(NOW, checkout={CHARGE: 1}, default={}).fire
    decision = alert(NOW + 60, checkout={CHARGE: 1}, default={MAIL: 1})
    assert decision.fire
    assert "default" in decision.reasons and "unchanged" in decision.reasons["checkout"]


def test_without_a_throttle_every_non_empty_run_fires() -> None:
    alert = Alerter(throttle=None)
    assert alert(NOW, checkout={CHARGE: 1}).fire
    assert alert(NOW + 1, checkout={CHARGE: 1}).fire
    assert not alert(NOW + 2, checkout={}).fire


def test_state_round_trips_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "alert.json"
    assert load_state(path) == {}
    decision, state = decide_alert({}, report(checkout={CHARGE: 2}), throttle=HOUR, now=NOW)
    save_state(path, state)
    assert json.loads(path.read_text())["v"] == alerts.STATE_VERSION
    loaded = load_state(path)
    decision, _ = decide_alert(loaded, report(checkout={CHARGE: 2}), throttle=HOUR, now=NOW + 1)
    assert not decision.fire


def test_corrupt_or_foreign_state(tmp_path: Path) -> None:
    path = tmp_path / "alert.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable") as info:
        load_state(path)
    assert "\n" not in str(info.value)
    path.write_text(json.dumps({"v": 99, "families": {}}))
    assert load_state(path) == {}
    path.write_text("[]")
    assert load_state(path) == {}


# -- through the CLI --------------------------------------------------------------------------


def alert_run(cli: Cli, state: Path, throttle: str = "1h") -> Result:
    result = cli(
        "report",
        "--format",
        "json",
        "--fail-on-messages",
        "--alert-state",
        str(state),
        "--alert-throttle",
        throttle,
    )
    assert "Traceback" not in result.output
    assert result.exit_code in (0, EXIT_ERROR), result.output
    return result


def add(family: Family, task: str, n: int) -> None:
    for i in range(n):
        family.send_to_dlq(encode(task, [i], {}))


def test_cli_alert_throttle(all_families: dict[str, Family], tmp_path: Path, cli: Cli) -> None:
    state = tmp_path / "alert.json"
    checkout = all_families["checkout"]
    quiet = alert_run(cli, state)
    assert quiet.exit_code == 0  # empty DLQs never alert
    assert state.exists()

    add(checkout, CHARGE, 2)
    first = alert_run(cli, state)
    assert first.exit_code == EXIT_ERROR
    assert "alert FIRES: checkout: grew to 2" in first.stderr
    assert json.loads(first.stdout)["total"] == 2  # the report is still printed

    held = alert_run(cli, state)
    assert held.exit_code == 0
    assert "alert held: checkout: unchanged (2)" in held.stderr

    add(checkout, CHARGE, 1)
    assert alert_run(cli, state).exit_code == EXIT_ERROR  # grew: at once

    add(checkout, MAIL, 1)
    grown = alert_run(cli, state)
    assert grown.exit_code == EXIT_ERROR

    # After the throttle (made to have passed by rewinding the state's last alert).
    assert alert_run(cli, state).exit_code == 0
    data = json.loads(state.read_text())
    data["families"]["checkout"]["last_fired_at"] -= 2 * HOUR
    state.write_text(json.dumps(data))
    again = alert_run(cli, state)
    assert again.exit_code == EXIT_ERROR
    assert "still 4" in again.stderr


def test_cli_alert_without_a_throttle_fires_while_non_empty(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    add(family, CHARGE, 1)
    state = str(tmp_path / "alert.json")
    args = ["report", "--fail-on-messages", "--alert-state", state]
    assert cli(*args).exit_code == EXIT_ERROR
    assert cli(*args).exit_code == EXIT_ERROR


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--alert-throttle", "1h", "--fail-on-messages"], "--alert-throttle needs --alert-state"),
        (["--alert-state", "s.json"], "go with --fail-on-messages"),
        (["--alert-state", "s.json", "--alert-throttle", "1h"], "go with --fail-on-messages"),
        (["--alert-throttle", "1h"], "go with --fail-on-messages"),
    ],
)
def test_cli_alert_usage_errors(
    sqs_client: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    fragment: str,
    cli: Cli,
) -> None:
    monkeypatch.chdir(tmp_path)
    result = cli("report", *args)
    assert result.exit_code == EXIT_USAGE, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and fragment in errors[0]
    assert not (tmp_path / "s.json").exists()


def test_cli_bad_throttle_duration(sqs_client: Any, tmp_path: Path, cli: Cli) -> None:
    state = str(tmp_path / "s.json")
    result = cli(
        "report", "--fail-on-messages", "--alert-state", state, "--alert-throttle", "often"
    )
    assert result.exit_code == EXIT_USAGE


def test_cli_corrupt_state_file_is_one_line(family: Family, tmp_path: Path, cli: Cli) -> None:
    add(family, CHARGE, 1)
    state = tmp_path / "alert.json"
    state.write_text("{garbage")
    result = cli("report", "--fail-on-messages", "--alert-state", str(state))
    assert result.exit_code == EXIT_ERROR
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and str(state) in errors[0] and "unreadable" in errors[0]
    assert state.read_text() == "{garbage"  # left for a human to look at
