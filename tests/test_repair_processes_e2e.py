"""``move --processes 2`` with edits (issue 26): the children get the edits in their options,
each archives its originals beside the run's path, and every task is sent once, edited."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from conftest import Family, MotoServer, make_family
from test_e2e import ok_json, redrive
from test_processes_e2e import fast  # noqa: F401  (the fixture)

from redrive.archive import read_records
from redrive.messages import decode
from redrive.repair import open_task
from redrive.sandbox.encoder import encode

pytestmark = pytest.mark.e2e

TASK = "shop.tasks.charge"


def test_an_edited_move_in_two_processes_sends_each_task_once_edited(
    fast: MotoServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    family: Family = make_family(fast.client(), "onion-checkout")
    bodies = [
        encode(TASK, [n], {"currency": "usd"}, task_id=f"t-{n}", protocol=1 + n % 2)
        for n in range(120)
    ]
    for start in range(0, len(bodies), 10):
        family.client.send_message_batch(
            QueueUrl=family.dlq_url,
            Entries=[
                {"Id": str(i), "MessageBody": b} for i, b in enumerate(bodies[start : start + 10])
            ],
        )
    archive = tmp_path / "originals.jsonl.gz"
    data = ok_json(
        redrive(
            fast, "move", "checkout", "--set", 'kwargs.currency="USD"',
            "--archive", str(archive), "--ledger", str(tmp_path / "l.sqlite3"),
            "--processes", "2", "--workers", "2", "--execute", "--yes", "--json",
            timeout=120,
        )
    )  # fmt: skip
    assert data["moved"] == 120
    assert data["repair"]["changed"] == 120
    assert data["repair"]["archived"] == 120
    parts = data["repair"]["archive"].split(", ")
    archived = Counter(r.body for where in parts for r in read_records(where))
    assert archived == Counter(bodies), "each original archived once"
    sent = family.drain(family.queue_url)
    assert Counter(decode(m["Body"]).task_id for m in sent) == Counter(f"t-{n}" for n in range(120))
    assert {open_task(m["Body"]).content.kwargs["currency"] for m in sent} == {"USD"}
