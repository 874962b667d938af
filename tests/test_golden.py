"""Golden files of what a user sees of the CLI, taken from main before issue 38's refactor.

Recorded under ``tests/golden/``: every command's and group's ``--help`` (``help/``, 100
columns), and for a fixed set of runs on in-process SQS (moto) the exit code, the first
``Error:`` line and the shape of the ``--json`` output (key names and value types, lists by
their elements' shapes, never the values) (``runs/``), and the plan and archive files they
write (``files/``), with ids, times, message ids, run ids, hosts and paths replaced by
placeholders and every key kept.

A change a user would see fails here. When it is meant, regenerate and review the diff::

    REDRIVE_UPDATE_GOLDEN=1 .venv/bin/pytest -q tests/test_golden.py

(``REDRIVE_UPDATE_GOLDEN=1`` rewrites the files instead of comparing; commit them with the
change that explains them.)
"""

from __future__ import annotations

import getpass
import gzip
import json
import os
import random
import re
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import click
import pytest
from click.testing import CliRunner, Result
from conftest import Family

from redrive.cli import cli as redrive_group
from redrive.keys import key_for
from redrive.ledger import Claim, open_ledger
from redrive.messages import decode
from redrive.sandbox.encoder import encode

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("REDRIVE_UPDATE_GOLDEN", "").strip() == "1"
WIDTH = 100
CHARGE = "apps.shop.tasks.charge"
MAIL = "apps.mail.tasks.send_receipt"


# -- comparing with the golden files ----------------------------------------------------------


def golden(relative: str, text: str) -> None:
    """Compare ``text`` with the golden file, or rewrite it under REDRIVE_UPDATE_GOLDEN=1."""
    path = GOLDEN / relative
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"{relative}: no golden file (REDRIVE_UPDATE_GOLDEN=1 writes it)"
    assert text == path.read_text(encoding="utf-8"), f"{relative} differs from its golden file"


def as_golden_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


# Values that differ on each run, most specific first: each becomes its placeholder.
_VARYING = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I), "<uuid>"),
    (
        re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:?\d\d)?"),
        "<time>",
    ),
    (re.compile(r"\d{8}T\d{6}Z?"), "<time>"),
    # A run id.
    (re.compile(r"(?<![0-9a-z])[0-9a-f]{16}(?![0-9a-z])"), "<run-id>"),
    # SQS's times in epoch milliseconds (SentTimestamp and the like).
    (re.compile(r"^\d{13}$"), "<epoch-ms>"),
]


class Normalizer:
    """Replaces what varies between runs: the test's folder, the host, the user, ids, times."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = str(tmp_path)
        self.host = socket.gethostname()
        self.user = getpass.getuser()

    def text(self, value: str) -> str:
        if value in (self.host, self.user):
            # Whole values only: a user named "root" must not rewrite "root_id".
            return "<host>" if value == self.host else "<user>"
        value = value.replace(self.tmp, "<tmp>")
        for pattern, placeholder in _VARYING:
            value = pattern.sub(placeholder, value)
        return value

    def value(self, value: Any, key: str = "") -> Any:
        """Every key and structure kept; strings normalized; numbers that are clocks or
        sizes in time (keys naming a time or duration) replaced by their type."""
        if isinstance(value, dict):
            return {self.text(k): self.value(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v, key) for v in value]
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, bool) or value is None:
            return value
        if re.search(r"time|_at$|^at$|seconds|elapsed|pid|timestamp|epoch|started|ended", key):
            return f"<{type(value).__name__}>"
        return value


def shape(value: Any, norm: Normalizer) -> Any:
    """Key names (normalized: some are ids) and value types, recursively; a list by the
    distinct shapes of its elements."""
    if isinstance(value, dict):
        return {norm.text(k): shape(v, norm) for k, v in value.items()}
    if isinstance(value, list):
        shapes: list[Any] = []
        for item in value:
            s = shape(item, norm)
            if s not in shapes:
                shapes.append(s)
        return sorted(shapes, key=lambda s: json.dumps(s, sort_keys=True))
    return "null" if value is None else type(value).__name__


# -- help -------------------------------------------------------------------------------------


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            paths.extend(command_paths(command, (*prefix, name)))
        else:
            paths.append((*prefix, name))
    return paths


@pytest.mark.parametrize("path", command_paths(redrive_group), ids=" ".join)
def test_help_is_golden(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(
        redrive_group,
        [*path, "--help"],
        prog_name="redrive",
        env={"COLUMNS": str(WIDTH)},
        terminal_width=WIDTH,
    )
    assert result.exit_code == 0, result.output
    golden(f"help/{'-'.join(('redrive', *path))}.txt", result.output)


def test_every_help_file_is_a_command() -> None:
    """A golden file whose command is gone fails too (unless regenerating, which prunes)."""
    names = {f"{'-'.join(('redrive', *p))}.txt" for p in command_paths(redrive_group)}
    present = {p.name for p in (GOLDEN / "help").glob("*.txt")}
    if UPDATE:
        for stale in present - names:
            (GOLDEN / "help" / stale).unlink()
        return
    assert present == names


# -- runs on in-process SQS -------------------------------------------------------------------


class Runs:
    """Runs commands in-process and records each one's exit code, error line and JSON shape
    under ``runs/<scenario>/<step>.json``."""

    def __init__(self, scenario: str, tmp_path: Path) -> None:
        self.scenario = scenario
        self.tmp = tmp_path
        self.norm = Normalizer(tmp_path)

    def __call__(self, step: str, *args: str, code: int, json_out: bool = True) -> Any:
        result = CliRunner().invoke(
            redrive_group, list(args), prog_name="redrive", env={"COLUMNS": str(WIDTH)}
        )
        assert "Traceback" not in result.output, result.output
        data = _json_of(result) if json_out else None
        record = {
            "argv": [self.norm.text(a) for a in ("redrive", *args)],
            "exit_code": result.exit_code,
            "error": _error_line(result, self.norm),
            "json": shape(data, self.norm) if json_out else None,
        }
        golden(f"runs/{self.scenario}/{step}.json", as_golden_json(record))
        assert result.exit_code == code, (step, result.output)
        return data

    def file(self, step: str, path: Path) -> None:
        """A plan (JSON) or archive (JSON lines, maybe gzipped) written by a run, normalized."""
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        text = raw.decode("utf-8")
        try:
            docs: Any = json.loads(text)
            kind = "json"
        except json.JSONDecodeError:
            docs = [json.loads(line) for line in text.splitlines() if line.strip()]
            kind = "jsonl"
        normalized = self.norm.value(docs)
        if kind == "jsonl":
            body = "".join(json.dumps(d, sort_keys=True) + "\n" for d in normalized)
        else:
            body = as_golden_json(normalized)
        golden(f"files/{self.scenario}/{step}.{kind}", body)


def _json_of(result: Result) -> Any:
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError:
        return None


def _error_line(result: Result, norm: Normalizer) -> str | None:
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    return norm.text(lines[0]) if lines else None


def bodies() -> list[str]:
    """The same Celery messages on every run: the encoder's one random field (a delivery
    tag, a uuid4) is drawn from a seeded generator."""
    draw = random.Random(38)
    # Patched only while encoding: nothing else runs inside.
    fixed = mock.patch.object(
        uuid, "uuid4", lambda: uuid.UUID(int=draw.getrandbits(128), version=4)
    )
    with fixed:
        return [
            *(encode(CHARGE, [i], {"card": "tok"}, task_id=f"charge-{i}") for i in range(3)),
            encode(MAIL, [], {"order": 1}, task_id="mail-0"),
        ]


def seed(family: Family) -> None:
    for body in bodies():
        family.send_to_dlq(body)


@pytest.fixture
def runs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Runs]:
    yield Runs(request.node.name.removeprefix("test_"), tmp_path)


def test_look(all_families: dict[str, Family], runs: Runs) -> None:
    """The reads: status, inspect, report, check, audit on an empty ledger."""
    seed(all_families["checkout"])
    runs("status", "status", "--json", code=0)
    runs("inspect", "inspect", "checkout", "--json", code=0)
    runs("inspect-show-args", "inspect", "checkout", "--show-args", "--json", code=0)
    runs("report", "report", "--format", "json", code=0)
    runs("report-fail-on-messages", "report", "--format", "json", "--fail-on-messages", code=1)
    runs("check", "check", "--json", code=0)
    runs("audit-empty", "audit", "--json", code=0)


def test_move(family: Family, runs: Runs, tmp_path: Path) -> None:
    """move: dry run with a plan, apply of the plan, an executed move, a repair's dry run."""
    seed(family)
    plan = tmp_path / "plan.json"
    runs("move-dry-run", "move", "checkout", "--json", "--plan-out", str(plan), code=0)
    runs.file("plan", plan)
    runs("apply-dry-run", "apply", str(plan), "--json", code=0)
    runs("apply-execute", "apply", str(plan), "--execute", "--yes", "--json", code=0)
    seed(family)
    runs("move-execute", "move", "checkout", "--execute", "--yes", "--json", code=0)
    runs("move-again", "move", "checkout", "--execute", "--yes", "--json", code=0)
    seed(family)
    runs(
        "repair-dry-run",
        *("move", "checkout", "--task", CHARGE, "--set", 'kwargs.card="new"', "--json"),
        code=0,
    )
    runs(
        "repair-dry-run-plan",
        *("move", "checkout", "--set", 'kwargs.card="new"', "--clear-eta", "--json"),
        *("--archive", str(tmp_path / "edited.jsonl.gz")),
        *("--plan-out", str(tmp_path / "repair.json")),
        code=0,
    )
    runs.file("repair-plan", tmp_path / "repair.json")
    audit = runs("audit", "audit", "--json", code=0)
    run_id = audit["runs"][0]["run_id"]
    runs("audit-run", "audit", run_id, "--json", code=0)


def test_purge_archive_replay(family: Family, runs: Runs, tmp_path: Path) -> None:
    """archive, purge (dry run, plan, executed with an archive), inspect and replay of it."""
    seed(family)
    kept = tmp_path / "kept.jsonl.gz"
    runs("archive", "archive", "checkout", "--archive", str(kept), "--json", code=0)
    runs.file("archive", kept)
    plan = tmp_path / "purge-plan.json"
    runs("purge-dry-run", "purge", "checkout", "--json", "--plan-out", str(plan), code=0)
    runs.file("purge-plan", plan)
    gone = tmp_path / "purged.jsonl.gz"
    runs(
        "purge-execute",
        *("purge", "checkout", "--execute", "--yes", "--archive", str(gone), "--json"),
        code=0,
    )
    runs.file("purge-archive", gone)
    runs("inspect-archive", "inspect", str(gone), "--json", code=0)
    runs("replay-dry-run", "replay", str(gone), "--to", "onion-checkout", "--json", code=0)
    runs(
        "replay-execute",
        *("replay", str(gone), "--to", "onion-checkout", "--execute", "--yes", "--json"),
        code=0,
    )
    runs("audit", "audit", "--json", code=0)


def test_in_doubt(family: Family, runs: Runs) -> None:
    """A run that died before its send was confirmed: move, ledger in-doubt, ledger resolve."""
    body = encode(CHARGE, [7], {}, task_id="in-doubt-task")
    message_id = family.send_to_dlq(body)
    seed(family)
    ledger = open_ledger(None)
    try:
        ledger.start_run("deadrun", command="move", info={"host": "elsewhere"})
        key = key_for(decode(body), message_id=message_id, generation=0, body=body, namespace="sqs")
        ledger.claim_many("deadrun", [Claim(key, CHARGE, message_id, family.queue_url)])
        ledger.end_run("deadrun", outcome="failed", counts={})
    finally:
        ledger.close()
    runs("move-in-doubt", "move", "checkout", "--execute", "--yes", "--json", code=3)
    runs("ledger-in-doubt", "ledger", "in-doubt", "--json", code=3)
    runs("ledger-in-doubt-run", "ledger", "in-doubt", "--run", "deadrun", "--json", code=3)
    runs("ledger-resolve", "ledger", "resolve", "--json", code=0)
    runs(
        "ledger-resolve-skip",
        *("ledger", "resolve", "--skip", "in-doubt-task", "--execute", "--json"),
        code=0,
    )
    runs("ledger-in-doubt-after", "ledger", "in-doubt", "--json", code=0)
    runs("audit", "audit", "--json", code=0)
    runs("audit-run", "audit", "deadrun", "--json", code=0)


def test_errors(family: Family, runs: Runs, tmp_path: Path) -> None:
    """Exit codes and error lines of a user's mistakes."""
    seed(family)
    runs("bad-option", "move", "checkout", "--bogus", code=2, json_out=False)
    runs("bad-value", "inspect", "checkout", "--limit", "many", code=2, json_out=False)
    runs("unknown-command", "frobnicate", code=2, json_out=False)
    runs("unknown-family", "move", "nosuch", "--json", code=1, json_out=False)
    runs("unknown-queue-url", "inspect", family.dlq_url + "-gone", code=1, json_out=False)
    runs("execute-without-yes", "move", "checkout", "--execute", code=2, json_out=False)
    runs("missing-plan", "apply", str(tmp_path / "none.json"), code=2, json_out=False)
    runs("audit-no-run", "audit", "nosuchrun", code=1, json_out=False)
    runs(
        "repair-without-archive",
        "move",
        "checkout",
        "--set",
        "kwargs.x=1",
        "--execute",
        "--yes",
        code=2,
        json_out=False,
    )
