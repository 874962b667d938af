"""Plans: ``move/purge --plan-out FILE`` records a dry run's exact selection, and
``apply FILE`` acts on exactly that set, through the core (redrive.operations.plan) and the CLI."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import Result
from conftest import Cli, Family, as_json

from redrive.cli.exit_codes import EXIT_ERROR, EXIT_USAGE
from redrive.errors import UsageProblem
from redrive.messages import decode
from redrive.operations.plan import PLAN_VERSION, PlanWriter, read_plan
from redrive.runs.observer import PlanItem
from redrive.sandbox.encoder import encode

CHARGE = "apps.shop.tasks.charge"
MAIL = "apps.mail.tasks.send_receipt"


def one_error(result: Result, exit_code: int, *fragments: str) -> str:
    assert result.exit_code == exit_code, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


_CHARGES: dict[int, str] = {}


def charge_body(n: int) -> str:
    """One publish of charge n: asked again, the same bytes (a copy of that publish)."""
    if n not in _CHARGES:
        _CHARGES[n] = encode(CHARGE, [n], {}, task_id=f"charge-{n}")
    return _CHARGES[n]


def charge(family: Family, n: int) -> str:
    return family.send_to_dlq(charge_body(n))


def mail(family: Family, n: int) -> str:
    return family.send_to_dlq(encode(MAIL, [], {"order": n}, task_id=f"mail-{n}"))


def task_ids(family: Family, url: str) -> list[str]:
    return sorted(decode(m["Body"]).task_id or "" for m in family.drain(url))


# -- the core: writer and reader --------------------------------------------------------------


def test_writer_round_trips_through_read_plan(tmp_path: Path) -> None:
    path = str(tmp_path / "p.json")
    writer = PlanWriter(
        path,
        kind="move",
        target="checkout",
        dlq_url="https://sqs/q-dlq",
        filters={"tasks": ["a.*"]},
        options={"to": None, "lease": 30},
        caller={"ticket": "OPS-1"},
    )
    writer.add(PlanItem("m1", "a.b", "t1", "k1", "https://sqs/q"))
    writer.add(PlanItem("m2", "a.b", None, "k1", "https://sqs/q", action="delete-duplicate"))
    writer.add(PlanItem("m3", 'a."c"\n', "t3", None, None, action="purge"))
    assert not Path(path).exists()  # written to a temporary file until closed
    writer.close()
    writer.close()  # idempotent
    data = json.loads(Path(path).read_text())
    assert data["redrive_plan"] == PLAN_VERSION
    assert data["count"] == 3
    assert data["by_task"] == {"a.b": 2, 'a."c"\n': 1}
    assert data["created_by"]["ticket"] == "OPS-1" and data["created_by"]["user"]
    assert data["items"][1] == {
        "message_id": "m2",
        "action": "delete-duplicate",
        "task": "a.b",
        "key": "k1",
        "target": "https://sqs/q",
    }
    plan = read_plan(path)
    assert plan.kind == "move" and plan.target == "checkout" and plan.path == path
    assert plan.message_ids == {"m1", "m2", "m3"}
    assert plan.by_task == {"a.b": 2, 'a."c"\n': 1}
    assert plan.items[2].action == "purge" and plan.items[2].key is None


def test_an_empty_plan_is_valid_json(tmp_path: Path) -> None:
    path = str(tmp_path / "p.json")
    writer = PlanWriter(path, kind="purge", target="x", dlq_url="u", filters={}, options={})
    writer.close()
    assert json.loads(Path(path).read_text())["items"] == []
    assert read_plan(path).items == []


def test_abort_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    writer = PlanWriter(str(path), kind="move", target="x", dlq_url="u", filters={}, options={})
    writer.add(PlanItem("m1", "a", None, "k", "t"))
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_unknown_kind_and_unwritable_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="kind"):
        PlanWriter(
            str(tmp_path / "p"), kind="tidy", target="x", dlq_url="u", filters={}, options={}
        )
    with pytest.raises(UsageProblem, match="cannot write the plan"):
        PlanWriter(
            str(tmp_path / "missing" / "p.json"),
            kind="move",
            target="x",
            dlq_url="u",
            filters={},
            options={},
        )


BAD_PLANS = {
    "missing": (None, "does not exist"),
    "empty": ("", "not a readable plan"),
    "truncated": ('{"redrive_plan": 1, "kind": "move", "items": [', "not a readable plan"),
    "a list": ("[1, 2]", "not a redrive plan"),
    "no version": ('{"kind": "move"}', "not a redrive plan"),
    "future version": ('{"redrive_plan": 2, "kind": "move"}', "version 2"),
    "bad kind": ('{"redrive_plan": 1, "kind": "tidy"}', "unknown kind"),
    "no target": ('{"redrive_plan": 1, "kind": "move", "dlq_url": "u"}', "damaged"),
    "item without id": (
        '{"redrive_plan": 1, "kind": "move", "target": "t", "dlq_url": "u",'
        ' "items": [{"task": "a"}]}',
        "damaged",
    ),
    "items not a list": (
        '{"redrive_plan": 1, "kind": "move", "target": "t", "dlq_url": "u", "items": 3}',
        "damaged",
    ),
    "not utf-8": (b"\xff\xfe{", "not a readable plan"),
}


@pytest.mark.parametrize("name", sorted(BAD_PLANS))
def test_read_plan_refuses_bad_files(tmp_path: Path, name: str) -> None:
    content, fragment = BAD_PLANS[name]
    path = tmp_path / "p.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(UsageProblem, match=fragment) as info:
        read_plan(str(path))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["missing", "truncated", "future version", "item without id"])
def test_apply_refuses_bad_plans_with_one_line_exit_2(
    family: Family, tmp_path: Path, name: str, cli: Cli
) -> None:
    content, fragment = BAD_PLANS[name]
    path = tmp_path / "p.json"
    if isinstance(content, str):
        path.write_text(content)
    one_error(cli("apply", str(path), "--execute", "--yes"), EXIT_USAGE, fragment)


# -- move plans through the CLI ---------------------------------------------------------------


def test_move_plan_out_writes_the_dry_run_selection(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    c0, c1 = charge(family, 0), charge(family, 1)
    dup = family.send_to_dlq(charge_body(0))  # a second copy
    mail(family, 0)
    path = tmp_path / "p.json"
    result = cli.ok("move", "checkout", "--task", CHARGE, "--plan-out", str(path))
    assert "plan written to" in result.output
    assert family.depth() == (4, 0)  # a dry run: nothing changed
    data = json.loads(path.read_text())
    assert data["redrive_plan"] == PLAN_VERSION
    assert data["kind"] == "move" and data["target"] == "checkout"
    assert data["dlq_url"] == family.dlq_url
    assert data["filters"]["tasks"] == [CHARGE]
    assert {"to", "include_expired", "max_redrives", "in_doubt", "lease"} <= set(data["options"])
    assert {"user", "host"} <= set(data["created_by"])
    assert data["created_at"].endswith("Z")
    assert data["count"] == 3 and data["by_task"] == {CHARGE: 3}
    items = {i["message_id"]: i for i in data["items"]}
    assert set(items) == {c0, c1, dup}
    assert items[c0]["action"] == "send" and items[c1]["action"] == "send"
    assert items[dup]["action"] == "delete-duplicate"
    assert items[dup]["key"] == items[c0]["key"] != items[c1]["key"]
    for item in items.values():
        assert item["task"] == CHARGE and item["target"] == family.queue_url
        assert item["task_id"] in ("charge-0", "charge-1")


def test_plan_out_with_execute_is_a_usage_error(family: Family, tmp_path: Path, cli: Cli) -> None:
    charge(family, 0)
    path = tmp_path / "p.json"
    one_error(
        cli("move", "checkout", "--execute", "--yes", "--plan-out", str(path)),
        EXIT_USAGE,
        "--plan-out",
    )
    one_error(
        cli("purge", "checkout", "--execute", "--yes", "--plan-out", str(path)),
        EXIT_USAGE,
        "--plan-out",
    )
    assert not path.exists()
    assert family.depth() == (1, 0)


def test_apply_dry_run_changes_nothing(family: Family, tmp_path: Path, cli: Cli) -> None:
    charge(family, 0)
    charge(family, 1)
    path = tmp_path / "p.json"
    cli.ok("move", "checkout", "--plan-out", str(path))
    data = as_json(cli.ok("apply", str(path), "--json"))
    assert data["dry_run"] is True
    assert data["planned"] == 2 and data["gone"] == 0 and data["moved"] == 2
    assert family.depth() == (2, 0)
    assert family.depth(family.queue_url) == (0, 0)


def test_apply_moves_exactly_the_plan(family: Family, tmp_path: Path, cli: Cli) -> None:
    charge(family, 0)
    removed = charge(family, 1)
    charge(family, 2)
    mail(family, 0)
    path = tmp_path / "p.json"
    cli.ok("move", "checkout", "--task", CHARGE, "--plan-out", str(path))
    assert read_plan(str(path)).by_task == {CHARGE: 3}
    # After the review: a planned message is removed, a new matching one arrives.
    _delete_message(family, removed)
    charge(family, 3)

    data = as_json(cli.ok("apply", str(path), "--execute", "--yes", "--json"))
    assert data["dry_run"] is False
    assert (data["planned"], data["gone"], data["moved"]) == (3, 1, 2)
    assert task_ids(family, family.queue_url) == ["charge-0", "charge-2"]
    assert family.depth() == (2, 0)  # charge-3 (not planned) and the mail stay

    again = as_json(cli.ok("apply", str(path), "--execute", "--yes", "--json"))
    assert (again["planned"], again["gone"], again["moved"]) == (3, 3, 0)
    assert family.depth() == (2, 0)
    assert family.depth(family.queue_url) == (0, 0)
    left = task_ids(family, family.dlq_url)
    assert left == ["charge-3", "mail-0"]


def test_apply_text_says_how_many_are_gone(family: Family, tmp_path: Path, cli: Cli) -> None:
    gone = charge(family, 0)
    charge(family, 1)
    path = tmp_path / "p.json"
    cli.ok("move", "checkout", "--plan-out", str(path))
    _delete_message(family, gone)
    text = cli.ok("apply", str(path), "--execute", "--yes").output
    assert "1 of the plan's 2 message(s) are no longer in the DLQ" in text
    assert task_ids(family, family.queue_url) == ["charge-1"]


def test_apply_a_plan_with_a_duplicate_sends_the_task_once(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    charge(family, 0)
    family.send_to_dlq(charge_body(0))  # a copy of that publish
    path = tmp_path / "p.json"
    cli.ok("move", "checkout", "--plan-out", str(path))
    data = as_json(cli.ok("apply", str(path), "--execute", "--yes", "--json"))
    assert data["planned"] == 2 and data["gone"] == 0 and data["moved"] == 1
    assert task_ids(family, family.queue_url) == ["charge-0"]
    assert family.depth() == (0, 0)


def test_apply_an_empty_move_plan_moves_nothing(family: Family, tmp_path: Path, cli: Cli) -> None:
    charge(family, 0)
    path = tmp_path / "p.json"
    cli.ok("move", "checkout", "--task", "no.such.task", "--plan-out", str(path))
    assert read_plan(str(path)).items == []
    data = as_json(cli.ok("apply", str(path), "--execute", "--yes", "--json"))
    assert data["moved"] == 0
    assert family.depth() == (1, 0)


def test_apply_an_empty_purge_plan_purges_nothing(family: Family, tmp_path: Path, cli: Cli) -> None:
    charge(family, 0)
    path = tmp_path / "p.json"
    cli.ok("purge", "checkout", "--task", "no.such.task", "--no-archive", "--plan-out", str(path))
    assert read_plan(str(path)).items == []
    cli.ok("apply", str(path), "--execute", "--yes", "--json")
    assert family.depth() == (1, 0)


def test_apply_a_plan_for_a_queue_that_is_gone(family: Family, tmp_path: Path, cli: Cli) -> None:
    charge(family, 0)
    path = tmp_path / "p.json"
    cli.ok("move", "checkout", "--plan-out", str(path))
    family.client.delete_queue(QueueUrl=family.dlq_url)
    result = cli("apply", str(path), "--execute", "--yes")
    assert result.exit_code in (EXIT_ERROR, EXIT_USAGE), result.output
    assert "Traceback" not in result.output


# -- purge plans ------------------------------------------------------------------------------


def test_purge_plan_applied_archives_and_deletes_exactly_those(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    charge(family, 0)
    charge(family, 1)
    mail(family, 0)
    path = tmp_path / "p.json"
    archive = tmp_path / "a.jsonl.gz"
    cli.ok(
        "purge", "checkout", "--task", CHARGE, "--archive", str(archive), "--plan-out", str(path)
    )
    assert not archive.exists()
    assert family.depth() == (3, 0)
    data = json.loads(path.read_text())
    assert data["kind"] == "purge" and data["count"] == 2 and data["by_task"] == {CHARGE: 2}
    assert {i["action"] for i in data["items"]} == {"purge"}
    assert data["options"] == {"archive": str(archive), "no_archive": False}

    charge(family, 2)  # arrives after the plan, matches --task: left alone
    dry = as_json(cli.ok("apply", str(path), "--json"))
    assert dry["dry_run"] is True and dry["planned"] == 2
    assert family.depth() == (4, 0) and not archive.exists()

    done = as_json(cli.ok("apply", str(path), "--execute", "--yes", "--json"))
    assert (done["planned"], done["gone"], done["archived"], done["purged"]) == (2, 0, 2, 2)
    with gzip.open(archive, "rt") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    assert sorted(r["task_id"] for r in records) == ["charge-0", "charge-1"]
    assert {r["message_id"] for r in records} == read_plan(str(path)).message_ids
    assert task_ids(family, family.dlq_url) == ["charge-2", "mail-0"]


def _delete_message(family: Family, message_id: str) -> None:
    """Delete one message by MessageId, making the others visible again."""
    received = []
    while True:
        batch = family.client.receive_message(
            QueueUrl=family.dlq_url, MaxNumberOfMessages=10, VisibilityTimeout=30
        ).get("Messages", [])
        if not batch:
            break
        received.extend(batch)
    found = False
    for message in received:
        if message["MessageId"] == message_id:
            family.client.delete_message(
                QueueUrl=family.dlq_url, ReceiptHandle=message["ReceiptHandle"]
            )
            found = True
        else:
            family.client.change_message_visibility(
                QueueUrl=family.dlq_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
            )
    assert found


def test_a_second_apply_says_the_plans_messages_are_gone_not_message_ids(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    """Issue 22, 16: no --message-id was given, so none "matched no message scanned"; the
    plan's messages are gone, and the ledger says which ones it sent."""
    for n in range(3):
        charge(family, n)
    path = tmp_path / "p.json"
    cli.ok("move", "checkout", "--plan-out", str(path))
    first = as_json(cli.ok("apply", str(path), "--execute", "--yes", "--json"))
    assert (first["planned"], first["gone"], first["moved"]) == (3, 0, 3)
    assert first["gone_sent"] == 0

    again = cli.ok("apply", str(path), "--execute", "--yes")
    assert "--message-id" not in again.output
    assert "3 of the plan's 3 message(s) are no longer in the DLQ" in again.output
    assert "the ledger records every one of them as sent" in again.output
    data = as_json(cli.ok("apply", str(path), "--json"))
    assert (data["gone"], data["gone_sent"], data["moved"]) == (3, 3, 0)
    assert data["filter_misses"] is None


def test_apply_tells_sent_from_removed_otherwise(family: Family, tmp_path: Path, cli: Cli) -> None:
    removed = charge(family, 0)
    charge(family, 1)
    path = tmp_path / "p.json"
    cli.ok("move", "checkout", "--plan-out", str(path))
    _delete_message(family, removed)  # someone else's purge
    first = cli.ok("apply", str(path), "--execute", "--yes")
    assert "--message-id" not in first.output
    assert "1 of the plan's 2 message(s) are no longer in the DLQ (already acted on" in first.output
    again = cli.ok("apply", str(path), "--execute", "--yes")
    assert "--message-id" not in again.output
    assert "the ledger records 1 of them as sent (moved already); the other 1 were removed" in (
        again.output
    )
