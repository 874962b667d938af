"""What costs a tired reader time: a dry run says what to run next, an expired count says what
to do about it, a dry run checks that its archive could be written, nothing is promised for
nothing, dry-run JSON names what would happen, help texts say what each command does, shell
completion knows the families, progress shows the total and the time left."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import pytest
from click.shell_completion import ShellComplete
from click.testing import Result
from conftest import Cli, Family, as_json
from unprivileged import as_a_user, chown_to_the_user, users_dir

from redrive.cli import cli as redrive_group
from redrive.cli import console, look, purge
from redrive.cli import move as cli_move
from redrive.cli.console import progress_text
from redrive.cli.exit_codes import EXIT_ERROR
from redrive.sandbox.encoder import encode

CHARGE = "apps.shop.tasks.charge"
MAIL = "apps.mail.tasks.send_receipt"
ROOT = Path(__file__).resolve().parent.parent


def seed(family: Family, charges: int = 2, mails: int = 1) -> None:
    for i in range(charges):
        family.send_to_dlq(encode(CHARGE, [i], {}, task_id=f"charge-{i}"))
    for i in range(mails):
        family.send_to_dlq(encode(MAIL, [], {"order": i}, task_id=f"mail-{i}"))


def next_command(result: Result) -> list[str]:
    lines = result.stdout.rstrip().splitlines()
    assert lines[-2] == "nothing was changed (dry run); to do it, run:", result.stdout
    return shlex.split(lines[-1].strip())


# -- a dry run says what to run next ------------------------------------------------------------


def test_a_dry_run_ends_with_the_command_that_does_it(family: Family, cli: Cli) -> None:
    seed(family)
    dry = cli.ok("move", "checkout", "--task", "apps.shop.*", "--limit", "5")
    words = next_command(dry)
    # No terminal to confirm on here: the command carries --yes, or it would be refused.
    assert words == [
        "redrive",
        "move",
        "checkout",
        "--task",
        "apps.shop.*",
        "--limit",
        "5",
        "--execute",
        "--yes",
    ]
    # Pasted back, it does what the dry run showed.
    done = cli.ok(*words[1:], "--json")
    assert as_json(done)["moved"] == 2
    assert family.depth(family.queue_url) == (2, 0)


def test_on_a_terminal_the_next_command_keeps_the_confirmation(
    family: Family, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    monkeypatch.setattr(console, "terminal_attached", lambda: True)
    seed(family)
    assert next_command(cli.ok("move", "checkout"))[-2:] == ["checkout", "--execute"]


def test_after_plan_out_the_next_command_applies_the_plan(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    seed(family)
    plan = str(tmp_path / "plan.json")
    words = next_command(cli.ok("--region", "us-east-1", "move", "checkout", "--plan-out", plan))
    assert words == ["redrive", "--region", "us-east-1", "apply", plan, "--execute", "--yes"]
    assert next_command(cli.ok("apply", plan)) == ["redrive", "apply", plan, "--execute", "--yes"]


def test_after_plan_out_the_next_command_keeps_every_global_options_value(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    """--celery-app's value was taken for the command's name: `redrive --celery-app apply`."""
    seed(family)
    plan = str(tmp_path / "plan.json")
    app = "redrive.sandbox.celery_app:app"
    made = cli.ok(
        "--celery-app",
        app,
        "move",
        "checkout",
        "--include-unregistered",
        "--route",
        "source",
        "--plan-out",
        plan,
    )
    words = next_command(made)
    assert words == ["redrive", "--celery-app", app, "apply", plan, "--execute", "--yes"]


def test_purge_and_replay_dry_runs_say_what_to_run_next(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    seed(family)
    archive = str(tmp_path / "a.jsonl")
    words = next_command(cli.ok("purge", "checkout", "--task", CHARGE, "--archive", archive))
    assert words[-2:] == ["--execute", "--yes"] and archive in words
    cli.ok(*words[1:])
    assert next_command(cli.ok("replay", archive, "--to", "onion-checkout"))[:3] == [
        "redrive",
        "replay",
        archive,
    ]


def test_no_next_command_when_nothing_would_change_or_for_json(family: Family, cli: Cli) -> None:
    seed(family)
    assert "to do it" not in cli.ok("move", "checkout", "--task", "nothing.matches").stdout
    assert "to do it" not in cli.ok("purge", "checkout", "--task", "nothing.matches").stdout
    json.loads(cli.ok("move", "checkout", "--json").stdout)  # JSON alone on stdout


# -- an expired count says what to do about it ---------------------------------------------------


def test_expired_messages_get_a_hint(family: Family, cli: Cli) -> None:
    past = datetime.now(UTC) - timedelta(days=1)
    family.send_to_dlq(encode(CHARGE, [1], {}, task_id="gone", expires=past))
    seed(family, charges=1, mails=0)
    text = cli.ok("move", "checkout").stdout
    assert "expired: 1" in text
    hint = next(line for line in text.splitlines() if line.startswith("hint: 1 message(s)"))
    assert "--include-expired" in hint and "redrive purge checkout" in hint
    assert "--include-expired" in cli.ok("inspect", "checkout").stdout
    assert "expired" not in next_command(cli.ok("move", "checkout", "--include-expired"))


# -- a purge dry run checks its archive could be written -----------------------------------------


def test_a_dry_run_into_a_read_only_directory_fails_like_the_execute_would(
    family: Family, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(family)
    # Root writes into read-only directories: as root (CI), the command runs as a user.
    with users_dir(tmp_path) as home:
        monkeypatch.setenv("REDRIVE_STATE_DIR", str(home / "state"))
        locked = home / "locked"
        locked.mkdir(mode=0o500)
        chown_to_the_user(locked)
        with as_a_user():
            result = cli("purge", "checkout", "--archive", str(locked / "a.jsonl.gz"))
    assert result.exit_code == EXIT_ERROR
    assert result.output.startswith("Error: permission denied writing archive")
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ("file.txt/a.jsonl.gz", "is not a directory"),
        ("file.txt/deeper/a.jsonl", "is not a directory"),
        ("old.jsonl.gz", "already exists; refusing to overwrite it"),
        ("somedir", "is a directory"),
        # Root passes every permission check; only a try tells that /proc takes no files.
        ("/proc/nope/x.jsonl.gz", "/proc refuses new files"),
    ],
)
def test_a_dry_run_refuses_an_archive_path_the_execute_would_refuse(
    family: Family, tmp_path: Path, where: str, says: str, cli: Cli
) -> None:
    seed(family)
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "old.jsonl.gz").write_bytes(b"")
    (tmp_path / "somedir").mkdir()
    dry = cli("purge", "checkout", "--archive", str(tmp_path / where))
    assert dry.exit_code == EXIT_ERROR, dry.output
    assert says in dry.output and len(dry.output.strip().splitlines()) == 1
    executed = cli("purge", "checkout", "--archive", str(tmp_path / where), "--execute", "--yes")
    assert executed.exit_code == EXIT_ERROR, "the dry run said what the execute meets"
    assert family.depth() == (3, 0)


def test_a_dry_run_into_a_new_directory_is_fine_and_creates_nothing(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    seed(family)
    where = tmp_path / "new" / "dirs" / "a.jsonl.gz"
    assert "would be archived to" in cli.ok("purge", "checkout", "--archive", str(where)).stdout
    assert not (tmp_path / "new").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".redrive-probe")]


# -- nothing matched: nothing promised, no empty archive left ------------------------------------


def test_a_purge_that_matches_nothing_promises_nothing(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    seed(family)
    archive = tmp_path / "a.jsonl.gz"
    dry = cli.ok("purge", "checkout", "--task", "no.such.task", "--archive", str(archive)).stdout
    assert dry.startswith(
        "DRY RUN: DLQ onion-checkout-dlq (checkout): 3 scanned, 0 matched: nothing would be "
        "archived or deleted"
    )
    assert "would be archived to" not in dry
    done = cli.ok(
        "purge",
        "checkout",
        "--task",
        "no.such.task",
        "--archive",
        str(archive),
        "--execute",
        "--yes",
    )
    assert "0 matched: nothing archived or deleted" in done.stdout
    assert not archive.exists(), "no empty archive is left behind"
    run_id = as_json(cli.ok("audit", "--json"))["runs"][0]["run_id"]
    assert as_json(cli.ok("audit", run_id, "--json"))["info"]["archive"] is None
    assert (
        "0 matched: nothing archived"
        in cli.ok("archive", "checkout", "--task", "no.such.task", "--archive", str(archive)).stdout
    )
    assert not archive.exists()


# -- dry-run JSON names what would happen --------------------------------------------------------


def test_dry_run_json_says_duplicates_to_delete_not_deleted(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    body = encode(CHARGE, [1], {}, task_id="charge-1")
    family.send_to_dlq(body)
    cli.ok("move", "checkout", "--execute", "--yes")
    family.send_to_dlq(body)  # a second copy of a task already sent
    dry = as_json(cli.ok("move", "checkout", "--json"))
    assert dry["dry_run"] is True
    assert dry["duplicates_to_delete"] == 1 and dry["duplicates_deleted"] == 0
    done = as_json(cli.ok("move", "checkout", "--execute", "--yes", "--json"))
    assert done["duplicates_deleted"] == 1 and "duplicates_to_delete" not in done
    # replay: what was already sent is a fact in a dry run too.
    family.send_to_dlq(body)
    archive = str(tmp_path / "a.jsonl")
    cli.ok("archive", "checkout", "--archive", archive)
    replay = as_json(cli.ok("replay", archive, "--to", "onion-checkout", "--json"))
    assert replay["already_sent"] == 1 and "duplicates_to_delete" not in replay


# -- help texts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "says", "never"),
    [
        ("inspect", "Parallel receive pipelines", "send"),
        ("archive", "Parallel receive-archive pipelines", "send"),
        ("purge", "Parallel receive-archive-delete pipelines", "send"),
        ("move", "Parallel receive-send-delete pipelines", None),
    ],
)
def test_workers_help_says_what_each_command_does(
    command: str, says: str, never: str | None, cli: Cli
) -> None:
    text = " ".join(cli.ok(command, "--help").output.split())
    assert says in text
    workers = text[text.index("--workers") :].split("--endpoint-url")[0]
    if never:
        assert never not in workers and "delet" not in workers.replace("archive-delete", "")


def test_group_help_summaries_are_not_cut_off(monkeypatch: pytest.MonkeyPatch, cli: Cli) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    for path, group in (([], redrive_group), (["ledger"], redrive_group.commands["ledger"])):
        text = cli.ok(*path, "--help").output
        rows = text[text.index("\nCommands:\n") :].splitlines()[2:]
        assert "..." not in "\n".join(rows)
        assert isinstance(group, click.Group)
        for name, command in group.commands.items():
            summary = command.short_help or (command.help or "").split(".")[0] + "."
            # Whole, and on the command's own line of an 80-column terminal.
            line = next(row for row in rows if row.split()[0] == name)
            assert line.split(None, 1)[1] == summary, (name, line)


# -- shell completion ----------------------------------------------------------------------------


def completions(words: list[str], incomplete: str) -> list[Any]:
    return ShellComplete(redrive_group, {}, "redrive", "_REDRIVE_COMPLETE").get_completions(
        words, incomplete
    )


def test_targets_complete_to_family_names() -> None:
    assert [c.value for c in completions(["inspect"], "")] == ["checkout", "default", "progress"]
    assert [c.value for c in completions(["move"], "pro")] == ["progress"]
    for command in ("purge", "archive", "tasks"):
        assert [c.value for c in completions([command], "ch")] == ["checkout"]
    item = completions(["inspect"], "ch")[0]
    assert item.help == "queue onion-checkout"


def test_targets_complete_to_the_config_files_families(tmp_path: Path) -> None:
    config = tmp_path / "atlas.toml"
    config.write_text('[families.notify]\nqueue = "atlas-notify"\n')
    assert [c.value for c in completions(["--config", str(config), "move"], "")] == ["notify"]
    # A broken config completes nothing, quietly.
    config.write_text("[families.notify\n")
    assert completions(["--config", str(config), "move"], "") == []


def test_paths_complete_as_files_and_queues_as_queue_names() -> None:
    assert [c.type for c in completions(["inspect"], "./arch")] == ["file"]
    assert [c.type for c in completions(["replay"], "")] == ["file"]
    assert [c.type for c in completions(["apply"], "")] == ["file"]
    assert [c.value for c in completions(["move", "checkout", "--to"], "onion-")] == [
        "onion-checkout",
        "onion-progress",
    ]


@pytest.mark.e2e
def test_bash_completion_through_the_real_command() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDRIVE_", "CELERY_"))}
    script = subprocess.run(
        [sys.executable, "-m", "redrive"],
        env={**env, "_REDRIVE_COMPLETE": "bash_source"},
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert script.returncode == 0 and "_redrive_completion" in script.stdout
    done = subprocess.run(
        [sys.executable, "-m", "redrive"],
        env={
            **env,
            "_REDRIVE_COMPLETE": "bash_complete",
            "COMP_WORDS": "redrive inspect ch",
            "COMP_CWORD": "2",
        },
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["plain,checkout"]


# -- progress: the total and the time left -------------------------------------------------------


def test_progress_text() -> None:
    assert progress_text(120, 1000, "received", 1.0) == "120 of ~1,000 received (120/s, ~7s left)"
    assert progress_text(120, None, "received", 1.0) == "120 received (120/s)"
    # SQS's count is approximate: past it, no end is promised.
    assert progress_text(1200, 1000, "scanned", 2.0) == "1,200 scanned (600/s)"
    assert progress_text(0, 1000, "scanned", 0.0) == "0 of ~1,000 scanned (0/s)"


def test_progress_lines_show_the_total(
    family: Family, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    shown: list[str] = []

    class Recorded(console.Progress):
        def update(self, text: str, *, force: bool = False) -> None:
            shown.append(text)

    # Each command module names the class it shows progress with.
    for commands in (look, cli_move, purge):
        monkeypatch.setattr(commands, "Progress", Recorded)
    for i in range(25):
        family.send_to_dlq(encode(CHARGE, [i], {}, task_id=f"c-{i}"))
    cli.ok("inspect", "checkout")
    assert any("of ~25 received" in line and "left" in line for line in shown), shown
    shown.clear()
    cli.ok("move", "checkout", "--task", CHARGE)
    assert any("of ~25 scanned" in line for line in shown), shown
    shown.clear()
    cli.ok("purge", "checkout")
    assert any("of ~25 scanned" in line for line in shown), shown
    shown.clear()
    cli.ok("inspect", "checkout", "--limit", "12")
    assert any("of ~12 received" in line for line in shown), shown


def test_replay_of_a_zero_byte_gzip_archive_is_an_error_not_nothing_to_do(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    archive = tmp_path / "empty.jsonl.gz"
    archive.write_bytes(b"")
    result = cli("replay", str(archive), "--to", "onion-checkout")
    assert result.exit_code == EXIT_ERROR, result.output
    assert "empty (0 bytes)" in result.output
    assert len(result.output.strip().splitlines()) == 1
