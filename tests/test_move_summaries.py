"""What move, purge, archive and replay say, through the CLI (click's CliRunner, in-process
moto): how many messages were scanned, what a filter that matched nothing nearly matched,
where a body that is not a Celery task may go, and which messages are held as possible
copies. The engine's side of each is in test_move.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from conftest import Cli, Family, as_json

from redrive.cli.exit_codes import EXIT_ATTENTION, EXIT_USAGE
from redrive.messages import decode
from redrive.sandbox.encoder import encode

SEND_EMAIL = "apps.notifications.tasks.send_email"
CHARGE = "apps.shop.tasks.charge"
NOT_CELERY = ("legacy cron 4242: resync store 7", '{"event": "order.created", "id": 3}')


def seed(family: Family) -> list[str]:
    ids = [family.send_to_dlq(encode(SEND_EMAIL, [i], {}, task_id=f"mail-{i}")) for i in range(3)]
    ids.append(family.send_to_dlq(encode(CHARGE, [1], {}, task_id="charge-1")))
    return ids


def task_ids(family: Family, url: str) -> list[str | None]:
    return sorted(decode(m["Body"]).task_id or m["Body"] for m in family.drain(url))


# -- a filter that matches nothing -------------------------------------------------------


def test_move_with_a_task_name_that_matches_nothing_says_what_was_there(
    family: Family, cli: Cli
) -> None:
    seed(family)

    text = cli.ok("move", "checkout", "--task", "send_email").output

    assert "4 scanned, 0 matched, 0 would move" in text
    assert f"--task send_email matched no message scanned; it nearly matches {SEND_EMAIL}" in text
    assert "did you mean --task '*.send_email'?" in text
    assert f"tasks scanned: {SEND_EMAIL} (3), {CHARGE} (1)" in text
    data = as_json(cli.ok("move", "checkout", "--task", "send_email", "--json"))
    assert (data["scanned"], data["matched"]) == (4, 0)
    assert data["filter_misses"]["tasks"][0]["suggestion"] == "*.send_email"
    assert data["filter_misses"]["tasks_seen"] == {SEND_EMAIL: 3, CHARGE: 1}
    found = as_json(cli.ok("move", "checkout", "--task", "*.send_email", "--json"))
    assert (found["matched"], found["filter_misses"]) == (3, None)


def test_move_with_message_ids_none_of_which_is_there_says_so(family: Family, cli: Cli) -> None:
    ids = seed(family)

    text = cli.ok("move", "checkout", "--message-id", "gone-1", "--message-id", "gone-2").output

    assert "4 scanned, 0 matched" in text
    assert "2 of the 2 --message-id value(s) matched no message scanned: gone-1, gone-2" in text
    data = as_json(
        cli.ok("move", "checkout", "--message-id", ids[0], "--message-id", "x", "--json")
    )
    assert data["matched"] == 1
    assert data["filter_misses"]["message_ids_not_seen"] == ["x"]


def test_purge_and_archive_say_how_many_were_scanned_and_what_the_filter_missed(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    seed(family)
    where = str(tmp_path / "a.jsonl.gz")

    dry = cli.ok("purge", "checkout", "--task", "send_email", "--archive", where).output
    archived = cli.ok("archive", "checkout", "--task", "send_email", "--archive", where).output

    assert "4 scanned, 0 matched" in dry
    assert "4 scanned" in archived
    for text in (dry, archived):
        assert "did you mean --task '*.send_email'?" in text
    data = as_json(cli.ok("purge", "checkout", "--task", "send_email", "--json"))
    assert data["scanned"] == 4
    assert data["filter_misses"]["tasks"][0]["near"] == [SEND_EMAIL]
    assert family.depth() == (4, 0)


# -- bodies that are not Celery tasks ------------------------------------------------------


def test_move_keeps_bodies_that_are_not_celery_tasks_out_of_the_celery_queue(
    family: Family,
    cli: Cli,
) -> None:
    seed(family)
    for text in NOT_CELERY:
        family.send_to_dlq(text)

    dry = as_json(cli.ok("move", "checkout", "--json"))
    done = as_json(cli.ok("move", "checkout", "--execute", "--yes", "--json"))

    for data in (dry, done):
        assert (data["moved"], data["skipped_by_reason"]) == (4, {"not-celery": 2})
    assert len(task_ids(family, family.queue_url)) == 4
    text = cli.ok("move", "checkout").output
    assert "2 message(s) skipped as not-celery" in text and "--include-unknown" in text
    asked = as_json(cli.ok("move", "checkout", "--include-unknown", "--execute", "--yes", "--json"))
    assert asked["moved"] == 2
    assert task_ids(family, family.queue_url) == sorted(NOT_CELERY)


def test_move_to_a_queue_no_family_reads_takes_them_and_to_a_familys_does_not(
    family: Family,
    cli: Cli,
) -> None:
    family.client.create_queue(QueueName="quarantine")
    family.client.create_queue(QueueName="onion")  # the default family's Celery queue
    quarantine = family.client.get_queue_url(QueueName="quarantine")["QueueUrl"]
    for text in NOT_CELERY:
        family.send_to_dlq(text)

    kept = as_json(cli.ok("move", "checkout", "--to", "onion", "--execute", "--yes", "--json"))
    sent = as_json(cli.ok("move", "checkout", "--to", "quarantine", "--execute", "--yes", "--json"))

    assert (kept["moved"], kept["skipped_by_reason"]) == (0, {"not-celery": 2})
    assert (sent["moved"], sent["skipped_by_reason"]) == (2, {})
    assert task_ids(family, quarantine) == sorted(NOT_CELERY)


def test_replay_into_a_familys_queue_skips_them_unless_asked(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    seed(family)
    for text in NOT_CELERY:
        family.send_to_dlq(text)
    where = str(tmp_path / "all.jsonl.gz")
    cli.ok("purge", "checkout", "--archive", where, "--execute", "--yes")

    dry = cli.ok("replay", where, "--to", "onion-checkout").output
    replayed = as_json(
        cli.ok("replay", where, "--to", "onion-checkout", "--execute", "--yes", "--json")
    )

    assert "6 read, 6 matched, 4 would replay" in dry
    assert (replayed["replayed"], replayed["skipped_by_reason"]) == (4, {"not-celery": 2})
    asked = cli.ok(
        "replay", where, "--to", "onion-checkout", "--include-unknown", "--execute", "--yes"
    )
    assert "2 replayed" in asked.output
    assert len(task_ids(family, family.queue_url)) == 6


def test_a_plan_keeps_include_unknown_for_apply(family: Family, tmp_path: Path, cli: Cli) -> None:
    for text in NOT_CELERY:
        family.send_to_dlq(text)
    plan = tmp_path / "plan.json"

    cli.ok("move", "checkout", "--include-unknown", "--plan-out", str(plan))
    applied = as_json(cli.ok("apply", str(plan), "--execute", "--yes", "--json"))

    assert json.loads(plan.read_text())["options"]["include_unknown"] is True
    assert applied["moved"] == 2


def test_native_move_refuses_the_options_it_cannot_honour(family: Family, cli: Cli) -> None:
    for option in ("--include-unknown", "--ambiguous=move"):
        result = cli("move", "checkout", "--native", option)
        assert result.exit_code == EXIT_USAGE, result.output
        assert "bypasses redrive's ledger" in result.output


# -- possible copies -----------------------------------------------------------------------


def untagged(text: str) -> str:
    envelope = json.loads(base64.b64decode(text))
    del envelope["properties"]["delivery_tag"]
    return base64.b64encode(json.dumps(envelope).encode()).decode()


def test_a_possible_copy_is_held_exit_3_and_moves_with_ambiguous_move(
    family: Family, cli: Cli
) -> None:
    same = untagged(encode(CHARGE, [1], {}, task_id="charge-1"))
    family.send_to_dlq(same)
    held_id = family.send_to_dlq(same)

    held = cli("move", "checkout", "--execute", "--yes", "--json")

    assert held.exit_code == EXIT_ATTENTION, held.output
    data = json.loads(held.stdout)
    assert (data["moved"], data["ambiguous"], data["duplicates_deleted"]) == (1, 1, 0)
    assert [m["message_id"] for m in data["ambiguous_messages"]] == [held_id]
    assert "no delivery tag" in data["ambiguous_messages"][0]["detail"]
    text = cli("move", "checkout").output
    assert "1 message(s) held as possible copies" in text and "--ambiguous move" in text
    asked = as_json(
        cli.ok("move", "checkout", "--ambiguous", "move", "--execute", "--yes", "--json")
    )
    assert (asked["moved"], asked["ambiguous"]) == (1, 0)
    assert task_ids(family, family.queue_url) == ["charge-1", "charge-1"]
    assert family.depth() == (0, 0)
