"""A ledger written before the broker seam still prevents a resend.

``fixtures/ledger-before-seam/ledger.sqlite3`` was written by a real executed move of redrive
at 4f5601e (before ``redrive.broker``; ``make_ledger.py`` beside it, run with that tree on
PYTHONPATH): it sent a non-Celery message (keyed ``sqs:<MessageId>:g0``) and a Celery task
(keyed by its task id and publish). Copies of those same messages in the DLQ today, as SQS
hands out a message whose delete failed, must be deleted as already sent, never sent again.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from conftest import Family

from redrive.broker import resolve_target
from redrive.broker.base import Delivery
from redrive.broker.sqs import SqsBroker
from redrive.config import built_in_layout
from redrive.ledger.sqlite import SqliteLedger
from redrive.operations.move import MoveEngine, MoveOptions

FIXTURE = Path(__file__).parent / "fixtures" / "ledger-before-seam"


class SameMessages(SqsBroker):
    """SQS giving the messages the old run moved (their MessageIds, which moto cannot set)."""

    def __init__(self, client: Any, ids: dict[str, str]) -> None:
        super().__init__(client)
        self.ids = ids

    def receive(self, url: str, **kwargs: Any) -> list[Delivery]:
        got = super().receive(url, **kwargs)
        return [replace(m, message_id=self.ids.get(m.body, m.message_id)) for m in got]


def test_a_ledger_written_before_the_seam_still_prevents_a_resend(
    family: Family, tmp_path: Path
) -> None:
    messages = json.loads((FIXTURE / "messages.json").read_text())
    ledger_path = tmp_path / "ledger.sqlite3"
    shutil.copy(FIXTURE / "ledger.sqlite3", ledger_path)
    with SqliteLedger(ledger_path) as ledger:
        keys = {e.key for r in ledger.runs() for e in ledger.keys_for_run(r.run_id)}
    # The old ledger's own keys, in the namespace SQS still keys them by.
    assert f"sqs:{messages[0]['message_id']}:g0" in keys
    assert any(k.startswith("celery:task-before-seam:") for k in keys)
    for message in messages:
        family.send_to_dlq(message["body"])
    broker = SameMessages(family.client, {m["body"]: m["message_id"] for m in messages})
    target = resolve_target(built_in_layout({}), "checkout", lambda region: broker)
    with SqliteLedger(ledger_path) as ledger:
        result = MoveEngine(
            target,
            ledger,
            MoveOptions(execute=True, include_unknown=True),
            broker_factory=lambda: broker,
        ).run()
    assert (result.moved, result.in_doubt, result.failed) == (0, 0, 0)
    assert family.depth(family.queue_url) == (0, 0)  # nothing sent again
    assert family.depth() == (0, 0)  # the copies are gone from the DLQ, as already sent
