"""The audit trail: every ``--execute`` run of move, purge, replay (and apply) records who ran
what, on what, and how it ended; ``redrive audit`` lists and shows them."""

from __future__ import annotations

import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from conftest import Cli, Family, as_json

from redrive.aws.identity import caller_identity
from redrive.broker import resolve_target
from redrive.broker.sqs import SqsBroker
from redrive.cli.exit_codes import EXIT_ERROR
from redrive.config import built_in_layout
from redrive.errors import RedriveError
from redrive.ledger import SqliteLedger, default_ledger_path
from redrive.operations.move import MoveEngine, MoveOptions
from redrive.reporting.audit import list_runs, run_json, run_record, show_run
from redrive.runs.lifecycle import RunRecord
from redrive.runs.observer import Callbacks
from redrive.sandbox.encoder import encode
from redrive.selection import Selection

CHARGE = "apps.shop.tasks.charge"
MAIL = "apps.mail.tasks.send_receipt"


def one_error(result: Result, exit_code: int, *fragments: str) -> None:
    assert result.exit_code == exit_code, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    assert result.output.strip().splitlines() == [
        line for line in result.output.splitlines() if line.startswith("Error:")
    ]
    assert len(result.output.strip().splitlines()) == 1
    for fragment in fragments:
        assert fragment in result.output


def seed(family: Family, charges: int = 2, mails: int = 1) -> None:
    for i in range(charges):
        family.send_to_dlq(encode(CHARGE, [i], {}, task_id=f"charge-{i}"))
    for i in range(mails):
        family.send_to_dlq(encode(MAIL, [], {"order": i}, task_id=f"mail-{i}"))


@pytest.fixture
def argv(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The command line the audit records comes from sys.argv: make it a redrive one."""

    def set_argv(*args: str) -> None:
        monkeypatch.setattr(sys, "argv", ["/usr/local/bin/redrive", *args])

    return set_argv


def cli_run(cli: Cli, argv: Any, *args: str) -> Result:
    argv(*args)
    return cli.ok(*args)


# -- the core ---------------------------------------------------------------------------------


def test_caller_identity_is_best_effort() -> None:
    class Broken:
        def get_caller_identity(self) -> Any:
            raise RuntimeError("no STS here")

    assert caller_identity(Broken) == {"aws_error": "RuntimeError"}

    class Good:
        def get_caller_identity(self) -> Any:
            return {"Arn": "arn:aws:iam::1:user/ops", "Account": "1", "UserId": "AID"}

    assert caller_identity(Good) == {
        "aws_arn": "arn:aws:iam::1:user/ops",
        "aws_account": "1",
        "aws_user_id": "AID",
    }


def test_run_record_has_who_and_what() -> None:
    record = run_record(
        command_line="redrive move checkout --execute",
        target="checkout",
        filters={"tasks": ["a"]},
        ledger="sqlite:///l",
        archive=None,
        caller={"aws_arn": "arn"},
    )
    assert record["command_line"] == "redrive move checkout --execute"
    assert record["target"] == "checkout" and record["filters"] == {"tasks": ["a"]}
    assert record["ledger"] == "sqlite:///l" and record["archive"] is None
    assert record["user"] and record["host"] and record["aws_arn"] == "arn"


def test_list_and_show_runs(tmp_path: Path) -> None:
    clock = [1000.0]
    ledger = SqliteLedger(tmp_path / "l.sqlite3", clock=lambda: clock[0])
    try:
        for run_id in ("aaaa1111", "aaaa2222", "bbbb3333"):
            ledger.start_run(run_id, command="move", info={"target": "checkout"})
            clock[0] += 100
        ledger.end_run("aaaa1111", outcome="completed", counts={"moved": 2})
        assert [r.run_id for r in list_runs(ledger, since=None)] == [
            "bbbb3333",
            "aaaa2222",
            "aaaa1111",
        ]
        assert [r.run_id for r in list_runs(ledger, since=1100.0)] == ["bbbb3333", "aaaa2222"]
        assert show_run(ledger, "bbbb").run.run_id == "bbbb3333"
        assert show_run(ledger, "aaaa1111").run.run_id == "aaaa1111"
        with pytest.raises(RedriveError, match="no run aaaa"):
            show_run(ledger, "aaaa")  # ambiguous prefix
        with pytest.raises(RedriveError, match="no run zzz"):
            show_run(ledger, "zzz")
        done = run_json(ledger.run("aaaa1111"))  # type: ignore[arg-type]
        assert done["outcome"] == "completed" and done["counts"] == {"moved": 2}
        assert done["started_at"] == "1970-01-01T00:16:40Z"
        assert run_json(ledger.run("bbbb3333"))["outcome"] == "running or crashed"  # type: ignore[arg-type]
    finally:
        ledger.close()


# -- through the CLI --------------------------------------------------------------------------


def test_no_ledger_yet(sqs_client: Any, cli: Cli) -> None:
    assert cli.ok("audit").output.strip() == "no runs recorded yet"
    assert as_json(cli.ok("audit", "--json")) == {"runs": []}
    one_error(cli("audit", "abc"), EXIT_ERROR, "no ledger yet")
    assert not default_ledger_path().exists()


def test_move_purge_replay_are_audited_newest_first(
    family: Family, tmp_path: Path, argv: Any, cli: Cli
) -> None:
    seed(family, charges=2, mails=1)
    archive = str(tmp_path / "a.jsonl")
    cli_run(cli, argv, "move", "checkout", "--task", CHARGE, "--execute", "--yes", "--json")
    cli_run(cli, argv, "purge", "checkout", "--archive", archive, "--execute", "--yes", "--json")
    cli_run(cli, argv, "replay", archive, "--to", "onion-checkout", "--execute", "--yes", "--json")

    data = as_json(cli.ok("audit", "--json"))
    assert data["ledger"].startswith("sqlite://")
    runs = data["runs"]
    assert len(runs) == 3
    replay_run, purge_run, move_run = runs
    assert [r["outcome"] for r in runs] == ["completed"] * 3
    assert [r["info"]["command_line"].split()[:2] for r in runs] == [
        ["redrive", "replay"],
        ["redrive", "purge"],
        ["redrive", "move"],
    ]
    for r in runs:
        info = r["info"]
        assert info["user"] and info["host"]
        assert info["aws_arn"].startswith("arn:aws:") and info["aws_account"]
        assert info["ledger"] == data["ledger"]
        assert r["started_at"] <= r["ended_at"]
    assert move_run["info"]["target"] == "checkout"
    assert move_run["info"]["filters"]["tasks"] == [CHARGE]
    assert move_run["counts"]["moved"] == 2
    assert purge_run["info"]["archive"] == archive
    assert purge_run["counts"]["purged"] == 1 and purge_run["counts"]["archived"] == 1
    assert replay_run["info"]["target"] == archive
    assert replay_run["counts"]["moved"] == 1

    table = cli.ok("audit").output
    for r in runs:
        assert r["run_id"] in table
    assert "completed" in table

    # One run in detail, by id and by a unique prefix: the keys it moved.
    shown = as_json(cli.ok("audit", move_run["run_id"], "--json"))
    assert shown["run_id"] == move_run["run_id"]
    assert sorted(k["task"] for k in shown["keys"]) == [CHARGE, CHARGE]
    assert {k["state"] for k in shown["keys"]} == {"done"}
    by_prefix = as_json(cli.ok("audit", move_run["run_id"][:10], "--json"))
    assert by_prefix["run_id"] == move_run["run_id"]
    text = cli.ok("audit", move_run["run_id"]).output
    assert move_run["run_id"] in text and "redrive move" in text and CHARGE in text
    assert as_json(cli.ok("audit", purge_run["run_id"], "--json"))["info"]["archive"] == archive


def test_unknown_run_id(family: Family, argv: Any, cli: Cli) -> None:
    seed(family, charges=1, mails=0)
    cli_run(cli, argv, "move", "checkout", "--execute", "--yes")
    one_error(cli("audit", "nosuchrun"), EXIT_ERROR, "no run nosuchrun")
    one_error(cli("audit", "nosuchrun", "--json"), EXIT_ERROR, "no run nosuchrun")


def test_since_narrows(family: Family, argv: Any, cli: Cli) -> None:
    seed(family, charges=1, mails=0)
    old = SqliteLedger(default_ledger_path(), clock=lambda: time.time() - 10 * 86400)
    try:
        old.start_run("oldrun00", command="move", info={"target": "checkout"})
        old.end_run("oldrun00", outcome="completed", counts={"moved": 1})
    finally:
        old.close()
    cli_run(cli, argv, "move", "checkout", "--execute", "--yes")
    assert len(as_json(cli.ok("audit", "--json"))["runs"]) == 2
    recent = as_json(cli.ok("audit", "--since", "7d", "--json"))["runs"]
    assert len(recent) == 1 and recent[0]["run_id"] != "oldrun00"
    assert as_json(cli.ok("audit", "--since", "30d", "--json"))["runs"][-1]["run_id"] == "oldrun00"
    assert cli("audit", "--since", "soon").exit_code == 2


def test_interrupted_run_shows_interrupted(family: Family, cli: Cli) -> None:
    for i in range(25):
        family.send_to_dlq(encode(CHARGE, [i], {}, task_id=f"c-{i}"))
    target = resolve_target(
        built_in_layout({}), "checkout", lambda region=None: SqsBroker(family.client)
    )
    stop = threading.Event()
    ledger = SqliteLedger(default_ledger_path())
    try:
        result = MoveEngine(
            target,
            ledger,
            MoveOptions(selection=Selection(), execute=True),
            broker_factory=lambda: SqsBroker(family.client),
            stop=stop,
            observer=Callbacks(on_progress=lambda _: stop.set()),
            record=RunRecord(
                "move",
                run_record(
                    command_line="redrive move checkout --execute",
                    target="checkout",
                    filters={},
                    ledger=ledger.location,
                    archive=None,
                    caller={},
                ),
            ),
        ).run()
    finally:
        ledger.close()
    assert result.interrupted
    runs = as_json(cli.ok("audit", "--json"))["runs"]
    assert len(runs) == 1 and runs[0]["outcome"] == "interrupted"
    assert "interrupted" in cli.ok("audit").output


def test_many_message_ids_are_stored_as_a_count(family: Family, argv: Any, cli: Cli) -> None:
    ids = [family.send_to_dlq(encode(CHARGE, [i], {}, task_id=f"c-{i}")) for i in range(12)]
    args = ["move", "checkout", "--execute", "--yes", "--json"]
    for message_id in ids:
        args += ["--message-id", message_id]
    assert as_json(cli_run(cli, argv, *args))["moved"] == 12
    few = ["move", "checkout", "--execute", "--yes", "--message-id", "not-there"]
    cli_run(cli, argv, *few)
    newest, first = as_json(cli.ok("audit", "--json"))["runs"]
    assert first["info"]["filters"]["message_ids"] == "12 ids (from a plan)"
    assert newest["info"]["filters"]["message_ids"] == ["not-there"]


def test_apply_is_audited(family: Family, tmp_path: Path, argv: Any, cli: Cli) -> None:
    seed(family, charges=1, mails=1)
    plan = str(tmp_path / "p.json")
    cli.ok("move", "checkout", "--plan-out", plan)
    cli_run(cli, argv, "apply", plan, "--execute", "--yes")
    runs = as_json(cli.ok("audit", "--json"))["runs"]
    assert len(runs) == 1
    assert runs[0]["outcome"] == "completed"
    assert runs[0]["info"]["command_line"].startswith("redrive apply")
    assert runs[0]["counts"]["moved"] == 2


# -- issue 11: an audit trail that serves incident notes --------------------------------------


def test_the_command_line_is_shell_quoted_and_pastes_back(
    family: Family, argv: Any, cli: Cli
) -> None:
    seed(family, charges=2, mails=1)
    args = ["move", "checkout", "--task", "apps.shop.*", "--exclude-task", "a b", "--execute"]
    cli_run(cli, argv, *args, "--yes", "--json")
    run_info = as_json(cli.ok("audit", "--json"))["runs"][0]["info"]
    line = run_info["command_line"]
    assert line == (
        "redrive move checkout --task 'apps.shop.*' --exclude-task 'a b' --execute --yes --json"
    )
    assert shlex.split(line) == ["redrive", *args, "--yes", "--json"]


def test_python_m_redrive_is_recorded_as_redrive(
    family: Family, monkeypatch: Any, cli: Cli
) -> None:
    seed(family, charges=1, mails=0)
    monkeypatch.setattr(sys, "argv", ["/x/redrive/__main__.py", "move", "checkout"])
    cli.ok("move", "checkout", "--execute", "--yes")
    line = as_json(cli.ok("audit", "--json"))["runs"][0]["info"]["command_line"]
    assert line == "redrive move checkout --execute --yes"


def test_the_working_directory_is_kept_and_archive_paths_are_absolute(
    family: Family, tmp_path: Path, monkeypatch: Any, cli: Cli
) -> None:
    seed(family, charges=2, mails=1)
    monkeypatch.chdir(tmp_path)
    cli.ok("purge", "checkout", "--task", CHARGE, "--archive", "rel/a.jsonl", "--execute", "--yes")
    cli.ok("replay", "rel/a.jsonl", "--to", "onion-checkout", "--execute", "--yes")
    replay_run, purge_run = as_json(cli.ok("audit", "--json"))["runs"]
    assert purge_run["info"]["cwd"] == str(tmp_path)
    assert purge_run["info"]["archive"] == str(tmp_path / "rel" / "a.jsonl")
    assert replay_run["info"]["archive"] == str(tmp_path / "rel" / "a.jsonl")
    assert replay_run["info"]["cwd"] == str(tmp_path)
    text = cli.ok("audit", purge_run["run_id"]).output
    assert f"cwd:      {tmp_path}" in text and f"archive:  {tmp_path / 'rel' / 'a.jsonl'}" in text


def test_audit_shows_filters_and_counts_as_text_not_python_reprs(
    family: Family, argv: Any, cli: Cli
) -> None:
    seed(family, charges=2, mails=1)
    args = ("move", "checkout", "--task", "apps.shop.*", "--older-than", "0s", "--execute")
    cli_run(cli, argv, *args, "--yes")
    run_id = as_json(cli.ok("audit", "--json"))["runs"][0]["run_id"]
    text = cli.ok("audit", run_id).output
    assert "filters:  --task 'apps.shop.*' --older-than 0s" in text
    assert "counts:   matched 2, moved 2, skipped 0, failed 0, in doubt 0" in text
    assert "{" not in text and "[" not in text and "'tasks'" not in text
    listing = cli.ok("audit").output
    assert "matched 2, moved 2" in listing and "{" not in listing


def test_a_purge_records_which_messages_it_deleted(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    ids = {
        family.send_to_dlq(encode(CHARGE, [i], {}, task_id=f"c-{i}")): f"c-{i}" for i in range(3)
    }
    kept = family.send_to_dlq(encode(MAIL, [], {}, task_id="m-0"))
    archive = str(tmp_path / "a.jsonl")
    purged = as_json(
        cli.ok(
            "purge",
            "checkout",
            "--task",
            CHARGE,
            "--archive",
            archive,
            "--execute",
            "--yes",
            "--json",
        )
    )
    shown = as_json(cli.ok("audit", purged["run_id"], "--json"))
    deleted = shown["info"]["deleted"]
    assert {m[0]: m[2] for m in deleted} == ids and {m[1] for m in deleted} == {CHARGE}
    assert kept not in {m[0] for m in deleted}
    text = cli.ok("audit", purged["run_id"]).output
    assert "deleted from the DLQ: 3 message(s):" in text
    for message_id, task_id in ids.items():
        line = next(line for line in text.splitlines() if line.startswith(message_id))
        assert task_id in line and CHARGE in line


def test_the_deleted_list_is_bounded_and_says_where_the_rest_is(
    family: Family, tmp_path: Path, monkeypatch: Any, cli: Cli
) -> None:
    from redrive.operations.purge import engine as purge

    monkeypatch.setattr(purge, "DELETED_KEPT", 2)
    for i in range(5):
        family.send_to_dlq(encode(CHARGE, [i], {}, task_id=f"c-{i}"))
    purged = as_json(
        cli.ok(
            "purge",
            "checkout",
            "--archive",
            str(tmp_path / "a.jsonl"),
            "--execute",
            "--yes",
            "--json",
        )
    )
    shown = as_json(cli.ok("audit", purged["run_id"], "--json"))
    assert len(shown["info"]["deleted"]) == 2 and shown["counts"]["purged"] == 5
    assert (shown["deleted_listed"], shown["deleted_truncated"]) == (2, True)  # issue 22
    text = cli.ok("audit", purged["run_id"]).output
    assert "deleted from the DLQ: 5 message(s); the first 2 are listed" in text
    assert f"the archive holds every one, with run_id {purged['run_id']}" in text


def test_an_unfiltered_purge_queue_is_audited_too(family: Family, cli: Cli) -> None:
    seed(family, charges=2, mails=1)
    cli.ok("purge", "checkout", "--no-archive", "--execute", "--yes")
    runs = as_json(cli.ok("audit", "--json"))["runs"]
    assert len(runs) == 1 and runs[0]["outcome"] == "completed"
    assert runs[0]["info"]["method"] == "purge-queue" and runs[0]["counts"]["purged"] == 3
    text = cli.ok("audit", runs[0]["run_id"]).output
    assert "by SQS PurgeQueue, which does not say which" in text


def test_a_second_ctrl_c_is_recorded_as_interrupted_not_failed(
    family: Family, tmp_path: Path, monkeypatch: Any, cli: Cli
) -> None:
    from redrive.cli import console

    for i in range(25):
        family.send_to_dlq(encode(CHARGE, [i], {}, task_id=f"c-{i}"))

    def second_ctrl_c(self: Any, text: str, *, force: bool = False) -> None:
        # What the signal handler does on a second Ctrl-C, at the next progress report.
        raise KeyboardInterrupt

    monkeypatch.setattr(console.Progress, "update", second_ctrl_c)
    archive = str(tmp_path / "a.jsonl")
    assert cli("purge", "checkout", "--archive", archive, "--execute", "--yes").exit_code != 0
    assert cli("move", "checkout", "--execute", "--yes").exit_code != 0
    move_run, purge_run = as_json(cli.ok("audit", "--json"))["runs"]
    assert move_run["outcome"] == "interrupted", move_run
    assert purge_run["outcome"] == "interrupted", purge_run
    # What the purge had deleted when it stopped is on record.
    assert purge_run["counts"]["purged"] == len(purge_run["info"]["deleted"])


def test_runs_recorded_by_an_older_redrive_still_display(tmp_path: Path) -> None:
    from redrive.render.audit import audit_table, run_detail_text

    ledger = SqliteLedger(tmp_path / "old.sqlite3", clock=lambda: 1000.0)
    try:
        ledger.start_run(
            "old1",
            command="redrive move checkout --task apps.payments.* --execute",
            info={
                "command_line": "redrive move checkout --task apps.payments.* --execute",
                "target": "checkout",
                "filters": {
                    "tasks": ["apps.payments.*"],
                    "exclude_tasks": [],
                    "older_than_seconds": 5400.0,
                    "newer_than_seconds": None,
                    "message_ids": "12 ids (from a plan)",
                    "limit": None,
                },
                "user": "ops",
                "host": "box",
                "archive": "./redrive-archive/checkout.jsonl.gz",
            },
        )
        ledger.end_run("old1", outcome="failed", counts={"matched": 3, "moved": 1})
        detail = show_run(ledger, "old1")
        runs = list_runs(ledger, since=None)
    finally:
        ledger.close()
    text = run_detail_text(detail)
    assert "filters:  --task 'apps.payments.*' --older-than 90m (12 ids (from a plan))" in text
    assert "counts:   matched 3, moved 1" in text and "cwd:" not in text
    assert "deleted from the DLQ" not in text
    assert "old1" in audit_table(runs, width=80)
