"""``redrive move --execute`` with edits, end to end: a real Celery producer (protocols 1 and
2) dead-letters tasks a handler now rejects (a kwarg renamed since, a currency written wrong)
and tasks whose ``expires`` passed; ``redrive move`` repairs and sends them (the originals
archived first); a real ``celery worker`` runs each once with the new arguments. All on a
moto server on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from celery_worker import run_worker_until

pytest.importorskip("celery", minversion="5.0")
pytest.importorskip("kombu.transport.SQS")

from conftest import MotoServer, make_family
from test_repair_celery_e2e import _depth, _env, _runs

from redrive.archive import read_records
from redrive.messages import decode
from redrive.repair import edits_from_options, repair

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent


def redrive(server: MotoServer, *args: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "redrive", *args, "--json"],
        env=server.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_redrive_move_repairs_and_a_real_worker_runs_each_task_once(
    server: MotoServer, tmp_path: Path
) -> None:
    family = make_family(server.client())
    env, runs_file = _env(server, tmp_path, family.dlq_url, family.queue_url)
    env["E2E_QUEUES"] = json.dumps(
        {"onion-checkout-dlq": family.dlq_url, "onion-checkout": family.queue_url}
    )
    # The producer publishes straight to the DLQ: what dead-lettering would leave there.
    produced = subprocess.run(
        [sys.executable, str(tmp_path / "repair_e2e.py"), "onion-checkout-dlq"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert produced.returncode == 0, produced.stderr
    sent = {task_id: (protocol, kind) for task_id, protocol, kind in json.loads(produced.stdout)}
    assert {p for p, _ in sent.values()} == {1, 2}

    words = [
        "--rename", "kwargs.amount=kwargs.amount_cents",
        "--set", 'kwargs.currency="USD"',
        "--clear-expires",
    ]  # fmt: skip
    ledger, archive = tmp_path / "ledger.sqlite3", tmp_path / "originals.jsonl.gz"
    dry = redrive(server, "move", "checkout", *words, "--ledger", str(ledger))
    assert (dry["moved"], dry["repair"]["changed"]) == (len(sent), len(sent))
    done = redrive(
        server, "move", "checkout", *words, "--archive", str(archive),
        "--ledger", str(ledger), "--execute", "--yes",
    )  # fmt: skip
    assert (done["moved"], done["repair"]["archived"]) == (len(sent), len(sent))
    # The archive holds every original; what the worker must run is their repair.
    edits = edits_from_options(
        renames=["kwargs.amount=kwargs.amount_cents"],
        sets=['kwargs.currency="USD"'],
        clear_expires=True,
    )
    originals = [record.body for record in read_records(str(archive))]
    assert sorted(str(decode(b).task_id) for b in originals) == sorted(sent)
    expected = {}
    for body in originals:
        repaired = repair(body, edits)
        expected[str(decode(body).task_id)] = {
            "args": repaired.after.args,
            "kwargs": repaired.after.kwargs,
        }
    # A rerun sends nothing again.
    again = redrive(
        server, "move", "checkout", *words, "--archive", str(tmp_path / "again.jsonl.gz"),
        "--ledger", str(ledger), "--execute", "--yes",
    )  # fmt: skip
    assert again["moved"] == 0

    log = tmp_path / "worker.log"
    client = server.client()
    run_worker_until(
        "repair_e2e", "onion-checkout", cwd=tmp_path, env=env, log=log, name="move@localhost",
        done=lambda: (
            len(_runs(runs_file)) >= len(sent) and _depth(client, family.queue_url) == (0, 0)
        ),
        what="the worker ran the repaired tasks and the queue emptied", timeout=180,
    )  # fmt: skip
    ran = {run["id"]: {"args": run["args"], "kwargs": run["kwargs"]} for run in _runs(runs_file)}
    assert len(_runs(runs_file)) == len(sent), log.read_text()[-3000:]
    assert ran == expected, log.read_text()[-3000:]
    assert all(k["kwargs"]["currency"] == "USD" for k in ran.values())
    assert all("amount" not in k["kwargs"] for k in ran.values())
    text = log.read_text()
    assert "revoked" not in text.lower() and "Traceback" not in text
