"""Repair's counts and hints (issue 37, point 7): what became of each message the edits
changed, said so that the counts add up; poison's way out named; the dry run's printed command
run as it is; a rerun continuing the archive a killed edited move began; a replay with edits
saying where its messages stay; a replay to another queue of what was sent told exactly how;
and an edited move's archive keeping redrive's own receives, as purge's does."""

from __future__ import annotations

import contextlib
import re
import shlex
from pathlib import Path

import pytest
from conftest import Cli, Family, SqsClock, as_json
from test_move import LEASE, Crash, checkout, crash_at, wait_for_leases
from test_repair_move import TASK, arguments, seed, task_body

from redrive import attributes
from redrive.archive import read_records
from redrive.archive.storage import archive_part
from redrive.broker.sqs import SqsBroker
from redrive.ledger import SqliteLedger
from redrive.operations.move import MoveEngine, MoveOptions, RepairOptions
from redrive.operations.move.repair_step import repair_step
from redrive.repair import edits_from_options
from redrive.runs.lifecycle import RunRecord
from redrive.runs.observer import Callbacks

EUR = ["--set", 'kwargs.currency="EUR"']


def seed_poison(family: Family, bodies: list[str], count: int) -> None:
    """Messages redrive has sent back ``count`` times already (its stamp says so)."""
    stamp = {attributes.COUNT: {"DataType": "Number", "StringValue": str(count)}}
    for text in bodies:
        family.client.send_message(
            QueueUrl=family.dlq_url, MessageBody=text, MessageAttributes=stamp
        )


def test_the_changed_messages_are_counted_by_what_becomes_of_them(family: Family, cli: Cli) -> None:
    """A dry run said `3 changed by the edits, 0 left in the DLQ` while 2 were poison and
    would stay: each changed message is now in exactly one count, and poison's way out is
    named."""
    seed(family, [task_body(0), task_body(1, region="eu")])
    seed_poison(family, [task_body(2), task_body(3)], count=3)
    text = cli.ok("move", "checkout", *EUR).output
    assert (
        "4 message(s) changed by the edits: 2 would move, 2 skipped (poison: 2), so they "
        "stay in the DLQ unedited" in text
    ), text
    assert "0 left in the DLQ by the edits (0 unchanged by them)" in text
    assert "2 message(s) skipped as poison" in text
    assert "pass --max-redrives N" in text
    data = as_json(cli.ok("move", "checkout", *EUR, "--json"))["repair"]
    assert (data["changed"], data["became"]) == (4, {"moved": 2, "skipped:poison": 2})
    # Executed: the same counts, in the past tense.
    executed = ["move", "checkout", *EUR, "--no-archive", "--execute", "--yes"]
    done = cli.ok(*executed).output
    assert "4 message(s) changed by the edits: 2 moved, 2 skipped (poison: 2)" in done, done
    assert family.depth() == (2, 0)


def test_the_printed_command_of_an_edited_dry_run_runs_as_it_is(
    family: Family, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dry run's `to do it, run:` left out --archive, so pasting it exited 2."""
    monkeypatch.chdir(tmp_path)
    seed(family, [task_body(0), task_body(1)])
    dry = cli.ok("move", "checkout", *EUR).output
    assert "originals would be archived first to ./redrive-archive/" in dry, dry
    command = dry.split("to do it, run:\n", 1)[1].strip()
    words = shlex.split(command)
    assert words[0] == "redrive" and "--archive" in words and "--execute" in words
    done = cli.ok(*words[1:])
    assert "2 message(s) changed by the edits: 2 moved" in done.output, done.output
    archive = words[words.index("--archive") + 1]
    assert len(list(read_records(archive))) == 2
    assert family.depth() == (0, 0)


def test_a_rerun_after_a_killed_edited_move_continues_its_archive(
    family: Family, cli: Cli, tmp_path: Path, sqs_clock: SqsClock
) -> None:
    """Rerunning the command after a kill failed: `archive ... already exists`. It now adds
    a part beside the archive, and the archive's name stands for both (replay, inspect)."""
    originals = [task_body(n) for n in range(14)]
    seed(family, originals)
    ledger_path, archive = tmp_path / "l.sqlite3", tmp_path / "originals.jsonl.gz"
    repair = RepairOptions(edits_from_options(sets=['kwargs.currency="EUR"']), str(archive))
    ledger = SqliteLedger(ledger_path, clock=sqs_clock)
    with pytest.raises(Crash), repair_step(repair, execute=True) as step:
        MoveEngine(
            checkout(family.client),
            ledger,
            MoveOptions(execute=True, lease=LEASE, repair=repair, workers=1, pipelined=False),
            broker_factory=lambda: SqsBroker(family.client, clock=sqs_clock),
            observer=Callbacks(on_step=crash_at("deleted", 1)),
            clock=sqs_clock,
            record=RunRecord("redrive move checkout", {"archive": str(archive)}),
            repair=step,
        ).run()
    ledger.close()
    wait_for_leases(sqs_clock)
    first = len(list(read_records(str(archive))))
    assert 0 < first < 14
    words = ["move", "checkout", *EUR, "--archive", str(archive), "--ledger", str(ledger_path)]
    dry = cli.ok(*words).output
    assert "a new part beside the archive" in dry, dry
    done = as_json(cli.ok(*words, "--execute", "--yes", "--json"))
    assert done["moved"] == 14 - first
    assert done["repair"]["archive"] == archive_part(str(archive), 1)
    assert done["repair"]["archive_continued"] is True
    assert sorted(r.body for r in read_records(str(archive))) == sorted(originals)
    sent = family.drain(family.queue_url)
    assert len(sent) == 14 and {arguments(m["Body"])[1]["currency"] for m in sent} == {"EUR"}
    # An archive no run in the ledger wrote is never added to.
    other = tmp_path / "other.jsonl.gz"
    other.write_bytes(archive.read_bytes())
    seed(family, [task_body(99)])
    refused = cli("move", "checkout", *EUR, "--archive", str(other), "--ledger", str(ledger_path))
    assert refused.exit_code == 1 and "already exists" in refused.output, refused.output


def test_a_replay_with_edits_says_its_messages_stay_in_the_archive(
    family: Family, cli: Cli, tmp_path: Path
) -> None:
    seed(family, [task_body(0, region="eu"), task_body(1)])
    archive = tmp_path / "purged.jsonl.gz"
    cli.ok("purge", "checkout", "--archive", str(archive), "--execute", "--yes")
    words = ["--unset", "kwargs.region"]
    text = cli.ok("replay", str(archive), "--to", "onion-checkout", *words).output
    assert "1 left in the archive by the edits (1 unchanged by them)" in text, text
    assert "left in the DLQ" not in text


def test_replaying_originals_to_another_queue_says_exactly_how(
    family: Family, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An edited move's originals, replayed `--to debug-q`, were refused as `already sent`
    with no way named: the hint's command sends them there, once."""
    monkeypatch.chdir(tmp_path)
    seed(family, [task_body(0), task_body(1)])
    archive = tmp_path / "originals.jsonl.gz"
    ledger = tmp_path / "l.sqlite3"
    cli.ok(
        "move", "checkout", *EUR, "--archive", str(archive), "--ledger", str(ledger),
        "--execute", "--yes",
    )  # fmt: skip
    family.client.create_queue(QueueName="debug-q")
    debug = family.client.get_queue_url(QueueName="debug-q")["QueueUrl"]
    text = cli.ok("replay", str(archive), "--to", "debug-q", "--ledger", str(ledger)).output
    assert "2 already sent" in text
    [command] = re.findall(r"^  (redrive replay .*)$", text, re.M)
    words = shlex.split(command)
    assert "--ledger" in words and str(ledger) not in words
    dry = cli.ok(*words[1:]).output
    assert "2 would replay" in dry, dry
    cli.ok(*words[1:], "--execute", "--yes")
    cli.ok(*words[1:], "--execute", "--yes")  # once: the new ledger has them now
    got = family.drain(debug)
    assert sorted(arguments(m["Body"])[1]["currency"] for m in got) == ["USD", "USD"]


def test_an_edited_moves_archive_keeps_redrives_own_receives(
    family: Family, cli: Cli, tmp_path: Path
) -> None:
    """`inspect ARCHIVE` showed the move's own receive as a consumer's: 3 where the DLQ
    showed 2."""
    seed(family, [task_body(0)])
    for _ in range(2):  # a consumer's receives, the message made visible again at once
        [got] = family.client.receive_message(QueueUrl=family.dlq_url)["Messages"]
        family.client.change_message_visibility(
            QueueUrl=family.dlq_url, ReceiptHandle=got["ReceiptHandle"], VisibilityTimeout=0
        )
    before = as_json(cli.ok("inspect", "checkout", "--json"))
    assert before["groups"][0]["max_consumer_receives"] == 2, before
    archive = tmp_path / "originals.jsonl.gz"
    cli.ok("move", "checkout", *EUR, "--archive", str(archive), "--execute", "--yes")
    [record] = read_records(str(archive))
    assert record.task == TASK and record.redrive_receives
    after = as_json(cli.ok("inspect", str(archive), "--json"))
    assert after["groups"][0]["max_consumer_receives"] == 2, after


def test_a_processes_runs_parts_are_continued_too(tmp_path: Path) -> None:
    """A killed `--processes` edited move leaves only parts (X.p1, X.p2): its rerun
    continues them too, each process in a part of its own past them."""
    from redrive.operations.move import continued_archive

    archive = tmp_path / "originals.jsonl.gz"
    for n in (1, 2):
        Path(archive_part(str(archive), n)).write_bytes(b"")
    repair = RepairOptions(edits_from_options(sets=['kwargs.currency="EUR"']), str(archive))
    ledger = SqliteLedger(tmp_path / "l.sqlite3")
    try:
        ledger.start_run("r", command="move", info={"archive": str(archive)})
        continued = continued_archive(repair, ledger)
    finally:
        ledger.close()
    assert continued.continues
    names = []
    with contextlib.ExitStack() as both:  # at once, as two processes are
        for number in (1, 2):
            step = both.enter_context(repair_step(continued, execute=True, part=number))
            assert step is not None and step.writer is not None
            names.append(step.report.archive)
    assert names == [archive_part(str(archive), 3), archive_part(str(archive), 4)]
