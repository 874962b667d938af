"""Moves and replays with edits (issue 26): each repaired task sent once with its new
arguments, what the edits leave unchanged left in the DLQ and said, the originals archived
before any edited copy is sent, and the ledger guarding an edited send as any other."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli, Family, SqsClock, as_json
from test_move import LEASE, Crash, checkout, crash_at, wait_for_leases

from redrive.archive import read_records
from redrive.broker.sqs import SqsBroker
from redrive.ledger import SqliteLedger
from redrive.messages import decode
from redrive.operations.move import REPAIR_STEPS, MoveEngine, MoveOptions, MoveResult, RepairOptions
from redrive.operations.move.repair_step import repair_step
from redrive.repair import Edit, edits_from_options, open_task
from redrive.runs.observer import Callbacks
from redrive.sandbox.encoder import encode

TASK = "shop.tasks.charge"
EUR = edits_from_options(sets=['kwargs.currency="EUR"'])


def task_body(n: int, protocol: int = 2, **kwargs: Any) -> str:
    return encode(
        TASK,
        [n],
        {"amount": n * 100, "currency": "USD", **kwargs},
        task_id=f"charge-{n}",
        protocol=protocol,
    )


def seed(family: Family, bodies: list[str]) -> list[str]:
    ids = []
    for text in bodies:
        ids.append(
            family.client.send_message(QueueUrl=family.dlq_url, MessageBody=text)["MessageId"]
        )
    return ids


def arguments(body: str) -> tuple[list[Any], dict[str, Any]]:
    content = open_task(body).content
    return content.args, content.kwargs


def test_an_executed_edit_sends_each_task_once_with_its_new_arguments(
    family: Family, cli: Cli, tmp_path: Path
) -> None:
    originals = [task_body(n) for n in range(3)]
    seed(family, originals)
    archive = tmp_path / "originals.jsonl.gz"
    data = as_json(
        cli.ok(
            "move",
            "checkout",
            "--set",
            'kwargs.currency="EUR"',
            "--archive",
            str(archive),
            "--execute",
            "--yes",
            "--json",
        )
    )
    assert data["moved"] == 3
    assert data["repair"]["changed"] == 3
    assert data["repair"]["archived"] == 3
    assert family.depth() == (0, 0)
    sent = family.drain(family.queue_url)
    assert sorted(arguments(m["Body"])[1]["currency"] for m in sent) == ["EUR"] * 3
    assert sorted(decode(m["Body"]).task_id or "" for m in sent) == [
        f"charge-{n}" for n in range(3)
    ]
    assert sorted(r.body for r in read_records(str(archive))) == sorted(originals)


# -- the engine, killed at each step of an edited move ----------------------------------------


def edited_move(
    family: Family,
    ledger_path: Path,
    archive: Path | None,
    *,
    clock: SqsClock,
    fault: Callable[[str], None] | None = None,
    edits: tuple[Edit, ...] = EUR,
    **options: Any,
) -> MoveResult:
    """One executed engine run with ``edits``, its originals archived to ``archive``."""
    repair = RepairOptions(edits, str(archive) if archive else None)
    ledger = SqliteLedger(ledger_path, clock=clock)
    try:
        with repair_step(repair, execute=True) as step:
            return MoveEngine(
                checkout(family.client),
                ledger,
                MoveOptions(execute=True, lease=LEASE, repair=repair, **options),
                broker_factory=lambda: SqsBroker(family.client, clock=clock),
                observer=Callbacks(on_step=fault),
                clock=clock,
                repair=step,
            ).run()
    finally:
        ledger.close()


def archived_bodies(*paths: Path) -> list[str]:
    return [r.body for p in paths if p.exists() for r in read_records(str(p))]


@pytest.mark.parametrize("pipelined", [True, False], ids=["two-stage", "one-stage"])
@pytest.mark.parametrize("step", REPAIR_STEPS[1:])
def test_a_kill_at_any_step_of_an_edited_move_loses_and_doubles_nothing(
    family: Family, tmp_path: Path, sqs_clock: SqsClock, step: str, pipelined: bool
) -> None:
    originals = [task_body(n) for n in range(12)]
    seed(family, originals)
    ledger = tmp_path / "l.sqlite3"
    first, second = tmp_path / "a1.jsonl.gz", tmp_path / "a2.jsonl.gz"
    with pytest.raises(Crash):
        edited_move(
            family, ledger, first, clock=sqs_clock, fault=crash_at(step, 1), pipelined=pipelined
        )
    wait_for_leases(sqs_clock)
    # Claimed and never sent: resend; sent before the ledger heard: the operator skips it.
    policy = "skip" if step == "sent" else "resend"
    edited_move(family, ledger, second, clock=sqs_clock, in_doubt=policy, pipelined=pipelined)
    sent = family.drain(family.queue_url)
    left = family.drain(family.dlq_url)
    ids = Counter(decode(m["Body"]).task_id for m in sent)
    # Nothing doubled: each task once, edited.
    assert set(ids.values()) == {1}
    assert all(arguments(m["Body"])[1]["currency"] == "EUR" for m in sent)
    # Nothing lost: every task arrived, and every original that left the DLQ is archived.
    assert set(ids) == {f"charge-{n}" for n in range(12)}
    gone = set(originals) - {m["Body"] for m in left}
    assert gone <= set(archived_bodies(first, second))
    if step == "sent":
        # Sent before the ledger heard: in doubt, skipped by the operator, left in the DLQ
        # (its edited copy arrived once, from the killed run).
        assert len(left) == 10
    else:
        assert left == []


# -- the command line ---------------------------------------------------------------------------


def test_the_dry_run_shows_a_diff_and_counts_what_the_edit_leaves(family: Family, cli: Cli) -> None:
    seed(family, [task_body(0, region="eu"), task_body(1, region="us"), task_body(2)])
    result = cli.ok("move", "checkout", "--rename", "kwargs.region=kwargs.zone")
    text = result.output
    assert "edits: --rename kwargs.region=kwargs.zone" in text
    # Argument values hidden unless asked: the paths, and … for the values.
    assert "kwargs.region: … → (absent)" in text
    assert "kwargs.zone: (absent) → …" in text
    assert '"eu"' not in text and '"us"' not in text
    assert "2 message(s) changed by the edits: 2 would move" in text
    assert "1 left in the DLQ by the edits (1 unchanged by them):" in text
    assert "1 × no kwargs.region" in text
    assert "2 would move" in text
    # The command the dry run prints names the archive its --execute needs (issue 37).
    assert "originals would be archived first to ./redrive-archive/checkout-" in text
    shown = cli.ok("move", "checkout", "--set", 'kwargs.currency="EUR"', "--show-args").output
    assert 'kwargs.currency: "USD" → "EUR"' in shown
    data = as_json(cli.ok("move", "checkout", "--rename", "kwargs.region=kwargs.zone", "--json"))
    repair = data["repair"]
    assert (repair["changed"], repair["unchanged_by_edit"]) == (2, 1)
    assert repair["reasons"] == {"no kwargs.region": 1}
    assert repair["samples"][TASK] == [["kwargs.region: … → (absent)", "kwargs.zone: (absent) → …"]]
    assert [m["detail"] for m in repair["left_messages"]] == ["no kwargs.region"]
    assert data["skipped_by_reason"] == {"unchanged-by-edit": 1}
    assert family.depth() == (3, 0)


def test_unchanged_and_unrepairable_messages_stay_in_the_dlq(
    family: Family, cli: Cli, tmp_path: Path
) -> None:
    seed(family, [task_body(0, region="eu"), task_body(1), "not a task at all"])
    data = as_json(
        cli.ok(
            "move",
            "checkout",
            "--unset",
            "kwargs.region",
            "--include-unknown",
            "--archive",
            str(tmp_path / "a.jsonl.gz"),
            "--execute",
            "--yes",
            "--json",
        )
    )
    assert data["moved"] == 1
    assert data["repair"]["unchanged_by_edit"] == 1
    assert data["repair"]["not_repairable"] == 1
    assert family.depth() == (2, 0)
    (sent,) = family.drain(family.queue_url)
    assert "region" not in arguments(sent["Body"])[1]


def test_set_with_create_adds_a_missing_path(family: Family, cli: Cli) -> None:
    seed(family, [task_body(0)])
    plain = as_json(cli.ok("move", "checkout", "--set", 'kwargs.region="eu"', "--json"))
    assert plain["repair"]["reasons"] == {"no kwargs.region (--create adds it)": 1}
    made = as_json(cli.ok("move", "checkout", "--set", 'kwargs.region="eu"', "--create", "--json"))
    assert (made["repair"]["changed"], made["moved"]) == (1, 1)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--set", "kwargs.currency=EUR"], "is not JSON"),
        (["--set", "headers.x=1"], "--set"),
        (["--create"], "--create applies to --set"),
        (["--set", 'kwargs.currency="EUR"', "--execute", "--yes"], "add --archive PATH"),
        (["--set", "kwargs.a=1", "--archive", "x.jsonl", "--no-archive"], "contradict"),
        (["--archive", "x.jsonl"], "go with edits"),
        (["--set", "kwargs.a=1", "--native"], "--native"),
    ],
)
def test_bad_edits_are_one_line_and_exit_2(
    family: Family, cli: Cli, args: list[str], said: str
) -> None:
    seed(family, [task_body(0)])
    result = cli("move", "checkout", *args)
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert "Traceback" not in result.output
    assert family.depth() == (1, 0)


def test_a_rerun_with_another_edit_does_not_resend(
    family: Family, cli: Cli, tmp_path: Path
) -> None:
    original = task_body(0)
    seed(family, [original])
    cli.ok(
        "move",
        "checkout",
        "--set",
        'kwargs.currency="EUR"',
        "--archive",
        str(tmp_path / "1.jsonl.gz"),
        "--execute",
        "--yes",
    )
    (sent,) = family.drain(family.queue_url)
    # The same publish dead-lettered again (a copy of the original): the ledger knows its key.
    seed(family, [original])
    again = as_json(
        cli.ok(
            "move",
            "checkout",
            "--set",
            'kwargs.currency="GBP"',
            "--archive",
            str(tmp_path / "2.jsonl.gz"),
            "--execute",
            "--yes",
            "--json",
        )
    )
    assert again["moved"] == 0
    assert again["duplicates_deleted"] == 1
    assert family.depth(family.queue_url) == (0, 0)
    assert arguments(sent["Body"])[1]["currency"] == "EUR"


def test_an_edit_that_makes_a_body_too_big_is_refused_per_message(family: Family, cli: Cli) -> None:
    seed(family, [task_body(0), task_body(1)])
    big = json.dumps("x" * 1_100_000)
    data = as_json(cli.ok("move", "checkout", "--set", f"kwargs.currency={big}", "--json"))
    assert data["repair"]["too_big"] == 2
    assert data["moved"] == 0


def test_a_plan_records_the_edits_and_apply_sends_exactly_the_reviewed_bodies(
    family: Family, cli: Cli, tmp_path: Path
) -> None:
    seed(family, [task_body(0), task_body(1)])
    plan = tmp_path / "plan.json"
    archive = tmp_path / "originals.jsonl.gz"
    cli.ok(
        "move",
        "checkout",
        "--set",
        'kwargs.currency="EUR"',
        "--archive",
        str(archive),
        "--plan-out",
        str(plan),
    )
    recorded = json.loads(plan.read_text())
    assert recorded["options"]["edits"] == ["--set", 'kwargs.currency="EUR"']
    items = recorded["items"]
    assert all(i["digest_before"].startswith("sha256:") for i in items)
    assert all(i["digest_before"] != i["digest_after"] for i in items)
    # One message changed since the plan (as a producer would republish it): refused, left.
    tampered = dict(items[0], digest_before="sha256:" + "0" * 64)
    recorded["items"] = [tampered, items[1]]
    plan.write_text(json.dumps(recorded))
    # Left for a new review: exit 3 (docs/exit-codes.md).
    data = as_json(cli.ok("apply", str(plan), "--execute", "--yes", "--json", code=3))
    move = data.get("result", data)
    assert move["moved"] == 1
    assert move["repair"]["changed_since_plan"] == 1
    (sent,) = family.drain(family.queue_url)
    from redrive.repair import body_digest

    assert body_digest(sent["Body"]) == items[1]["digest_after"]
    assert family.depth() == (1, 0)
    assert len(archived_bodies(archive)) == 1


def test_the_audit_records_the_edits_and_the_archive(
    family: Family, cli: Cli, tmp_path: Path
) -> None:
    seed(family, [task_body(0)])
    archive = tmp_path / "a.jsonl.gz"
    run = as_json(
        cli.ok(
            "move",
            "checkout",
            "--clear-expires",
            "--set",
            'kwargs.currency="EUR"',
            "--archive",
            str(archive),
            "--execute",
            "--yes",
            "--json",
        )
    )
    assert run["moved"] == 1
    shown = as_json(cli.ok("audit", run["run_id"], "--json"))
    info = shown["info"] if "info" in shown else shown["run"]["info"]
    assert info["edits"] == ["--set", 'kwargs.currency="EUR"', "--clear-expires"]
    assert info["archive"] == str(archive)
    assert [k["task"] for k in shown["keys"]] == [TASK]
    text = cli.ok("audit", run["run_id"]).output
    assert """edits:    --set 'kwargs.currency="EUR"' --clear-expires""" in text
    assert f"archive:  {archive}" in text


def test_a_replay_with_edits_sends_the_archived_tasks_edited(
    family: Family, cli: Cli, tmp_path: Path
) -> None:
    originals = [task_body(n, region="eu") for n in range(2)] + [task_body(2)]
    seed(family, originals)
    archive = tmp_path / "purged.jsonl.gz"
    cli.ok("purge", "checkout", "--archive", str(archive), "--execute", "--yes")
    words = ["--rename", "kwargs.region=kwargs.zone"]
    refused = cli("replay", str(archive), "--to", "onion-checkout", *words, "--no-archive")
    assert refused.exit_code == 2 and "drop --archive/--no-archive" in refused.output
    dry = as_json(cli.ok("replay", str(archive), "--to", "onion-checkout", *words, "--json"))
    assert dry["repair"]["changed"] == 2 and dry["repair"]["unchanged_by_edit"] == 1
    cli.ok("replay", str(archive), "--to", "onion-checkout", *words, "--execute", "--yes")
    sent = family.drain(family.queue_url)
    assert sorted(arguments(m["Body"])[1]["zone"] for m in sent) == ["eu", "eu"]


# -- the step itself ------------------------------------------------------------------------------


def test_change_text_hides_values_unless_asked() -> None:
    from redrive.operations.move.repair_step import change_text
    from redrive.repair import ABSENT, Change

    change = Change("kwargs.currency", "usd", "USD")
    assert change_text(change, show_args=True) == 'kwargs.currency: "usd" → "USD"'
    assert change_text(change, show_args=False) == "kwargs.currency: … → …"
    added = Change("kwargs.zone", ABSENT, "eu")
    assert change_text(added, show_args=False) == "kwargs.zone: (absent) → …"


def test_reports_of_processes_merge() -> None:
    from redrive.operations.move.repair_step import UNCHANGED, RepairReport

    one = RepairReport(["--clear-eta"], changed=2, archived=2, samples={TASK: [["eta: … → …"]]})
    two = RepairReport(["--clear-eta"], changed=1, archived=1)
    two.left[UNCHANGED] += 3
    two.details["no eta"] += 3
    merged = RepairReport(["--clear-eta"])
    merged.merge(one)
    merged.merge(two)
    data = merged.to_json()
    assert (data["changed"], data["archived"], data["unchanged_by_edit"]) == (3, 3, 3)
    assert data["reasons"] == {"no eta": 3}
    assert data["samples"] == {TASK: [["eta: … → …"]]}


def test_repair_options_cross_to_processes_pickled() -> None:
    import pickle

    options = RepairOptions(
        edits_from_options(
            sets=['kwargs.a.b="x"'], renames=["kwargs.c=kwargs.d"], clear_eta=True, create=True
        ),
        "s3://bucket/prefix",
        planned={"m": ("sha256:1", "sha256:2")},
    )
    assert pickle.loads(pickle.dumps(options)) == options
    assert options.words == [
        "--rename", "kwargs.c=kwargs.d", "--set", 'kwargs.a.b="x"', "--create", "--clear-eta",
    ]  # fmt: skip


def test_a_passed_expires_cleared_is_sent_not_skipped_as_expired(
    family: Family, cli: Cli, tmp_path: Path
) -> None:
    from datetime import UTC, datetime, timedelta

    past = datetime.now(UTC) - timedelta(hours=1)
    late = encode(TASK, [1], {"currency": "USD"}, task_id="late", expires=past)
    seed(family, [late, task_body(2)])
    plain = as_json(cli.ok("move", "checkout", "--json"))
    assert plain["skipped_by_reason"] == {"expired": 1}
    data = as_json(
        cli.ok(
            "move", "checkout", "--clear-expires", "--archive", str(tmp_path / "a.jsonl.gz"),
            "--execute", "--yes", "--json",
        )
    )  # fmt: skip
    assert data["moved"] == 1
    assert data["repair"]["reasons"] == {"no expires": 1}
    (sent,) = family.drain(family.queue_url)
    assert decode(sent["Body"]).task_id == "late"
    assert open_task(sent["Body"]).content.expires is None
