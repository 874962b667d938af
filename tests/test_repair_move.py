"""Moves and replays with edits (issue 26): each repaired task sent once with its new
arguments, what the edits leave unchanged left in the DLQ and said, the originals archived
before any edited copy is sent, and the ledger guarding an edited send as any other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli, Family, as_json

from redrive.archive import read_records
from redrive.messages import decode
from redrive.repair import open_task
from redrive.sandbox.encoder import encode

TASK = "shop.tasks.charge"


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
