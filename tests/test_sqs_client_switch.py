"""``--sqs-client lean|botocore`` (issue 25, item 4): which client SQS's calls go through.
Before or after the command, env REDRIVE_SQS_CLIENT, config ``[sqs] client``; the option
over the env over the config over botocore. A bad value is a usage error naming where it
came from. The choice reaches ``open_sqs`` for the command's brokers and, through the
Wiring, for the brokers of each ``--processes`` child; an executed run's audit record says
which client ran.

The lean client itself (``redrive.broker.sqs.lean``) is written elsewhere: these tests
record the ``client`` that reaches ``open_sqs`` and open botocore's in its place."""

from __future__ import annotations

import json
import pickle
import threading
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import Result
from conftest import Cli, Family, as_json

from redrive.aws.session import AwsSettings
from redrive.broker import BrokerSettings
from redrive.broker import sqs as sqs_backend
from redrive.broker.sqs import SqsBroker
from redrive.cli.exit_codes import EXIT_ERROR, EXIT_USAGE
from redrive.config import SQS_CLIENTS, parse_config
from redrive.errors import RedriveError, UsageProblem
from redrive.operations.move import processes as move_processes
from redrive.runs.processes import ChildRun, Wiring
from redrive.sandbox.encoder import encode

CHARGE = "apps.shop.tasks.charge"
ALLOWED = "'botocore' or 'lean'"


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ``client`` of every ``open_sqs`` call, in order (each opens botocore's SQS)."""
    seen: list[str] = []
    real = sqs_backend.open_sqs

    def recording(
        settings: AwsSettings, *, region: str | None = None, client: str = "botocore"
    ) -> SqsBroker:
        seen.append(client)
        return real(settings, region=region)

    monkeypatch.setattr(sqs_backend, "open_sqs", recording)
    return seen


def config_file(tmp_path: Path, sqs: str | None) -> str:
    """A config with the built-in checkout family and, if given, an ``[sqs]`` table."""
    path = tmp_path / "redrive.toml"
    text = '[families.checkout]\nqueue = "onion-checkout"\n'
    if sqs is not None:
        text += f"\n[sqs]\n{sqs}\n"
    path.write_text(text)
    return str(path)


def one_usage_error(result: Result, *fragments: str) -> str:
    """Exit 2 with exactly one ``Error:`` line (click's usage hint may come above it)."""
    assert result.exit_code == EXIT_USAGE, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


# -- where the choice comes from ------------------------------------------------------------


def test_lean_is_the_default(family: Family, clients: list[str], cli: Cli) -> None:
    cli.ok("inspect", "checkout")
    assert clients and set(clients) == {"lean"}


@pytest.mark.parametrize(
    "args",
    [
        ("--sqs-client", "lean", "inspect", "checkout"),
        ("inspect", "checkout", "--sqs-client", "lean"),
        ("--sqs-client=lean", "inspect", "checkout"),
        ("inspect", "checkout", "--sqs-client=lean"),
    ],
    ids=["before", "after", "before=", "after="],
)
def test_the_option_before_or_after_the_command(
    family: Family, clients: list[str], cli: Cli, args: tuple[str, ...]
) -> None:
    cli.ok(*args)
    assert clients and set(clients) == {"lean"}


def test_the_environment_variable(family: Family, clients: list[str], cli: Cli) -> None:
    cli.ok("inspect", "checkout", env={"REDRIVE_SQS_CLIENT": "lean"})
    assert clients and set(clients) == {"lean"}


def test_the_config_file(family: Family, clients: list[str], tmp_path: Path, cli: Cli) -> None:
    config = config_file(tmp_path, 'client = "lean"')
    cli.ok("--config", config, "inspect", "checkout")
    assert clients and set(clients) == {"lean"}
    clients.clear()
    cli.ok("inspect", "checkout", env={"REDRIVE_CONFIG": config})
    assert clients and set(clients) == {"lean"}


@pytest.mark.parametrize(
    ("config", "env", "before", "after", "expected"),
    [
        ("lean", None, None, None, "lean"),
        ("lean", "botocore", None, None, "botocore"),
        ("botocore", "lean", None, None, "lean"),
        (None, "lean", "botocore", None, "botocore"),
        (None, "lean", None, "botocore", "botocore"),
        ("lean", "lean", "botocore", None, "botocore"),
        ("botocore", "botocore", None, "lean", "lean"),
        # Twice on the command line: the last word wins, as for the other global options.
        (None, None, "botocore", "lean", "lean"),
    ],
)
def test_the_option_over_the_env_over_the_config(
    family: Family,
    clients: list[str],
    tmp_path: Path,
    cli: Cli,
    config: str | None,
    env: str | None,
    before: str | None,
    after: str | None,
    expected: str,
) -> None:
    args = ["--config", config_file(tmp_path, f'client = "{config}"' if config else None)]
    if before:
        args += ["--sqs-client", before]
    args += ["inspect", "checkout"]
    if after:
        args += ["--sqs-client", after]
    cli.ok(*args, env={"REDRIVE_SQS_CLIENT": env})
    assert clients and set(clients) == {expected}


def test_the_config_table_is_checked() -> None:
    table = {"families": {"main": {"queue": "q"}}}
    assert parse_config(table, "f.toml").sqs_client is None
    for name in SQS_CLIENTS:
        assert parse_config({**table, "sqs": {"client": name}}, "f.toml").sqs_client == name
    with pytest.raises(UsageProblem, match=r"f.toml: key 'sqs.client' must be 'botocore' or"):
        parse_config({**table, "sqs": {"client": "fast"}}, "f.toml")
    with pytest.raises(RedriveError, match=r"unknown key 'sqs.pool'"):
        parse_config({**table, "sqs": {"pool": 3}}, "f.toml")


# -- a bad value: exit 2, one line, naming where it came from ---------------------------------


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (("--sqs-client", "boto", "inspect", "checkout"), None),
        (("inspect", "checkout", "--sqs-client", "boto"), None),
        (("--sqs-client", "boto", "audit"), None),  # refused even by a command without SQS
        (("inspect", "checkout"), {"REDRIVE_SQS_CLIENT": "boto"}),
    ],
    ids=["option-before", "option-after", "option-audit", "env"],
)
def test_a_bad_value_from_the_option_or_the_env(
    family: Family, clients: list[str], cli: Cli, args: tuple[str, ...], env: Any
) -> None:
    line = one_usage_error(cli(*args, env=env), ALLOWED, "'boto'")
    source = "REDRIVE_SQS_CLIENT" if env else "--sqs-client"
    assert line.startswith(f"Error: {source} must be"), line
    assert clients == []


@pytest.mark.parametrize("value", ['"boto"', '""', "3"], ids=["word", "empty", "number"])
def test_a_bad_value_from_the_config_file(
    family: Family, clients: list[str], tmp_path: Path, cli: Cli, value: str
) -> None:
    config = config_file(tmp_path, f"client = {value}")
    result = cli("--config", config, "inspect", "checkout")
    one_usage_error(result, config, "'sqs.client'", ALLOWED)
    assert clients == []


def test_lean_runs_a_command_on_the_lean_path(family: Family, cli: Cli) -> None:
    family.send_to_dlq("a body")
    result = cli("--sqs-client", "lean", "inspect", "checkout", "--json")
    assert result.exit_code == 0, (result.output, result.exception)
    assert json.loads(result.stdout)["total"] == 1


def test_lean_with_a_setting_it_does_not_implement_is_refused_before_anything_changes(
    family: Family, cli: Cli
) -> None:
    family.send_to_dlq("a body")
    env = {"HTTPS_PROXY": "https://127.0.0.1:9", "NO_PROXY": "", "no_proxy": ""}
    result = cli("--sqs-client", "lean", "move", "checkout", "--execute", "--yes", env=env)
    assert result.exit_code == EXIT_USAGE, (result.output, result.exception)
    assert "--sqs-client botocore" in result.output.strip().splitlines()[-1]
    assert family.depth() == (1, 0)


def test_a_good_option_overrides_a_bad_env(family: Family, clients: list[str], cli: Cli) -> None:
    cli.ok("inspect", "checkout", "--sqs-client", "botocore", env={"REDRIVE_SQS_CLIENT": "x"})
    assert clients and set(clients) == {"botocore"}


# -- the choice reaches every broker: the command's and its processes' ------------------------


def test_open_broker_hands_the_client_to_open_sqs(clients: list[str], sqs_client: Any) -> None:
    from redrive.broker import open_broker

    open_broker(None, aws=AwsSettings(region="us-east-1"), sqs_client="lean")
    open_broker("sqs://", aws=AwsSettings(region="us-east-1"))
    assert clients == ["lean", "botocore"]


class Stop(RedriveError):
    pass


@pytest.fixture
def spread_wirings(monkeypatch: pytest.MonkeyPatch) -> list[Wiring]:
    """``--processes``: instead of spawning children, the Wiring each would get, as it
    crosses (pickled), and a child's broker opened from it; then the run stops."""
    wirings: list[Wiring] = []

    def run_spread(spread: Any, *, processes: int, wiring: Wiring, **_: Any) -> Any:
        crossed = pickle.loads(pickle.dumps(wiring))
        wirings.append(crossed)
        child = ChildRun(
            wiring=crossed,
            shares=cast(Any, None),
            stop=threading.Event(),
            observer=cast(Any, None),
        )
        child.broker()
        raise Stop(f"{processes} processes stopped here")

    monkeypatch.setattr(move_processes, "run_spread", run_spread)
    return wirings


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (("--sqs-client", "lean", "move", "checkout", "--processes", "2"), None, "lean"),
        (("move", "checkout", "--processes", "2", "--sqs-client", "lean"), None, "lean"),
        (("move", "checkout", "--processes", "2", "--sqs-client", "botocore"), None, "botocore"),
        (("move", "checkout", "--processes", "2"), {"REDRIVE_SQS_CLIENT": "botocore"}, "botocore"),
        (("move", "checkout", "--processes", "2"), None, "lean"),
    ],
    ids=["before", "after", "after-botocore", "env", "default"],
)
def test_a_processes_child_uses_the_same_client(
    family: Family,
    clients: list[str],
    spread_wirings: list[Wiring],
    cli: Cli,
    args: tuple[str, ...],
    env: Any,
    expected: str,
) -> None:
    family.send_to_dlq(encode(CHARGE, [1], {}, task_id="charge-1"))
    result = cli(*args, env=env)
    assert result.exit_code == EXIT_ERROR and "2 processes stopped here" in result.output
    [wiring] = spread_wirings
    assert wiring.broker.sqs_client == expected
    # The parent's resolver, then the child's broker opened from its Wiring.
    assert clients and set(clients) == {expected}
    assert len(clients) >= 2


def test_a_wiring_without_a_client_is_botocore() -> None:
    assert Wiring().broker.sqs_client == "botocore"
    lean = Wiring.of(AwsSettings(), broker=BrokerSettings(sqs_client="lean"))
    assert lean.broker.sqs_client == "lean"


# -- the audit records which client ran -----------------------------------------------------


def executed_move(cli: Cli, family: Family, *args: str, env: Any = None) -> dict[str, Any]:
    """Move one task with --execute; the run as ``audit --json`` lists it."""
    family.send_to_dlq(encode(CHARGE, [1], {}, task_id=f"charge-{len(args)}"))
    cli.ok(*args, "move", "checkout", "--execute", "--yes", "--json", env=env)
    run: dict[str, Any] = as_json(cli.ok("audit", "--json"))["runs"][0]
    return run


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ((), None, "lean"),
        (("--sqs-client", "botocore"), None, "botocore"),
        ((), {"REDRIVE_SQS_CLIENT": "botocore"}, "botocore"),
    ],
    ids=["default", "option", "env"],
)
def test_the_audit_records_which_client_ran(
    family: Family,
    clients: list[str],
    cli: Cli,
    args: tuple[str, ...],
    env: Any,
    expected: str,
) -> None:
    run = executed_move(cli, family, *args, env=env)
    assert run["info"]["sqs_client"] == expected
    shown = as_json(cli.ok("audit", run["run_id"], "--json"))
    assert shown["info"]["sqs_client"] == expected
    text = cli.ok("audit", run["run_id"]).output
    assert f"  client:   {expected} (SQS)\n" in text
    assert text.index("  archive:") < text.index("  client:") < text.index("  counts:")


def test_a_purge_records_it_too(
    family: Family, clients: list[str], tmp_path: Path, cli: Cli
) -> None:
    family.send_to_dlq(encode(CHARGE, [1], {}, task_id="charge-1"))
    archive = str(tmp_path / "a.jsonl")
    cli.ok("purge", "checkout", "--archive", archive, "--execute", "--yes", "--sqs-client=lean")
    [run] = as_json(cli.ok("audit", "--json"))["runs"]
    assert run["info"]["command_line"].split()[:2] == ["redrive", "purge"]
    assert run["info"]["sqs_client"] == "lean"


def test_a_run_recorded_before_the_switch_shows_no_client_line() -> None:
    from redrive.ledger import RunInfo
    from redrive.render.audit import run_detail_text
    from redrive.reporting.audit import RunDetail

    info = {"command_line": "redrive move checkout --execute", "target": "checkout"}
    run = RunInfo("r1", "move", 1.0, 1.0, 1.0, 2.0, "completed", info, {"moved": 1})
    assert "client:" not in run_detail_text(RunDetail(run=run, keys=[]))
