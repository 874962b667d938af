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
from redrive.operations.observer import Callbacks
from redrive.repair import Edit, edits_from_options, open_task
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
                MoveOptions(execute=True, lease=LEASE, pipelined=False, repair=repair, **options),
                broker_factory=lambda: SqsBroker(family.client, clock=clock),
                observer=Callbacks(on_step=fault),
                clock=clock,
                repair=step,
            ).run()
    finally:
        ledger.close()


def archived_bodies(*paths: Path) -> list[str]:
    return [r.body for p in paths if p.exists() for r in read_records(str(p))]


@pytest.mark.parametrize("step", REPAIR_STEPS[1:])
def test_a_kill_at_any_step_of_an_edited_move_loses_and_doubles_nothing(
    family: Family, tmp_path: Path, sqs_clock: SqsClock, step: str
) -> None:
    originals = [task_body(n) for n in range(12)]
    seed(family, originals)
    ledger = tmp_path / "l.sqlite3"
    first, second = tmp_path / "a1.jsonl.gz", tmp_path / "a2.jsonl.gz"
    with pytest.raises(Crash):
        edited_move(family, ledger, first, clock=sqs_clock, fault=crash_at(step, 1))
    wait_for_leases(sqs_clock)
    # Claimed and never sent: resend; sent before the ledger heard: the operator skips it.
    policy = "skip" if step == "sent" else "resend"
    edited_move(family, ledger, second, clock=sqs_clock, in_doubt=policy)
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
