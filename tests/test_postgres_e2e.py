"""End to end on a PostgreSQL ledger: the real ``redrive`` as subprocesses, two runs at
once on one DLQ (as two hosts would), each with four workers (the second also in two
processes), sharing one ledger on the
run's private PostgreSQL server. moto's server serves one request at a time here (its
threaded server can hand one message to two concurrent receivers)."""

from __future__ import annotations

import json
import os
import random
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Family, MotoServer, make_family, start_moto_server
from kill_points import At, KillPoints, wait_until_stopped
from test_e2e import (
    CAPTURE,
    REFUND,
    arrivals,
    by_body,
    celery,
    dlq_bodies,
    fill,
    finished,
    start_redrive,
    wait_for,
    watch,
)

from redrive.ledger import KeyState, init_postgres
from redrive.ledger.postgres import PostgresLedger

pytestmark = pytest.mark.e2e

# At most 25 messages a second each: the runs overlap for seconds once both are going.
MOVE = ("move", "checkout", "--execute", "--yes", "--json", "--workers", "4", "--rate", "25")


@pytest.fixture
def serial(tmp_path: Path) -> Iterator[MotoServer]:
    server = start_moto_server(tmp_path / "server.log", serial=True)
    try:
        yield server
    finally:
        server.process.terminate()
        server.process.wait(10)


def progress_of(family: Family, url: str) -> Callable[[], object]:
    def progress() -> object:
        with PostgresLedger(url) as led:
            states = {s: sum(1 for _ in led.iter_keys(s)) for s in KeyState}
        return sorted(states.items()), family.depth(family.queue_url), family.depth()

    return progress


def done_keys(url: str) -> int:
    with PostgresLedger(url) as led:
        return sum(1 for _ in led.iter_keys(KeyState.DONE))


def test_two_runs_with_four_workers_on_one_postgres_ledger_send_each_task_once(
    serial: MotoServer, postgres_url: str, tmp_path: Path
) -> None:
    init_postgres(postgres_url)
    checkout = make_family(serial.client(), "onion-checkout")
    rng = random.Random(40)
    unique = [celery(rng.choice((CAPTURE, REFUND)), rng.choice((1, 2))) for _ in range(120)]
    copies = unique[:10] * 2  # more copies of those publishes, spread through the queue
    dead = [*unique, *copies]
    rng.shuffle(dead)
    fill(checkout, dead)

    outs = [tmp_path / "host1", tmp_path / "host2"]
    # Both take part whatever the machine's speed (a second run slow to start once found the
    # first done): the first stops at its first message, which its long lease keeps from the
    # second; the second (in two processes, each opening the ledger by its URL) starts and
    # moves a task; then the first goes on. From there on they run at once.
    points = KillPoints(tmp_path / "points", At("move.received", do="stop"))
    first = start_redrive(
        serial, *MOVE, "--lease", "600", "--ledger", postgres_url, out=outs[0], points=points
    )
    runs = [first]
    try:
        stopped = points.wait_for_note()["pid"]
        wait_until_stopped(stopped)
        runs.append(
            start_redrive(serial, *MOVE, "--processes", "2", "--ledger", postgres_url, out=outs[1])
        )
        wait_for(
            lambda: runs[1].poll() is not None or done_keys(postgres_url) > 0,
            timeout=300,
            what="the second run's first task",
        )
        os.kill(stopped, signal.SIGCONT)
        watch(runs, progress_of(checkout, postgres_url))
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait(10)
    results = []
    for run, out in zip(runs, outs, strict=True):
        code, stdout, stderr = finished(run, out)
        assert code == 0, (code, stdout, stderr)
        assert "Traceback" not in stderr
        results.append(json.loads(stdout))
    assert all(r["failed"] == 0 and r["in_doubt"] == 0 for r in results)
    assert all(r["moved"] > 0 for r in results), "both runs did part of the work"
    assert sum(r["moved"] for r in results) == len(unique)
    assert all(r["ledger"].startswith("postgresql://postgres@127.0.0.1:") for r in results)

    got = arrivals(checkout, by_body(dead))
    assert got == Counter({d.ident: 1 for d in unique}), "every task exactly once"
    # A copy one run skipped as claimed by the other (which was sending that task) stays in
    # the DLQ, visible: only second copies of tasks that arrived.
    left = dlq_bodies(checkout)
    busy = sum(r["skipped_by_reason"].get("claimed-by-another-run", 0) for r in results)
    assert sum(left.values()) <= busy, (left, [r["skipped_by_reason"] for r in results])
    assert all(by_body(dead)[body].ident in got for body in left)
    with PostgresLedger(postgres_url) as led:
        done = list(led.iter_keys(KeyState.DONE))
        assert len(done) == len(unique)
        # The processes of the second run record their keys as its runs ".1" and ".2".
        assert {e.run_id.partition(".")[0] for e in done} == {r["run_id"] for r in results}
        assert list(led.iter_keys(KeyState.CLAIMED)) == []
        assert {r.outcome for r in led.runs()} == {"completed"}
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert " 500 " not in log
