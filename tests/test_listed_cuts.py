"""Issue 22: the lists a summary cuts (in doubt, failed, held as copies; at most MAX_LISTED
each) say they are cut, in the JSON and under the table, and where the rest is; and
``redrive ledger in-doubt`` lists every in-doubt message of a ledger, a page at a time, on
both backends."""

from __future__ import annotations

import json
from collections import Counter
from contextlib import closing
from typing import Any

import pytest
from conftest import Cli, Family, as_json

from redrive.broker.base import BatchResult
from redrive.broker.sqs import SqsBroker
from redrive.cli.exit_codes import EXIT_ATTENTION
from redrive.keys import key_for
from redrive.ledger import Claim, KeyState, Ledger, SqliteLedger, open_ledger
from redrive.messages import decode
from redrive.operations.merge import merge_move_results
from redrive.operations.move import AMBIGUOUS, MAX_LISTED, Listed, MoveResult
from redrive.operations.move import result as move_result
from redrive.render.move import move_text
from redrive.sandbox.encoder import encode

CHARGE = "apps.shop.tasks.charge"
MANY = 250
DEAD = "deadrun"


def put_many(family: Family, n: int = MANY) -> dict[str, str]:
    """``n`` charge tasks in the DLQ: MessageId -> body."""
    bodies = [encode(CHARGE, [i], {}, task_id=f"charge-{i:03}") for i in range(n)]
    ids: dict[str, str] = {}
    for start in range(0, n, 10):
        chunk = bodies[start : start + 10]
        sent = family.client.send_message_batch(
            QueueUrl=family.dlq_url,
            Entries=[{"Id": str(i), "MessageBody": b} for i, b in enumerate(chunk)],
        )
        for item in sent["Successful"]:
            ids[item["MessageId"]] = chunk[int(item["Id"])]
    return ids


def die_holding(ledger: Ledger, messages: dict[str, str], target: str) -> None:
    """A run that claimed the keys of ``messages`` and died before confirming any send."""
    ledger.start_run(DEAD, command="move", info={"host": "elsewhere", "target": "checkout"})
    claims = [
        Claim(
            key_for(decode(b), message_id=m, generation=0, body=b, namespace="sqs"),
            CHARGE,
            m,
            target,
        )
        for m, b in messages.items()
    ]
    for start in range(0, len(claims), 50):
        ledger.claim_many(DEAD, claims[start : start + 50])
    ledger.end_run(DEAD, outcome="failed", counts={})


def test_more_than_100_in_doubt_the_summary_says_100_shown_and_the_ledger_lists_all(
    family: Family, cli: Cli
) -> None:
    # 130, not thousands: in-process moto reads its whole queue on every receive.
    messages = put_many(family, 130)
    with closing(open_ledger(None)) as ledger:
        die_holding(ledger, messages, family.queue_url)

    data = as_json(cli("move", "checkout", "--execute", "--yes", "--json"))
    assert data["in_doubt"] == 130
    assert len(data["in_doubt_messages"]) == data["in_doubt_listed"] == MAX_LISTED
    assert data["in_doubt_truncated"] is True
    assert (data["failed_listed"], data["failed_truncated"]) == (0, False)
    assert (data["ambiguous_listed"], data["ambiguous_truncated"]) == (0, False)

    text = cli("move", "checkout", "--execute", "--yes")
    assert text.exit_code == EXIT_ATTENTION, text.output
    assert "100 of 130 shown: `redrive ledger in-doubt` lists them all" in text.output
    assert family.depth() == (130, 0)  # all held in the DLQ

    listed = cli("ledger", "in-doubt", "--json")
    assert listed.exit_code == EXIT_ATTENTION, listed.output
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert len(rows) == 130
    assert {r["message_id"] for r in rows} == set(messages)
    assert {r["task_id"] for r in rows} == {f"charge-{i:03}" for i in range(130)}
    assert {(r["run_id"], r["task"], r["target"]) for r in rows} == {
        (DEAD, CHARGE, family.queue_url)
    }

    table = cli("ledger", "in-doubt", "--run", DEAD[:4])
    assert table.exit_code == EXIT_ATTENTION, table.output
    assert sum(m in table.output for m in messages) == 130
    assert "130 message(s) in doubt" in table.output
    assert "--in-doubt resend" in table.output


def test_250_in_doubt_in_a_dynamodb_ledger_are_all_listed(
    family: Family, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same on DynamoDB: 250 keys in doubt (8 of them of messages in the DLQ), a summary
    cut (at 5 here: the cut is the same code at any size) naming the ledger to list."""
    uri = "dynamodb://redrive-ledger"
    cli.ok("ledger", "init", uri)
    messages = put_many(family, 8)
    with closing(open_ledger(uri)) as ledger:
        die_holding(ledger, messages, family.queue_url)
        for start in range(0, MANY - 8, 50):
            ledger.claim_many(
                DEAD,
                [
                    Claim(f"sqs:gone-{i:03}:g0", CHARGE, f"gone-{i:03}", family.queue_url)
                    for i in range(start, min(start + 50, MANY - 8))
                ],
            )

    monkeypatch.setattr(move_result, "MAX_LISTED", 5)
    data = as_json(cli("move", "checkout", "--execute", "--yes", "--json", "--ledger", uri))
    assert (data["in_doubt"], data["in_doubt_listed"], data["in_doubt_truncated"]) == (8, 5, True)
    text = cli("move", "checkout", "--execute", "--yes", "--ledger", uri).output
    assert f"5 of 8 shown: `redrive ledger in-doubt --ledger {uri}` lists them all" in text

    listed = cli("ledger", "in-doubt", "--json", "--ledger", uri)
    assert listed.exit_code == EXIT_ATTENTION, listed.output
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert len(rows) == len({r["key"] for r in rows}) == MANY
    assert set(messages) <= {r["message_id"] for r in rows}
    table = cli("ledger", "in-doubt", "--ledger", uri, "--run", DEAD).output
    assert "250 message(s) in doubt" in table


def test_a_listing_of_nothing_in_doubt_exits_0(family: Family, cli: Cli) -> None:
    assert cli.ok("ledger", "in-doubt").output.strip() == "no ledger yet, so nothing in doubt"
    with closing(open_ledger(None)) as ledger:
        ledger.start_run("live", command="move", info={})
        ledger.heartbeat("live", lease_until=4e9)  # still sending: not in doubt
        ledger.claim_many("live", [Claim("sqs:m-1:g0", CHARGE, "m-1", family.queue_url)])
    done = cli.ok("ledger", "in-doubt")
    assert "nothing in doubt in ledger" in done.output
    assert "1 claimed by runs still live" in done.output
    assert cli.ok("ledger", "in-doubt", "--json").stdout == ""
    missing = cli("ledger", "in-doubt", "--run", "nosuchrun")
    assert missing.exit_code == 1 and "`redrive audit` lists them" in missing.output


def test_failed_sends_beyond_the_cut_say_how_many_are_shown_and_that_all_stay(
    family: Family, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: SqsBroker, url: str, entries: Any) -> BatchResult:
        return BatchResult({}, {e.id: "KMS.DisabledException: key disabled" for e in entries})

    monkeypatch.setattr(SqsBroker, "send_batch", refuse)
    monkeypatch.setattr(move_result, "MAX_LISTED", 5)
    put_many(family, 8)
    data = as_json(cli("move", "checkout", "--execute", "--yes", "--json"))
    assert data["failed"] == 8
    assert (data["failed_listed"], data["failed_truncated"]) == (5, True)
    assert len(data["failed_messages"]) == 5
    text = cli("move", "checkout", "--execute", "--yes").output
    assert "5 of 8 shown: all of them are still in the DLQ, and a rerun sends" in text


def listed(n: int, prefix: str) -> list[Listed]:
    return [Listed(CHARGE, f"{prefix}{i}", f"m-{prefix}{i}", f"k-{prefix}{i}") for i in range(n)]


def test_held_copies_say_how_many_are_shown_and_how_to_list_the_rest() -> None:
    result = MoveResult(dry_run=False, target="onion-checkout", dlq="onion-checkout-dlq")
    result.skipped = Counter({AMBIGUOUS: MANY})
    result.ambiguous_messages = listed(MAX_LISTED, "a")
    data = result.to_json()
    assert (data["ambiguous"], data["ambiguous_listed"], data["ambiguous_truncated"]) == (
        MANY,
        MAX_LISTED,
        True,
    )
    text = move_text(result)
    assert "100 of 250 shown: all of them are still in the DLQ; a dry run narrowed" in text


def test_a_processes_merge_says_its_joined_lists_are_cut() -> None:
    """Three processes with 90 in doubt each: 270 in doubt, the first 100 listed."""
    parts = []
    for p in range(3):
        part = MoveResult(dry_run=False, target="q", dlq="q-dlq", in_doubt=90)
        part.in_doubt_messages = listed(90, f"p{p}-")
        parts.append(part)
    merged = merge_move_results(MoveResult(dry_run=False, target="q", dlq="q-dlq"), parts, None)
    data = merged.to_json()
    assert (data["in_doubt"], data["in_doubt_listed"], data["in_doubt_truncated"]) == (
        270,
        MAX_LISTED,
        True,
    )
    assert "100 of 270 shown: `redrive ledger in-doubt" in move_text(merged)


def test_whole_lists_say_they_are_whole() -> None:
    result = MoveResult(dry_run=True, target="q", dlq="q-dlq", in_doubt=2, failed=1)
    result.in_doubt_messages = listed(2, "d")
    result.failed_messages = listed(1, "f")
    data = result.to_json()
    assert (data["in_doubt_listed"], data["in_doubt_truncated"]) == (2, False)
    assert (data["failed_listed"], data["failed_truncated"]) == (1, False)
    assert " shown: " not in move_text(result)


def test_the_listing_reads_the_ledger_a_small_page_at_a_time(tmp_path: Any) -> None:
    """Bounded memory: in_doubt passes its page size to the ledger and reads a page only
    once the one before is consumed (keys resolved meanwhile are not listed)."""
    from redrive.reporting.in_doubt import Tally, in_doubt  # new in issue 22

    with SqliteLedger(tmp_path / "l.sqlite3") as ledger:
        ledger.start_run(DEAD, command="move", info={})
        keys = [f"sqs:m-{i:03}:g0" for i in range(MANY)]
        for start in range(0, MANY, 50):
            ledger.claim_many(
                DEAD, [Claim(k, CHARGE, k[4:9], "q") for k in keys[start : start + 50]]
            )
        ledger.end_run(DEAD, outcome="failed", counts={})
        pages: list[int] = []
        iter_keys = ledger.iter_keys

        def spy(state: KeyState, **kwargs: Any) -> Any:
            pages.append(kwargs["page_size"])
            return iter_keys(state, **kwargs)

        ledger.iter_keys = spy  # type: ignore[method-assign]
        tally = Tally()
        assert len(list(in_doubt(ledger, tally=tally, page_size=7))) == MANY == tally.listed
        assert pages == [7]

        listing = in_doubt(ledger, page_size=7)
        next(listing)
        ledger.start_run("resolver", command="move", info={})
        ledger.mark_skipped_many("resolver", keys)
        assert len(list(listing)) < 7


def test_the_task_id_is_read_back_from_its_key() -> None:
    from redrive.keys import task_id_of_key  # new in issue 22

    body = encode(CHARGE, [1], {}, task_id="abc:with-colon")
    info = decode(body)
    assert (
        task_id_of_key(key_for(info, message_id="m", generation=2, body=body, namespace="sqs"))
        == "abc:with-colon"
    )
    assert task_id_of_key(
        key_for(info, message_id="m", generation=0, body=body, by_message=True, namespace="sqs")
    ) == ("abc:with-colon")
    assert task_id_of_key("celery:t-1:r0:g0:0123abcd") == "t-1"  # the earlier form
    assert task_id_of_key("sqs:m-1:g0") is None
    assert task_id_of_key("sha256:" + "0" * 64) is None
    assert task_id_of_key("state") is None
    assert KeyState.CLAIMED == "claimed"


def test_every_other_capped_list_in_the_json_says_how_much_of_it_is_there() -> None:
    """The same scheme (NAME_listed, NAME_truncated) on the other capped lists: the damaged
    places of an archive, and what a filter that matched nothing saw."""
    from redrive.archive import Damage, DamageReport
    from redrive.selection import FilterMisses

    places = tuple(Damage("a.jsonl", f"bad line {i}", line=i) for i in range(20))
    damage = DamageReport("a.jsonl", places, count=35, readable=3, expected=None).to_json()
    assert (damage["places"], damage["places_listed"], damage["places_truncated"]) == (
        35,
        20,
        True,
    )
    whole = DamageReport("a.jsonl", places[:2], count=2, readable=3, expected=None).to_json()
    assert (whole["places_listed"], whole["places_truncated"]) == (2, False)

    misses = FilterMisses(
        patterns=(),
        tasks_seen=(("a", 3), ("b", 1)),
        distinct_tasks=30,
        ids_not_seen=("x", "y"),
        ids_not_seen_count=2,
        ids_given=5,
    ).to_json()
    assert (misses["tasks_seen_listed"], misses["tasks_seen_truncated"]) == (2, True)
    assert (misses["message_ids_not_seen_listed"], misses["message_ids_not_seen_truncated"]) == (
        2,
        False,
    )


def test_a_chat_post_says_how_many_new_tasks_it_leaves_out() -> None:
    from redrive.render.slack import _change_line
    from redrive.reporting.alerts import Change

    change = Change("checkout", 1.0, 3, 11, new_tasks={f"apps.t{i}": 1 for i in range(8)})
    assert _change_line(change).endswith("`apps.t4` and 3 more)")
    few = Change("checkout", 1.0, 3, 5, new_tasks={"apps.t0": 1})
    assert _change_line(few).endswith("(new: `apps.t0`)")
