"""The ``redrive`` command through click's CliRunner, against in-process moto (mock_aws).

Every error a user can cause must come out as one ``Error: ...`` line with a documented
exit code (1: error, 2: bad usage, 3: done but needs attention), never a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import pytest
from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders
from click.testing import Result
from conftest import REGION, Cli, Family, as_json, free_port, make_family
from test_sqs import FOREIGN, foreign_endpoint

from redrive import __version__
from redrive.aws.session import AwsSettings
from redrive.broker import sqs as sqs_backend
from redrive.broker.sqs import SqsBroker
from redrive.cli import cli as redrive_group
from redrive.cli.exit_codes import EXIT_ATTENTION, EXIT_ERROR, EXIT_USAGE
from redrive.keys import key_for
from redrive.ledger import Claim, default_ledger_path, open_ledger
from redrive.messages import decode
from redrive.sandbox.encoder import encode

CHARGE = "apps.shop.tasks.charge"
MAIL = "apps.mail.tasks.send_receipt"


def assert_one_error(result: Result, exit_code: int, *fragments: str) -> str:
    """Exactly one ``Error:`` line, the documented exit code, and no traceback."""
    assert result.exit_code == exit_code, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    if exit_code != EXIT_USAGE:
        # Usage errors add click's usage hint; every other error is that line alone.
        assert result.output.strip().splitlines() == errors, result.output
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def seed(family: Family, charges: int = 3, mails: int = 1) -> None:
    for i in range(charges):
        family.send_to_dlq(encode(CHARGE, [i], {"card": "tok"}, task_id=f"charge-{i}"))
    for i in range(mails):
        family.send_to_dlq(encode(MAIL, [], {"order": i}, task_id=f"mail-{i}"))


# -- help and version -----------------------------------------------------------------------

# Options each command must document; commands added later are covered by the generic test.
KEY_OPTIONS = {
    "status": ["--json"],
    "inspect": ["--limit", "--show-args", "--json", "--workers"],
    "report": ["--format", "--output", "--fail-on-messages"],
    "move": [
        "--execute",
        "--yes",
        "--task",
        "--exclude-task",
        "--older-than",
        "--limit",
        "--to",
        "--ledger",
        "--in-doubt",
        "--json",
        "--processes",
    ],
    "purge": ["--execute", "--yes", "--archive", "--task", "--processes"],
    "archive": ["--archive", "--task", "--processes"],
    "replay": ["--to", "--execute", "--processes"],
    "apply": ["--execute", "--processes"],
    "sandbox": ["--port", "--messages"],
}


def test_group_help_lists_every_command_and_global_option(cli: Cli) -> None:
    for flag in ("--help", "-h"):
        text = cli.ok(flag).output
        assert "Usage: redrive" in text
        for name in redrive_group.commands:
            assert name in text
        for option in ("--endpoint-url", "--region", "--profile", "--config", "--version"):
            assert option in text


def test_no_command_shows_usage(cli: Cli) -> None:
    result = cli()
    assert result.exit_code in (0, 2)
    assert "Usage: redrive" in result.output


def test_the_core_commands_exist() -> None:
    assert {"status", "inspect", "report", "move"} <= set(redrive_group.commands)


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and subcommand, found at collection time: later ones are covered too."""
    paths = []
    for name, command in sorted(group.commands.items()):
        paths.append((*prefix, name))
        if isinstance(command, click.Group):
            paths.extend(command_paths(command, (*prefix, name)))
    return paths


@pytest.mark.parametrize("path", command_paths(redrive_group), ids=" ".join)
def test_every_command_help_mentions_its_options(path: tuple[str, ...], cli: Cli) -> None:
    command: click.Command = redrive_group
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    for flag in ("--help", "-h"):
        text = cli.ok(*path, flag).output
        assert text.startswith(f"Usage: redrive {' '.join(path)}")
        documented = [
            opt
            for param in command.params
            if isinstance(param, click.Option) and not param.hidden
            for opt in param.opts
            if opt.startswith("--")
        ]
        for option in documented + KEY_OPTIONS.get(" ".join(path), []):
            assert option in text, f"{' '.join(path)} --help does not mention {option}"
        if isinstance(command, click.Group):
            for sub in command.commands:
                assert sub in text
        first_line = (command.help or "").split("\n")[0].strip()
        assert first_line, f"{' '.join(path)} has no help text"
        assert first_line[:30] in " ".join(text.split())


def test_version_in_process(cli: Cli) -> None:
    assert cli.ok("--version").output.strip() == f"redrive, version {__version__}"


@pytest.mark.e2e
def test_python_m_redrive_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "redrive", "--version"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"redrive, version {__version__}"


# -- status ---------------------------------------------------------------------------------


def test_status_table(all_families: dict[str, Family], cli: Cli) -> None:
    seed(all_families["checkout"], charges=2, mails=0)
    lines = cli.ok("status").output.splitlines()
    assert "family" in lines[0]
    assert lines[-1] == "broker: SQS at https://sqs.us-east-1.amazonaws.com"
    checkout = next(line for line in lines if line.startswith("checkout"))
    assert "onion-checkout-dlq" in checkout and "2 / 0 / 0" in checkout
    assert any(line.startswith("default") and "onion-dlq" in line for line in lines)
    assert any(line.startswith("progress") for line in lines)


def test_status_json_shape(all_families: dict[str, Family], cli: Cli) -> None:
    seed(all_families["default"], charges=1, mails=1)
    data = as_json(cli.ok("status", "--json"))
    assert data["layout"] == "built-in"
    # SQS has no version to say: named by its endpoint (issue 39).
    assert data["broker"] == {
        "kind": "sqs",
        "version": None,
        "endpoint": "https://sqs.us-east-1.amazonaws.com",
        "tested": None,
    }
    by_name = {f["family"]: f for f in data["families"]}
    assert list(by_name) == ["checkout", "default", "progress"]
    default = by_name["default"]
    assert default["queue"] == "onion" and default["dlq"] == "onion-dlq"
    assert default["dlq_counts"] == {"visible": 2, "in_flight": 0, "delayed": 0}
    assert default["queue_counts"] == {"visible": 0, "in_flight": 0, "delayed": 0}
    assert default["dlq_retention_seconds"] == 14 * 86400
    assert default["error"] is None


def test_status_missing_family_is_reported_in_its_row(family: Family, cli: Cli) -> None:
    # Only checkout exists: the other rows carry their error, and the exit code says so.
    result = cli("status", "--json")
    assert result.exit_code == EXIT_ERROR
    assert "Traceback" not in result.output
    by_name = {f["family"]: f for f in as_json(result)["families"]}
    assert by_name["checkout"]["error"] is None
    assert "does not exist" in by_name["default"]["error"]


# -- inspect --------------------------------------------------------------------------------


def test_inspect_text_groups_by_task_and_leaves_the_dlq(family: Family, cli: Cli) -> None:
    seed(family, charges=3, mails=1)
    family.send_to_dlq("not a celery message")
    text = cli.ok("inspect", "checkout").output
    assert "onion-checkout-dlq" in text and "5 message(s)" in text
    charge = next(line for line in text.splitlines() if line.startswith(CHARGE))
    assert " 3 " in charge and "charge-0" in charge
    assert any(line.startswith(MAIL) for line in text.splitlines())
    assert any(line.startswith("(unknown)") for line in text.splitlines())
    assert family.depth() == (5, 0)


def test_inspect_json_shape(family: Family, cli: Cli) -> None:
    seed(family, charges=3, mails=2)
    data = as_json(cli.ok("inspect", "checkout", "--json"))
    assert data["total"] == 5
    assert data["target"] == "checkout" and data["dlq"] == "onion-checkout-dlq"
    assert data["sources"] == ["onion-checkout"]
    assert data["partial"] is False
    groups = {g["task"]: g for g in data["groups"]}
    assert [g["task"] for g in data["groups"]] == [CHARGE, MAIL]
    assert groups[CHARGE]["count"] == 3 and groups[MAIL]["count"] == 2
    for g in data["groups"]:
        assert {"task", "count", "oldest", "newest", "sample_task_ids"} <= set(g)
        assert "sample_args" not in g
    assert family.depth() == (5, 0)


def test_inspect_limit(family: Family, cli: Cli) -> None:
    seed(family, charges=12, mails=0)
    data = as_json(cli.ok("inspect", "checkout", "--limit", "4", "--json"))
    assert data["total"] == 4
    assert data["partial"] is True
    assert "--limit" in cli.ok("inspect", "checkout", "--limit", "4").output
    assert family.depth() == (12, 0)


def test_inspect_show_args(family: Family, cli: Cli) -> None:
    seed(family, charges=1, mails=0)
    assert "sample arguments" not in cli.ok("inspect", "checkout").output
    text = cli.ok("inspect", "checkout", "--show-args").output
    assert f"sample arguments of {CHARGE}:" in text
    assert "args=(0,) kwargs={'card': 'tok'}" in text
    data = as_json(cli.ok("inspect", "checkout", "--show-args", "--json"))
    assert data["groups"][0]["sample_args"] == [{"args": "(0,)", "kwargs": "{'card': 'tok'}"}]


def test_inspect_by_queue_name_and_url(family: Family, cli: Cli) -> None:
    seed(family, charges=1, mails=0)
    assert as_json(cli.ok("inspect", "onion-checkout-dlq", "--json"))["total"] == 1
    assert as_json(cli.ok("inspect", "onion-checkout", "--json"))["total"] == 1
    assert as_json(cli.ok("inspect", family.dlq_url, "--json"))["total"] == 1


# -- report ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["table", "markdown", "json"])
def test_report_to_a_file(
    all_families: dict[str, Family], tmp_path: Path, fmt: str, cli: Cli
) -> None:
    seed(all_families["checkout"], charges=2, mails=1)
    out = tmp_path / "reports" / f"dlq.{fmt}"
    out.parent.mkdir()
    out.write_text("an older report\n")
    result = cli.ok("report", "--format", fmt, "--output", str(out))
    assert result.stdout == ""
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no temp file left
    text = out.read_text()
    if fmt == "json":
        data = json.loads(text)
        assert data["total"] == 3
        queues = {q["family"]: q for q in data["queues"]}
        assert queues["checkout"]["messages"] == 3
        assert {g["task"]: g["count"] for g in queues["checkout"]["groups"]} == {
            CHARGE: 2,
            MAIL: 1,
        }
        assert queues["default"]["messages"] == 0
    elif fmt == "markdown":
        assert text.startswith("# DLQ report")
        assert "## checkout (onion-checkout-dlq)" in text
        assert any(line.startswith(f"| {CHARGE}") for line in text.splitlines())
    else:
        assert text.startswith("DLQ report")
        assert "checkout (onion-checkout-dlq):" in text
        assert "|" not in text
    assert CHARGE in text
    assert all_families["checkout"].depth() == (3, 0)


def test_report_to_stdout(all_families: dict[str, Family], cli: Cli) -> None:
    seed(all_families["progress"], charges=1, mails=0)
    text = cli.ok("report").stdout
    assert "progress (onion-progress-dlq):" in text and CHARGE in text


def test_report_fail_on_messages(all_families: dict[str, Family], cli: Cli) -> None:
    cli.ok("report", "--fail-on-messages")
    seed(all_families["progress"], charges=1, mails=0)
    result = cli("report", "--fail-on-messages", "--format", "json")
    assert result.exit_code == EXIT_ERROR
    assert as_json(result)["total"] == 1
    cli.ok("report")  # without the flag, messages are no failure


def test_report_output_into_a_missing_directory(
    all_families: dict[str, Family], tmp_path: Path, cli: Cli
) -> None:
    result = cli("report", "--output", str(tmp_path / "nope" / "r.md"))
    assert_one_error(result, EXIT_ERROR, str(tmp_path / "nope" / "r.md"))


def test_report_write_failure_keeps_the_old_report(
    all_families: dict[str, Family], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    import errno

    out = tmp_path / "dlq.md"
    out.write_text("the previous report\n")

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    result = cli("report", "--format", "markdown", "--output", str(out))
    assert_one_error(result, EXIT_ERROR, str(out), "No space left on device")
    assert out.read_text() == "the previous report\n"
    # No temporary left beside it ("state" is conftest's REDRIVE_STATE_DIR: the report's
    # scans counted their receives there).
    assert [p.name for p in tmp_path.iterdir() if p.name != "state"] == ["dlq.md"]


# -- move -----------------------------------------------------------------------------------


def test_move_dry_run_changes_nothing(family: Family, cli: Cli) -> None:
    seed(family, charges=3, mails=1)
    text = cli.ok("move", "checkout").output
    assert text.startswith("DRY RUN")
    assert "4 would move" in text
    assert family.depth() == (4, 0)
    assert family.depth(family.queue_url) == (0, 0)
    assert not default_ledger_path().exists()
    data = as_json(cli.ok("move", "checkout", "--json"))
    assert data["dry_run"] is True and data["moved"] == 4
    assert family.depth() == (4, 0)


def test_move_execute_json(family: Family, cli: Cli) -> None:
    seed(family, charges=3, mails=1)
    data = as_json(cli.ok("move", "checkout", "--execute", "--yes", "--json"))
    assert {"dry_run", "matched", "moved", "skipped", "failed", "in_doubt", "by_task"} <= set(data)
    assert data["dry_run"] is False
    assert (data["matched"], data["moved"], data["failed"], data["in_doubt"]) == (4, 4, 0, 0)
    assert data["skipped"] == 0
    assert data["by_task"] == {CHARGE: 3, MAIL: 1}
    assert family.depth() == (0, 0)
    moved = family.drain(family.queue_url)
    assert sorted(decode(m["Body"]).task_id or "" for m in moved) == [
        "charge-0",
        "charge-1",
        "charge-2",
        "mail-0",
    ]
    # A rerun finds nothing left to do.
    again = as_json(cli.ok("move", "checkout", "--execute", "--yes", "--json"))
    assert again["matched"] == 0 and again["moved"] == 0


def test_move_execute_without_yes_refuses_when_stdin_is_not_a_terminal(
    family: Family, cli: Cli
) -> None:
    # Issue 11: with no terminal to confirm on, --execute alone must not act (test_confirm.py).
    seed(family, charges=2, mails=0)
    result = cli("move", "checkout", "--execute")
    assert result.exit_code == EXIT_USAGE
    assert "--yes" in result.output and "[y/N]" not in result.output
    assert family.depth(family.queue_url) == (0, 0) and family.depth() == (2, 0)


def test_move_with_filters(family: Family, cli: Cli) -> None:
    seed(family, charges=2, mails=2)
    data = as_json(cli.ok("move", "checkout", "--task", "apps.mail.*", "--execute", "-y", "--json"))
    assert data["by_task"] == {MAIL: 2}
    assert family.depth() == (2, 0)


def test_move_failed_sends_exit_3(
    family: Family, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    from redrive.broker.base import BatchResult

    def refuse(self: SqsBroker, url: str, entries: Any) -> BatchResult:
        return BatchResult({}, {e.id: "KMS.DisabledException: key disabled" for e in entries})

    monkeypatch.setattr(SqsBroker, "send_batch", refuse)
    seed(family, charges=2, mails=0)
    result = cli("move", "checkout", "--execute", "--yes")
    assert result.exit_code == EXIT_ATTENTION, result.output
    assert "Traceback" not in result.output
    assert "2 failed" in result.output
    assert "KMS.DisabledException" in result.output
    assert family.depth() == (2, 0)  # nothing lost


def test_move_in_doubt_exit_3_and_lists_task_and_id(family: Family, cli: Cli) -> None:
    body = encode(CHARGE, [7], {}, task_id="in-doubt-task")
    message_id = family.send_to_dlq(body)
    seed(family, charges=1, mails=0)
    # A run that claimed the key and died before confirming its send.
    ledger = open_ledger(None)
    try:
        ledger.start_run("deadrun", command="move", info={"host": "elsewhere"})
        key = key_for(decode(body), message_id=message_id, generation=0, body=body, namespace="sqs")
        ledger.claim_many("deadrun", [Claim(key, CHARGE, message_id, family.queue_url)])
        ledger.end_run("deadrun", outcome="failed", counts={})
    finally:
        ledger.close()

    result = cli("move", "checkout", "--execute", "--yes")
    assert result.exit_code == EXIT_ATTENTION, result.output
    assert "1 in doubt" in result.output
    line = next(line for line in result.output.splitlines() if "in-doubt-task" in line)
    assert CHARGE in line and message_id in line
    assert family.depth() == (1, 0)  # held in the DLQ, neither resent nor deleted

    data = as_json(cli("move", "checkout", "--execute", "--yes", "--json"))
    assert data["in_doubt"] == 1
    assert data["in_doubt_messages"][0]["task_id"] == "in-doubt-task"


# -- layouts: config file and environment ------------------------------------------------------

ATLAS = """
[defaults]
prefix = "atlas-prod"
max_receive_count = 4

[families.default]
queue = "atlas-prod-default"

[families.notify]
queue = "atlas-prod-notify"

[families.export]
queue = "atlas-prod-export"
dlq = "atlas-prod-export-dead"
"""


@pytest.fixture
def atlas(sqs_client: Any, tmp_path: Path) -> dict[str, Any]:
    families = {
        "default": make_family(sqs_client, "atlas-prod-default"),
        "notify": make_family(sqs_client, "atlas-prod-notify"),
    }
    # The export queue has no RedrivePolicy: its DLQ is named in the config only.
    sqs_client.create_queue(QueueName="atlas-prod-export")
    export_dlq = sqs_client.create_queue(QueueName="atlas-prod-export-dead")["QueueUrl"]
    config = tmp_path / "atlas.toml"
    config.write_text(ATLAS)
    return {"families": families, "export_dlq": export_dlq, "config": str(config)}


def test_config_layout_status(atlas: dict[str, Any], cli: Cli) -> None:
    seed(atlas["families"]["notify"], charges=1, mails=2)
    data = as_json(cli.ok("--config", atlas["config"], "status", "--json"))
    assert data["layout"] == atlas["config"]
    by_name = {f["family"]: f for f in data["families"]}
    assert list(by_name) == ["default", "notify", "export"]
    assert by_name["notify"]["dlq"] == "atlas-prod-notify-dlq"
    assert by_name["notify"]["dlq_counts"]["visible"] == 3
    assert by_name["export"]["dlq"] == "atlas-prod-export-dead"
    assert all(f["error"] is None for f in data["families"])


def test_config_layout_inspect_and_move(atlas: dict[str, Any], sqs_client: Any, cli: Cli) -> None:
    seed(atlas["families"]["notify"], charges=2, mails=0)
    data = as_json(cli.ok("--config", atlas["config"], "inspect", "notify", "--json"))
    assert data["target"] == "notify" and data["total"] == 2
    sqs_client.send_message(QueueUrl=atlas["export_dlq"], MessageBody=encode(MAIL, [], {}))
    moved = as_json(
        cli.ok("--config", atlas["config"], "move", "export", "--execute", "-y", "--json")
    )
    assert moved["moved"] == 1 and moved["by_task"] == {MAIL: 1}
    export_url = sqs_client.get_queue_url(QueueName="atlas-prod-export")["QueueUrl"]
    assert len(sqs_client.receive_message(QueueUrl=export_url)["Messages"]) == 1
    # The built-in names mean nothing under this layout.
    assert_one_error(cli("--config", atlas["config"], "inspect", "checkout"), EXIT_ERROR)


def test_config_from_environment(
    atlas: dict[str, Any], monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    monkeypatch.setenv("REDRIVE_CONFIG", atlas["config"])
    data = as_json(cli.ok("status", "--json"))
    assert [f["family"] for f in data["families"]] == ["default", "notify", "export"]


def test_config_from_the_cli_fixtures_env(atlas: dict[str, Any], cli: Cli) -> None:
    # The fixture's env= reaches the command as its environment, for this call only.
    data = as_json(cli.ok("status", "--json", env={"REDRIVE_CONFIG": atlas["config"]}))
    assert [f["family"] for f in data["families"]] == ["default", "notify", "export"]
    assert "REDRIVE_CONFIG" not in os.environ
    built_in = as_json(cli("status", "--json"))  # the atlas has none of these queues
    assert "notify" not in [f["family"] for f in built_in["families"]]


def test_the_cli_fixture_catches_or_raises_an_unexpected_exception(
    family: Family, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(sqs_backend, "open_sqs", broken)
    caught = cli("inspect", "checkout")
    assert isinstance(caught.exception, RuntimeError) and caught.exit_code == 1
    with pytest.raises(RuntimeError, match="a bug"):
        cli.raising("inspect", "checkout")
    with pytest.raises(AssertionError):
        cli.ok("inspect", "checkout")


def test_env_overrides_the_checkout_queue(
    sqs_client: Any, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    monkeypatch.setenv("CELERY_CHECKOUT_QUEUE", "shop-checkout")
    shop = make_family(sqs_client, "shop-checkout")
    make_family(sqs_client, "onion")
    make_family(sqs_client, "onion-progress")
    seed(shop, charges=2, mails=0)
    data = as_json(cli.ok("inspect", "checkout", "--json"))
    assert data["dlq"] == "shop-checkout-dlq" and data["total"] == 2
    status = {f["family"]: f for f in as_json(cli.ok("status", "--json"))["families"]}
    assert status["checkout"]["queue"] == "shop-checkout"


# -- errors: one line, a documented exit code, never a traceback --------------------------------


def test_unknown_family_or_queue(family: Family, cli: Cli) -> None:
    assert_one_error(cli("inspect", "nosuch"), EXIT_ERROR, "'nosuch'", "checkout")
    assert_one_error(cli("move", "nosuch", "--execute", "-y"), EXIT_ERROR, "'nosuch'")


def test_unknown_queue_url(family: Family, cli: Cli) -> None:
    url = family.dlq_url.replace("onion-checkout-dlq", "gone-dlq")
    assert_one_error(cli("inspect", url), EXIT_ERROR, "gone-dlq", "nor an existing queue")


def test_family_whose_queue_is_missing(sqs_client: Any, cli: Cli) -> None:
    assert_one_error(cli("inspect", "checkout"), EXIT_ERROR, "onion-checkout", "does not exist")


def test_queue_without_a_dlq(sqs_client: Any, cli: Cli) -> None:
    sqs_client.create_queue(QueueName="lonely")
    assert_one_error(cli("inspect", "lonely"), EXIT_ERROR, "lonely", "no DLQ")
    assert_one_error(cli("move", "lonely"), EXIT_ERROR, "lonely")


def test_family_queue_without_redrive_policy(sqs_client: Any, cli: Cli) -> None:
    sqs_client.create_queue(QueueName="onion-checkout")
    assert_one_error(cli("inspect", "checkout"), EXIT_ERROR, "RedrivePolicy")


def test_dlq_named_by_redrive_policy_is_gone(family: Family, cli: Cli) -> None:
    family.client.delete_queue(QueueUrl=family.dlq_url)
    assert_one_error(cli("inspect", "checkout"), EXIT_ERROR, "onion-checkout-dlq")


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("[families.x\nqueue = 1", ["not valid TOML"]),
        ('[families.main]\nqueue = "q"\ncolour = "red"', ["families.main.colour"]),
        ("[families.main]\ndlq = 'd'", ["families.main.queue"]),
        ('[defaults]\nregion = 3\n[families.m]\nqueue = "q"', ["defaults.region"]),
        ('queues = ["a"]', ["'queues'"]),
        ("[defaults]\n", ["no [families.NAME]"]),
    ],
    ids=["bad-toml", "unknown-key", "missing-queue", "bad-type", "unknown-top-key", "empty"],
)
def test_broken_config_names_file_and_key(
    sqs_client: Any, tmp_path: Path, text: str, fragments: list[str], cli: Cli
) -> None:
    config = tmp_path / "broken.toml"
    config.write_text(text)
    for command in (["status"], ["inspect", "main"], ["report"]):
        result = cli("--config", str(config), *command)
        assert_one_error(result, EXIT_ERROR, str(config), *fragments)


def test_missing_config_file(tmp_path: Path, cli: Cli) -> None:
    missing = tmp_path / "absent.toml"
    assert_one_error(cli("--config", str(missing), "status"), EXIT_ERROR, str(missing))


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["move", "checkout", "--older-than", "soon"], "--older-than"),
        (["move", "checkout", "--newer-than", "-3d"], "--newer-than"),
        (["move", "checkout", "--limit", "0"], "--limit"),
        (["move", "checkout", "--in-doubt", "maybe"], "--in-doubt"),
        (["move", "checkout", "--workers", "99"], "--workers"),
        (["inspect", "checkout", "--limit", "many"], "--limit"),
        (["report", "--format", "xml"], "--format"),
        (["move"], "TARGET"),
        (["move", "checkout", "--no-such-option"], "--no-such-option"),
    ],
)
def test_bad_option_values_exit_2(family: Family, args: list[str], option: str, cli: Cli) -> None:
    result = cli(*args)
    assert_one_error(result, EXIT_USAGE, option)
    assert result.stdout == ""
    assert family.depth() == (0, 0)


def test_unknown_command_exits_2(cli: Cli) -> None:
    assert_one_error(cli("redrive-everything"), EXIT_USAGE, "redrive-everything")


def test_bad_ledger_uri(family: Family, cli: Cli) -> None:
    seed(family, charges=1, mails=0)
    result = cli("move", "checkout", "--execute", "-y", "--ledger", "ftp://somewhere")
    assert_one_error(result, EXIT_ERROR, "ftp://somewhere")
    assert family.depth() == (1, 0)


def test_no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cli: Cli) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    # Keep botocore's credential chain on this machine: no instance metadata, no ~/.boto.
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("BOTO_CONFIG", str(tmp_path / "boto-absent"))
    endpoint = f"http://127.0.0.1:{free_port()}"
    for args in (["status"], ["inspect", "checkout"], ["report"], ["move", "checkout"]):
        result = cli("--endpoint-url", endpoint, *args)
        assert_one_error(result, EXIT_ERROR, "no AWS credentials", "AWS_PROFILE")


def test_unknown_profile(cli: Cli) -> None:
    result = cli("--profile", "nonexistent-profile", "status")
    assert_one_error(result, EXIT_ERROR, "nonexistent-profile")


def test_no_region(monkeypatch: pytest.MonkeyPatch, cli: Cli) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    endpoint = f"http://127.0.0.1:{free_port()}"
    assert_one_error(cli("--endpoint-url", endpoint, "status"), EXIT_ERROR, "--region")


def test_malformed_endpoint_url(cli: Cli) -> None:
    assert_one_error(cli("--endpoint-url", "not a url", "status"), EXIT_USAGE, "--endpoint-url")
    assert_one_error(cli("--endpoint-url", "127.0.0.1:4566", "status"), EXIT_USAGE)


def test_malformed_endpoint_url_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "not a url")
    for args in (["status"], ["inspect", "checkout"], ["report"]):
        assert_one_error(cli(*args), EXIT_ERROR, "AWS_ENDPOINT_URL", "not a url")


def test_invalid_region(family: Family, cli: Cli) -> None:
    assert_one_error(cli("--region", "bad region!", "inspect", "checkout"), EXIT_ERROR, "--region")
    # status keeps one row per family, each naming the problem.
    result = cli("--region", "bad region!", "status")
    assert result.exit_code == EXIT_ERROR
    assert "Traceback" not in result.output
    assert result.output.count("bad region!") == 3


def largest_backoffs(endpoint: str) -> list[float]:
    """The installed botocore's waits between a connection error's attempts, each draw at its
    largest: from 1.44, 50 ms doubling (1.55 s in all for six attempts); before, 1 s doubling
    (31 s in all), which is what a user of an older botocore waits for a dead endpoint."""
    from botocore.exceptions import EndpointConnectionError
    from botocore.retries import standard

    backoff = standard.ExponentialBackoff(random=lambda: 1.0)
    error = EndpointConnectionError(endpoint_url=endpoint)
    return [
        backoff.delay_amount(standard.RetryContext(attempt_number=n, caught_exception=error))
        for n in range(1, AwsSettings().max_attempts)
    ]


def test_unreachable_endpoint_fails_fast(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fast is what redrive waits on purpose (botocore's backoff between attempts), not how
    long a loaded machine takes to run it: the backoff's sleeps are recorded, not slept, with
    botocore's random draw at its largest. A dead endpoint costs one call's attempts, no more."""
    import botocore.endpoint
    from botocore.retries import standard

    slept: list[float] = []
    monkeypatch.setattr(botocore.endpoint, "time", SimpleNamespace(sleep=slept.append))
    drawn = standard.ExponentialBackoff.__init__

    def largest_draw(self: Any, *args: Any, **kwargs: Any) -> None:
        drawn(self, *args, **kwargs)
        self._random = lambda: 1.0

    monkeypatch.setattr(standard.ExponentialBackoff, "__init__", largest_draw)
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    expected = largest_backoffs(endpoint)
    for args in (["status"], ["inspect", "checkout"], ["move", "checkout", "--execute", "-y"]):
        slept.clear()
        result = cli("--endpoint-url", endpoint, *args)
        assert_one_error(result, EXIT_ERROR, "cannot reach SQS", endpoint)
        assert slept == expected, f"{args}: a dead endpoint waited {sum(slept):.2f} s to report"


@pytest.mark.parametrize("answer", list(FOREIGN))
def test_an_endpoint_that_is_not_sqs_is_one_line(
    answer: str, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    """Issue 22: `--endpoint-url http://127.0.0.1:8765 status` against a server answering
    200 `ok` ended in `KeyError: 'QueueUrl'`. Any answer that is not SQS's is one line
    naming the endpoint, exit 1, for status (three families: one line, not three) and the
    commands that read and move."""
    status, content_type, body, said = FOREIGN[answer]
    # A gateway's 5xx is retried as botocore retries any 5xx: once is enough here.
    client = AwsSettings.client
    monkeypatch.setattr(
        AwsSettings,
        "client",
        lambda self, service, **kw: client(self, service, **{**kw, "max_attempts": 1}),
    )
    with foreign_endpoint(status, content_type, body) as endpoint:
        for args in (["status"], ["inspect", "checkout", "--json"], ["move", "checkout"]):
            result = cli("--endpoint-url", endpoint, *args)
            assert result.stdout == "", (args, result.stdout)
            assert_one_error(
                result, EXIT_ERROR, f"the endpoint {endpoint} answered", said, "--endpoint-url"
            )


def fail_operation(
    monkeypatch: pytest.MonkeyPatch, operation: str, code: str, status: int
) -> list[str]:
    """Every client the CLI creates answers ``operation`` with an AWS error; other calls go
    to moto. This is the hook botocore's Stubber uses (``before-call``), for one operation."""
    original: Callable[..., Any] = AwsSettings.client
    failed: list[str] = []

    def client(self: AwsSettings, service: str, **kwargs: Any) -> Any:
        made = original(self, service, **kwargs)

        def refuse(**_: Any) -> tuple[AWSResponse, dict[str, Any]]:
            failed.append(operation)
            return AWSResponse("", status, HTTPHeaders(), None), {
                "Error": {"Code": code, "Message": f"{code} for this test"},
                "ResponseMetadata": {"HTTPStatusCode": status},
            }

        made.meta.events.register(f"before-call.sqs.{operation}", refuse)
        return made

    monkeypatch.setattr(AwsSettings, "client", client)
    return failed


def test_access_denied_names_the_iam_action(
    family: Family, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    seed(family, charges=1, mails=0)
    failed = fail_operation(monkeypatch, "ReceiveMessage", "AccessDenied", 403)
    for args in (["inspect", "checkout"], ["move", "checkout", "--execute", "-y"], ["report"]):
        result = cli(*args)
        if args == ["report"]:
            # report goes on with the other families and names the failure.
            assert result.exit_code == EXIT_ERROR
            assert "sqs:ReceiveMessage" in result.stderr
            continue
        assert_one_error(result, EXIT_ERROR, "access denied", "sqs:ReceiveMessage")
    assert failed
    assert family.depth() == (1, 0)


def test_access_denied_on_send(family: Family, monkeypatch: pytest.MonkeyPatch, cli: Cli) -> None:
    seed(family, charges=1, mails=0)
    fail_operation(monkeypatch, "SendMessageBatch", "AccessDenied", 403)
    result = cli("move", "checkout", "--execute", "-y")
    assert result.exit_code == EXIT_ERROR and "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert [line for line in lines if line.startswith("Error:")] == lines[-1:], result.output
    assert "sqs:SendMessage " in lines[-1]
    # The refused batch's claim stands in the ledger, as a rerun finds it: the summary says
    # so (issue 37, point 8), where it said nothing and the rerun held the task in doubt.
    assert "0 failed, 1 in doubt" in lines[0], result.output
    assert "in flight when this run stopped (as said below)" in result.output
    assert family.depth(family.queue_url) == (0, 0)


def test_throttling_that_outlasts_retries(
    family: Family, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    seed(family, charges=1, mails=0)
    fail_operation(monkeypatch, "ReceiveMessage", "ThrottlingException", 400)
    line = assert_one_error(cli("inspect", "checkout"), EXIT_ERROR, "throttl", "ReceiveMessage")
    assert "rerun" in line
    # Issue 22, 15: inspect has --workers but no --rate; only move and replay have one.
    assert "fewer --workers (for move and replay, or a lower --rate)" in line


def test_rejected_credentials(family: Family, monkeypatch: pytest.MonkeyPatch, cli: Cli) -> None:
    fail_operation(monkeypatch, "GetQueueUrl", "InvalidClientTokenId", 403)
    for args in (["status"], ["inspect", "checkout"], ["report"]):
        assert_one_error(cli(*args), EXIT_ERROR, "rejected the credentials", "InvalidClientTokenId")


@pytest.mark.e2e
def test_errors_never_print_a_traceback_in_a_real_process(tmp_path: Path) -> None:
    """The same one-line error from the installed entry point, not just CliRunner."""
    config = tmp_path / "broken.toml"
    config.write_text("[families.x\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT")}
    env["AWS_DEFAULT_REGION"] = REGION
    done = subprocess.run(
        [sys.executable, "-m", "redrive", "--config", str(config), "status"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=env,
    )
    assert done.returncode == EXIT_ERROR
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("Error: ")
    assert str(config) in done.stderr


def test_a_family_in_another_region_is_inspected_moved_and_purged_there(
    sqs_client: Any, tmp_path: Path, cli: Cli
) -> None:
    # The default region is REGION; this family lives in eu-west-1 only. Every worker of a
    # run must call that region, not only the resolution of the target.
    import boto3

    far = make_family(boto3.client("sqs", region_name="eu-west-1"), "far-away")
    seed(far, charges=2, mails=1)
    config = tmp_path / "far.toml"
    config.write_text('[families.far]\nqueue = "far-away"\nregion = "eu-west-1"\n')
    base = ("--config", str(config))

    assert as_json(cli.ok(*base, "inspect", "far", "--json"))["total"] == 3
    ledger = str(tmp_path / "l.sqlite3")
    moved = as_json(
        cli.ok(
            *base,
            "move",
            "far",
            "--task",
            CHARGE,
            "--execute",
            "--yes",
            "--json",
            "--ledger",
            ledger,
        )
    )
    assert (moved["moved"], moved["failed"]) == (2, 0)
    purged = as_json(
        cli.ok(
            *base,
            "purge",
            "far",
            "--execute",
            "--yes",
            "--json",
            "--archive",
            str(tmp_path / "a.jsonl"),
        )
    )
    assert purged["purged"] == 1
    assert far.depth() == (0, 0)
