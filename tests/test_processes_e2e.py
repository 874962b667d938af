"""End to end: ``--processes N`` (issue 17), the real ``redrive`` as a subprocess against
bench/fast_sqs.py on 127.0.0.1 (moto's server is not safe for concurrent receives on one
queue; fast_sqs is). Every message is built here with a known task id, so what arrives is
checked against what was dead-lettered, byte for byte, never against redrive's decoder."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import Family, MotoServer, make_family
from kill_points import At, KillPoints, wait_until_stopped
from test_e2e import (
    CAPTURE,
    IBFT,
    REFUND,
    Dead,
    arrivals,
    by_body,
    celery,
    dlq_messages,
    fill,
    finished,
    ledger_states,
    ok_json,
    redrive,
    start_redrive,
    wait_for,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
FAST_SQS = ROOT / "bench" / "fast_sqs.py"
REDRIVE = [sys.executable, "-m", "redrive"]


@contextlib.contextmanager
def fast_sqs(log: Path, *args: str) -> Iterator[MotoServer]:
    """bench/fast_sqs.py in a process of its own (it prints its endpoint first)."""
    with log.open("wb") as errors:
        process = subprocess.Popen(
            [sys.executable, str(FAST_SQS), "--host", "127.0.0.1", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("fast_sqs: SQS on "), line
    server = MotoServer(line.split(" on ", 1)[1].strip(), process, log)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        process.terminate()
        process.wait(10)
        process.stdout.close()


@pytest.fixture
def fast(tmp_path: Path) -> Iterator[MotoServer]:
    with fast_sqs(tmp_path / "fast_sqs.log") as server:
        yield server


@pytest.fixture
def distant(tmp_path: Path) -> Iterator[MotoServer]:
    """fast_sqs answering after 20 ms, as AWS does a client in its region: a run lasts long
    enough for a test to kill one of its processes mid-run, however busy the machine."""
    with fast_sqs(tmp_path / "fast_sqs.log", "--latency-ms", "20") as server:
        yield server


@pytest.fixture
def checkout(fast: MotoServer) -> Family:
    return make_family(fast.client(), "onion-checkout")


def seed_dlq(family: Family, dead: Sequence[Dead]) -> None:
    """Put ``dead`` straight into the DLQ (against a server that answers after 20 ms,
    dead-lettering them through the source queue would take many seconds)."""
    for start in range(0, len(dead), 10):
        entries = [
            {"Id": str(i), "MessageBody": d.body, "MessageAttributes": d.attributes}
            for i, d in enumerate(dead[start : start + 10])
        ]
        answer = family.client.send_message_batch(QueueUrl=family.dlq_url, Entries=entries)
        assert not answer.get("Failed"), answer
    assert family.depth() == (len(dead), 0)


def tasks(n: int, seed: int) -> list[Dead]:
    rng = random.Random(seed)
    return [celery(rng.choice((CAPTURE, REFUND, IBFT)), rng.choice((1, 2))) for _ in range(n)]


MOVE = ("move", "checkout", "--execute", "--yes", "--json")


def test_move_in_two_processes_sends_each_task_once_byte_identical(
    fast: MotoServer, checkout: Family, tmp_path: Path
) -> None:
    dead = tasks(300, seed=17)
    copies = dead[:15]  # second copies of 15 publishes: deleted as duplicates, never sent
    fill(checkout, [*dead, *copies])
    ledger = tmp_path / "ledger.sqlite3"
    result = redrive(
        fast, *MOVE, "--ledger", str(ledger), "--processes", "2", "--workers", "2", timeout=120
    )
    data = ok_json(result)
    assert data["processes"] == 2
    assert [c["outcome"] for c in data["children"]] == ["completed", "completed"]
    assert data["moved"] == 300 and data["failed"] == 0 and data["in_doubt"] == 0
    assert data["moved"] + data["duplicates_deleted"] + data["skipped"] == 315, data
    assert sum(data["by_task"].values()) == 300
    got = arrivals(checkout, by_body(dead))
    assert got == Counter({d.ident: 1 for d in dead}), "each task exactly once"
    assert checkout.depth() == (0, 0)
    # One audit record for the command, its counts summed; the children's runs folded in.
    audit = ok_json(redrive(fast, "audit", "--ledger", str(ledger), "--json"))
    [run] = audit["runs"]
    assert run["run_id"] == data["run_id"]
    assert run["counts"]["moved"] == 300
    assert run["info"]["processes"] == 2
    children = run["info"]["children"]
    assert [(c["run_id"], c["outcome"]) for c in children] == [
        (f"{data['run_id']}.1", "completed"),
        (f"{data['run_id']}.2", "completed"),
    ]
    shown = ok_json(redrive(fast, "audit", data["run_id"], "--ledger", str(ledger), "--json"))
    assert len(shown["keys"]) == 300


def test_limit_is_exact_across_processes(
    fast: MotoServer, checkout: Family, tmp_path: Path
) -> None:
    dead = tasks(200, seed=37)
    fill(checkout, dead)
    ledger = tmp_path / "ledger.sqlite3"
    args = ("--ledger", str(ledger), "--processes", "2", "--workers", "2", "--limit", "37")
    data = ok_json(redrive(fast, *MOVE, *args, timeout=120))
    assert data["moved"] == 37
    got = arrivals(checkout, by_body(dead))
    assert sum(got.values()) == 37 and set(got.values()) == {1}
    assert checkout.depth() == (200 - 37, 0)


def test_a_dry_run_in_processes_lists_what_one_process_lists(
    fast: MotoServer, checkout: Family, tmp_path: Path
) -> None:
    """Planned keys are shared: a copy in another process's batch is still a duplicate."""
    dead = tasks(120, seed=5)
    fill(checkout, [*dead, *dead[:40]])
    one = ok_json(redrive(fast, "move", "checkout", "--json", timeout=120))
    two = ok_json(redrive(fast, "move", "checkout", "--json", "--processes", "2", "--workers", "2"))
    for data in (one, two):
        assert (data["moved"], data["duplicates_to_delete"]) == (120, 40), data
    assert one["by_task"] == two["by_task"]
    assert checkout.depth() == (160, 0), "a dry run changes nothing"
    limited = ok_json(
        redrive(fast, "move", "checkout", "--json", "--processes", "2", "--limit", "37")
    )
    assert limited["moved"] == 37


def run_info(ledger: Path) -> list[dict[str, Any]]:
    if not ledger.exists():
        return []
    with (
        contextlib.closing(sqlite3.connect(ledger, timeout=60)) as conn,
        contextlib.suppress(sqlite3.OperationalError),
    ):
        rows = conn.execute("SELECT run_id, info FROM runs").fetchall()
        return [{"run_id": r, **json.loads(i)} for r, i in rows]
    return []


def start_move_in_two(fast: MotoServer, ledger: Path, out: Path) -> subprocess.Popen[str]:
    """A move in two processes, slowed by --rate so that a test can act while it runs."""
    return start_redrive(
        fast, *MOVE, "--ledger", str(ledger), "--processes", "2", "--rate", "40", out=out
    )


def wait_for_both_children(
    ledger: Path, then: Callable[[], bool], what: str, every: float = 0.05
) -> None:
    """Until the ledger records both children's runs and ``then`` holds."""
    wait_for(
        lambda: len([r for r in run_info(ledger) if r.get("parent")]) == 2 and then(),
        timeout=60,
        every=every,
        what=what,
    )


def claimed_by_run(ledger: Path) -> Counter[str]:
    with contextlib.closing(sqlite3.connect(ledger, timeout=60)) as conn:
        rows = conn.execute(
            "SELECT run_id, count(*) FROM keys WHERE state = 'claimed' GROUP BY run_id"
        ).fetchall()
    return Counter({str(r): int(n) for r, n in rows})


def finished_with_a_killed_child(
    parent: subprocess.Popen[str], out: Path, points: KillPoints
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Wait for a run whose kill point SIGKILLs one of its children; check the victim was
    the parent's child, the run exited 3 without a traceback and reports that child died by
    SIGKILL; return the report and that child's entry."""
    try:
        code, stdout, stderr = finished(parent, out, timeout=120)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
    victim = points.note()
    assert victim is not None and victim["ppid"] == parent.pid, victim
    assert "Traceback" not in stderr, stderr
    assert code == 3, (code, stdout, stderr)
    report = json.loads(stdout)
    [died] = [c for c in report["children"] if c["outcome"] == "died"]
    assert died["how"] == "killed by SIGKILL" and died["pid"] == victim["pid"]
    return report, died


def test_a_child_sigkilled_mid_run_leaves_at_most_its_batches_in_doubt_and_a_rerun_resumes(
    distant: MotoServer, tmp_path: Path
) -> None:
    fast = distant
    checkout = make_family(fast.client(), "onion-checkout")
    dead = tasks(400, seed=99)
    seed_dlq(checkout, dead)
    sent = by_body(dead)
    ledger = tmp_path / "ledger.sqlite3"
    workers = 2
    args = ("--ledger", str(ledger), "--processes", "2", "--workers", str(workers))
    # SIGKILL the first child to pass its third send (SQS answered, the ledger has not
    # recorded it): the in-doubt window. Of its two workers, the one with two of those sends
    # has recorded its first batch: the child has sent some too, which must be counted
    # (issue 22).
    points = KillPoints(tmp_path / "kill", At("move.sent", nth=3))
    parent = start_redrive(fast, *MOVE, *args, "--lease", "3", out=tmp_path / "k", points=points)
    report, died = finished_with_a_killed_child(parent, tmp_path / "k", points)
    assert died["run_id"] in {r["run_id"] for r in run_info(ledger) if r["pid"] == died["pid"]}
    [other] = [c for c in report["children"] if c["outcome"] != "died"]
    assert other["outcome"] in ("completed", "interrupted")
    # The batch it was killed in, and at most one more of its other worker: claimed,
    # unrecorded.
    assert 10 <= died["in_doubt"] <= 10 * workers, died
    # The summary adds up (issue 22): the killed child's sends counted from the ledger, in
    # the total and per task; no more matched than scanned.
    run_id = report["run_id"]
    sent_by = sent_by_run(ledger)
    assert report["moved"] == sum(n for r, n in sent_by.items() if r.startswith(f"{run_id}."))
    assert died["moved"] == sent_by[died["run_id"]] > 0
    assert sum(report["by_task"].values()) == report["moved"]
    assert sum(t["moved"] for t in report["tasks"].values()) == report["moved"]
    assert report["scanned"] >= report["matched"] >= report["moved"] + report["in_doubt"]
    # The run's record (the audit trail) holds the same counts and names both children.
    audit = ok_json(redrive(fast, "audit", "--ledger", str(ledger), "--json"))
    [run] = [r for r in audit["runs"] if r["run_id"] == run_id]
    assert (run["counts"]["moved"], run["counts"]["in_doubt"]) == (
        report["moved"],
        report["in_doubt"],
    )
    assert sorted(c["outcome"] for c in run["info"]["children"]) == sorted(
        c["outcome"] for c in report["children"]
    )
    assert claimed_by_run(ledger) == Counter({died["run_id"]: died["in_doubt"]})
    assert report["in_doubt"] >= died["in_doubt"]
    listed = {m["key"] for m in report["in_doubt_messages"]}
    assert len(listed) >= died["in_doubt"]

    # The killed child's holds run out within its lease; the rerun resumes and holds the
    # in-doubt messages, listed, never resent.
    wait_for(lambda: checkout.depth()[1] == 0, timeout=90, every=0.2, what="the leases")
    rerun = redrive(fast, *MOVE, *args, timeout=120)
    held = ok_json(rerun, 3)
    assert held["in_doubt"] == died["in_doubt"] == len(held["in_doubt_messages"])
    left = dlq_messages(checkout)
    assert set(left) == {m["message_id"] for m in held["in_doubt_messages"]}
    # The killed run's in-doubt rows name each message's task id (its key names it).
    for row in report["in_doubt_messages"]:
        assert row["task_id"] == sent[left[row["message_id"]]].ident, row
    got = arrivals(checkout, sent)
    in_doubt = {sent[left[m]].ident for m in left}
    assert {d.ident for d in dead if d.ident not in in_doubt and got[d.ident] != 1} == set()
    assert all(got[i] <= 1 for i in in_doubt)
    before = Counter(got)

    # Resolved as the README says (--in-doubt resend): each arrives once more, no other.
    resent = ok_json(redrive(fast, *MOVE, *args, "--in-doubt", "resend", timeout=120))
    assert resent["moved"] == len(in_doubt) and resent["in_doubt"] == 0
    after = arrivals(checkout, sent)
    assert after == Counter({i: 1 for i in in_doubt})
    got += after
    assert {d.ident for d in dead if got[d.ident] == 0} == set(), "nothing lost"
    for ident in in_doubt:
        assert got[ident] == before[ident] + 1 <= 2
    assert checkout.depth() == (0, 0)


def sent_by_run(ledger: Path) -> Counter[str]:
    """Keys sent (or sent and done) per run id."""
    with contextlib.closing(sqlite3.connect(ledger, timeout=5)) as conn:
        rows = conn.execute(
            "SELECT run_id, count(*) FROM keys WHERE state IN ('sent', 'done') GROUP BY run_id"
        ).fetchall()
    return Counter({str(r): int(n) for r, n in rows})


def test_a_double_ctrl_c_still_records_the_runs_counts_and_children(
    fast: MotoServer, checkout: Family, tmp_path: Path
) -> None:
    """Issue 22: after a second Ctrl-C the audit said ``counts: {}``, ``children: []`` while
    keys had moved. The children abort as one process does and report what they did; the
    parent records it."""
    dead = tasks(200, seed=23)
    fill(checkout, dead)
    ledger = tmp_path / "ledger.sqlite3"
    out, err = tmp_path / "run.out", tmp_path / "run.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        # --rate 8 shared by both: a batch in flight takes seconds to send, so the second
        # Ctrl-C comes while the first is still being honoured, as an impatient operator's.
        run = subprocess.Popen(
            [*REDRIVE, *MOVE, "--ledger", str(ledger), "--processes", "2", "--rate", "8"],
            env={**fast.env(), "PYTHONUNBUFFERED": "1"},
            cwd=ROOT,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        wait_for_both_children(
            ledger, lambda: ledger_states(ledger)["done"] >= 10, "both processes moving"
        )
        os.killpg(run.pid, signal.SIGINT)
        wait_for(lambda: "stopping" in err.read_text(), timeout=30, what="the first Ctrl-C heard")
        os.killpg(run.pid, signal.SIGINT)
        code = run.wait(60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(10)
    assert code == 130 and "Traceback" not in err.read_text(), (code, err.read_text())
    [parent] = ok_json(redrive(fast, "audit", "--ledger", str(ledger), "--json"))["runs"]
    run_id = parent["run_id"]
    children = parent["info"]["children"]
    assert [c["run_id"] for c in children] == [f"{run_id}.1", f"{run_id}.2"], parent
    # What the children recorded of themselves, summed; never more than the ledger sent.
    own = sum(recorded_counts(ledger, c["run_id"]).get("moved", 0) for c in children)
    sent = sum(n for r, n in sent_by_run(ledger).items() if r.startswith(f"{run_id}."))
    assert 0 < parent["counts"]["moved"] == own <= sent, (parent["counts"], own, sent)
    assert parent["counts"]["matched"] >= parent["counts"]["moved"]


def recorded_counts(ledger: Path, run_id: str) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(ledger, timeout=5)) as conn:
        [(counts,)] = conn.execute("SELECT counts FROM runs WHERE run_id = ?", (run_id,))
    return dict(json.loads(counts))


def test_children_stop_cleanly_when_the_parent_is_sigkilled(
    fast: MotoServer, checkout: Family, tmp_path: Path
) -> None:
    dead = tasks(300, seed=3)
    fill(checkout, dead)
    ledger = tmp_path / "ledger.sqlite3"
    # Each child stops itself at its second deletion (the first there takes the first
    # rule, the other the second at its third): both mid-run when the parent is killed.
    points = KillPoints(
        tmp_path / "kill",
        At("move.deleted", nth=2, do="stop"),
        At("move.deleted", nth=3, do="stop"),
    )
    parent = start_redrive(
        fast, *MOVE, "--ledger", str(ledger), "--processes", "2", out=tmp_path / "p", points=points
    )
    try:
        stopped = [points.wait_for_note(0)["pid"], points.wait_for_note(1)["pid"]]
        for pid in stopped:
            wait_until_stopped(pid)
        children = [r for r in run_info(ledger) if r.get("parent")]
        assert sorted(c["pid"] for c in children) == sorted(stopped)
        parent.send_signal(signal.SIGKILL)
        assert parent.wait(10) == -signal.SIGKILL
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A zombie (its parent is dead, init reaps it) counts as gone.
        with contextlib.suppress(OSError):
            return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
        return True

    # A bound for a hang: children that outlive their parent for good.
    wait_for(lambda: all(gone(c["pid"]) for c in children), timeout=90, what="children end")
    # They ended their runs as interrupted: finished the batch in flight, nothing claimed.
    with contextlib.closing(sqlite3.connect(ledger)) as conn:
        outcomes = dict(conn.execute("SELECT run_id, outcome FROM runs").fetchall())
    assert [outcomes[c["run_id"]] for c in children] == ["interrupted", "interrupted"]
    assert ledger_states(ledger)["claimed"] == 0
    # A rerun moves the rest: each task once.
    wait_for(lambda: checkout.depth()[1] == 0, timeout=90, every=0.2, what="holds given back")
    ok_json(redrive(fast, *MOVE, "--ledger", str(ledger), "--processes", "2", timeout=120))
    got = arrivals(checkout, by_body(dead))
    assert got == Counter({d.ident: 1 for d in dead})


def test_purge_in_two_processes_archives_each_message_once_then_deletes_it(
    fast: MotoServer, checkout: Family, tmp_path: Path
) -> None:
    from redrive.archive import read_records

    dead = tasks(250, seed=8)
    fill(checkout, dead)
    archive = tmp_path / "purged.jsonl.gz"
    ledger = tmp_path / "ledger.sqlite3"
    common = ("--archive", str(archive), "--processes", "2", "--workers", "2", "--json")
    dry = ok_json(redrive(fast, "purge", "checkout", *common, "--limit", "37", timeout=120))
    assert (dry["matched"], dry["purged"]) == (37, 0) and checkout.depth() == (250, 0)
    snapshot = tmp_path / "snapshot.jsonl.gz"
    copied = ok_json(
        redrive(
            fast,
            "archive",
            "checkout",
            "--archive",
            str(snapshot),
            "--processes",
            "2",
            "--json",
            timeout=120,
        )
    )
    assert (copied["archived"], copied["purged"]) == (250, 0) and checkout.depth() == (250, 0)
    snapped = Counter(r.body for where in copied["archives"] for r in read_records(where))
    assert snapped == Counter(d.body for d in dead), "a snapshot of each message, once"
    data = ok_json(
        redrive(
            fast,
            "purge",
            "checkout",
            *common,
            "--execute",
            "--yes",
            "--ledger",
            str(ledger),
            timeout=120,
        )
    )
    assert (data["archived"], data["purged"], data["failed"]) == (250, 250, 0)
    # Each process archives to its own file beside the one named; one that archived nothing
    # (its sibling was quicker to every message) leaves none behind, as one process does.
    archives = [Path(a).resolve() for a in data["archives"]]
    assert archives and set(archives) <= {
        tmp_path / "purged.p1.jsonl.gz",
        tmp_path / "purged.p2.jsonl.gz",
    }
    assert {p.name for p in tmp_path.glob("purged*")} == {p.name for p in archives}
    bodies = Counter(r.body for where in data["archives"] for r in read_records(where))
    assert bodies == Counter(d.body for d in dead), "each message archived once"
    assert checkout.depth() == (0, 0)
    [run] = ok_json(redrive(fast, "audit", "--ledger", str(ledger), "--json"))["runs"]
    assert run["counts"]["purged"] == 250


def test_a_purge_in_processes_names_every_part_and_replay_takes_the_name_given(
    fast: MotoServer, checkout: Family, tmp_path: Path
) -> None:
    """Issue 22: the summary named one archive of two (``pp.p1.jsonl.gz``), and ``replay
    pp.jsonl.gz`` said ``no archive at`` without a word of its parts."""
    dead = tasks(120, seed=12)
    fill(checkout, dead)
    archive = tmp_path / "pp.jsonl.gz"
    purge = ("purge", "checkout", "--archive", str(archive), "--processes", "2", "--workers", "2")
    dry = ok_json(redrive(fast, *purge, "--json", timeout=120))
    assert dry["archive"] == str(archive)
    assert sorted(dry["archives"]) == [str(tmp_path / f"pp.p{n}.jsonl.gz") for n in (1, 2)]
    ledger = ("--ledger", str(tmp_path / "ledger.sqlite3"))
    done = redrive(fast, *purge, "--execute", "--yes", *ledger, timeout=120)
    assert done.returncode == 0, done.stderr
    parts = sorted(tmp_path.glob("pp.p*.jsonl.gz"))
    assert parts and checkout.depth() == (0, 0)
    for part in parts:
        assert str(part) in done.stdout.split("\n\n")[0], done.stdout  # in the summary itself
    assert f"redrive replay {archive}" in done.stdout
    replay = ("replay", str(archive), "--to", "onion-checkout", "--json", "--processes", "2")
    data = ok_json(redrive(fast, *replay, timeout=120))
    assert (data["replayed"], data["scanned"], data["damaged"]) == (120, 120, None), data
    missing = redrive(fast, "replay", str(tmp_path / "nope.jsonl.gz"), "--to", "onion-checkout")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert "no archive at" in missing.stderr and "nope.p1.jsonl.gz" in missing.stderr


def test_a_plan_made_and_applied_in_processes_moves_exactly_its_messages(
    fast: MotoServer, checkout: Family, tmp_path: Path
) -> None:
    dead = tasks(150, seed=21)
    fill(checkout, dead)
    plan = tmp_path / "plan.json"
    procs = ("--processes", "2", "--workers", "2")
    made = redrive(fast, "move", "checkout", "--task", CAPTURE, "--plan-out", str(plan), *procs)
    assert made.returncode == 0, made.stderr
    items = json.loads(plan.read_text())["items"]
    captures = [d for d in dead if d.task == CAPTURE]
    assert len(items) == len({i["message_id"] for i in items}) == len(captures)
    ledger = tmp_path / "ledger.sqlite3"
    apply = ("apply", str(plan), "--execute", "--yes", "--json", "--ledger", str(ledger), *procs)
    data = ok_json(redrive(fast, *apply, timeout=120))
    assert (data["moved"], data["planned"], data["gone"]) == (len(captures), len(captures), 0)
    assert data["processes"] == 2
    got = arrivals(checkout, by_body(dead))
    assert got == Counter({d.ident: 1 for d in captures})
    assert checkout.depth() == (len(dead) - len(captures), 0)
    again = ok_json(redrive(fast, *apply, timeout=120))
    assert (again["moved"], again["gone"]) == (0, len(captures)), "twice does nothing"


def test_replay_in_processes_sends_each_archived_task_once(
    fast: MotoServer, checkout: Family, tmp_path: Path
) -> None:
    dead = tasks(200, seed=31)
    fill(checkout, [*dead, *dead[:20]])  # 20 second copies: one task, one send
    archive = tmp_path / "dlq.jsonl.gz"
    purged = ok_json(
        redrive(
            fast, "purge", "checkout", "--archive", str(archive), "--execute", "--yes", "--json"
        )
    )
    assert purged["purged"] == 220
    replay = ("replay", str(archive), "--to", "onion-checkout", "--json")
    procs = ("--processes", "2", "--workers", "2")
    one = ok_json(redrive(fast, *replay, timeout=120))
    two = ok_json(redrive(fast, *replay, *procs, timeout=120))
    for dry in (one, two):
        assert (dry["replayed"], dry["already_sent"], dry["scanned"]) == (200, 20, 220), dry
    ledger = tmp_path / "ledger.sqlite3"
    done = ok_json(
        redrive(fast, *replay, *procs, "--execute", "--yes", "--ledger", str(ledger), timeout=120)
    )
    assert (done["replayed"], done["processes"]) == (200, 2)
    assert arrivals(checkout, by_body(dead)) == Counter({d.ident: 1 for d in dead})
    again = ok_json(
        redrive(fast, *replay, *procs, "--execute", "--yes", "--ledger", str(ledger), timeout=120)
    )
    assert (again["replayed"], again["already_sent"]) == (0, 220), "twice sends nothing"


def test_copies_in_a_siblings_batch_are_never_sent_twice_nor_called_in_doubt(
    fast: MotoServer, checkout: Family, tmp_path: Path
) -> None:
    """Each batch of originals is followed by a batch of their copies, so the two processes
    receive a copy while its twin's batch is in flight in the other one: the sibling's live
    claim decides (a duplicate once sent, else busy for now), never a send, never in doubt."""
    dead = tasks(100, seed=41)
    order = [m for start in range(0, 100, 10) for m in (*dead[start : start + 10],) * 2]
    fill(checkout, order)
    ledger = tmp_path / "ledger.sqlite3"
    args = ("--ledger", str(ledger), "--processes", "2")
    first = ok_json(redrive(fast, *MOVE, *args, timeout=120))
    busy = first["skipped_by_reason"].get("claimed-by-another-run", 0)
    assert (first["moved"], first["in_doubt"], first["failed"]) == (100, 0, 0)
    assert first["duplicates_deleted"] + busy == 100, first
    rerun = ok_json(redrive(fast, *MOVE, *args, timeout=120))
    assert (rerun["moved"], rerun["duplicates_deleted"]) == (0, busy)
    assert arrivals(checkout, by_body(dead)) == Counter({d.ident: 1 for d in dead})
    assert checkout.depth() == (0, 0)


def test_ctrl_c_to_the_process_group_stops_every_process_cleanly(
    fast: MotoServer, checkout: Family, tmp_path: Path
) -> None:
    """A terminal's Ctrl-C reaches every process of the group: the children ignore it, the
    parent tells them to finish the batch in flight and give back what they hold."""
    dead = tasks(300, seed=13)
    fill(checkout, dead)
    ledger = tmp_path / "ledger.sqlite3"
    out, err = tmp_path / "run.out", tmp_path / "run.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        run = subprocess.Popen(
            [*REDRIVE, *MOVE, "--ledger", str(ledger), "--processes", "2", "--rate", "40"],
            env={**fast.env(), "PYTHONUNBUFFERED": "1"},
            cwd=ROOT,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, as a terminal's job is
        )
    try:
        wait_for_both_children(
            ledger, lambda: ledger_states(ledger)["done"] >= 20, "both processes moving"
        )
        os.killpg(run.pid, signal.SIGINT)
        code = run.wait(60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(10)
    stderr_text = err.read_text()
    assert code == 130, (code, stderr_text)
    assert "Traceback" not in stderr_text and "KeyboardInterrupt" not in stderr_text
    data = json.loads(out.read_text())
    assert data["interrupted"] is True
    assert [c["outcome"] for c in data["children"]] == ["interrupted", "interrupted"]
    assert ledger_states(ledger)["claimed"] == 0, "every batch in flight was finished"
    assert checkout.depth() == (300 - data["moved"], 0), "what they held was given back"
    [run] = ok_json(redrive(fast, "audit", "--ledger", str(ledger), "--json"))["runs"]
    assert run["counts"]["moved"] == data["moved"] and len(run["info"]["children"]) == 2
    ok_json(redrive(fast, *MOVE, "--ledger", str(ledger), "--processes", "2", timeout=120))
    assert arrivals(checkout, by_body(dead)) == Counter({d.ident: 1 for d in dead})


def test_with_a_celery_app_each_process_routes_and_gates_as_one_does(
    fast: MotoServer, tmp_path: Path
) -> None:
    """The app cannot cross a process boundary: each process loads it again, and routes
    each task to its queue now and keeps the tasks the app does not register."""
    client = fast.client()
    default = make_family(client, "onion")
    checkout = make_family(client, "onion-checkout")
    moved = [celery(CAPTURE) for _ in range(60)] + [celery(REFUND) for _ in range(40)]
    gone = [celery("apps.inventory.tasks.resync_stock") for _ in range(12)]
    fill(default, [*moved, *gone])
    ledger = tmp_path / "ledger.sqlite3"
    app = ("--celery-app", "redrive.sandbox.celery_app:app")
    move = ("move", "default", "--json", "--processes", "2", "--workers", "2")
    dry = ok_json(redrive(fast, *app, *move, timeout=120))
    data = ok_json(
        redrive(fast, *app, *move, "--execute", "--yes", "--ledger", str(ledger), timeout=120)
    )
    for result in (dry, data):
        assert result["moved"] == 100 and result["skipped_by_reason"] == {"unregistered": 12}
        assert result["tasks"][CAPTURE]["targets"] == {"onion-checkout": 60}
    assert arrivals(checkout, by_body(moved)) == Counter({d.ident: 1 for d in moved})
    assert default.depth() == (12, 0), "the unregistered tasks stay"


def test_inspect_in_processes_counts_what_one_process_counts(
    fast: MotoServer, checkout: Family
) -> None:
    """Each message counted once (the scans end together: none receives again what another
    held), in the same groups with the same counts, and the DLQ left as it was."""
    dead = tasks(300, seed=57)
    fill(checkout, [*dead, *dead[:30]])

    def stable(data: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [
            (g["task"], g["count"], g["oldest"], g["newest"], g["protocols"], g["expired"])
            for g in data["groups"]
        ]

    one = ok_json(redrive(fast, "inspect", "checkout", "--json", timeout=120))
    two = ok_json(
        redrive(
            fast,
            "inspect",
            "checkout",
            "--json",
            "--processes",
            "2",
            "--workers",
            "2",
            timeout=120,
        )
    )
    assert one["total"] == two["total"] == 330
    assert stable(one) == stable(two)
    for group in two["groups"]:
        assert sum(group["timeline"]["counts"]) == group["count"]
    assert checkout.depth() == (330, 0)
    where = ("inspect", "checkout", "--json", "--processes", "2", "--where", f"task == '{REFUND}'")
    refunds = ok_json(redrive(fast, *where, timeout=120))
    assert [g["task"] for g in refunds["groups"]] == [REFUND]
    assert refunds["total"] == sum(1 for d in [*dead, *dead[:30]] if d.task == REFUND)
    limited = ok_json(
        redrive(fast, "inspect", "checkout", "--json", "--processes", "2", "--limit", "37")
    )
    assert limited["total"] == 37


def test_a_process_archive_that_exists_refuses_the_purge_before_anything_changes(
    fast: MotoServer, checkout: Family, tmp_path: Path
) -> None:
    dead = tasks(30, seed=2)
    fill(checkout, dead)
    (tmp_path / "purged.p2.jsonl.gz").write_bytes(b"an earlier run's evidence")
    named = str(tmp_path / "purged.jsonl.gz")
    purge = ("purge", "checkout", "--archive", named, "--processes", "2", "--execute", "--yes")
    result = redrive(fast, *purge, timeout=60)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "purged.p2.jsonl.gz" in lines[0], lines
    assert "Traceback" not in result.stderr
    assert checkout.depth() == (30, 0) and not (tmp_path / "purged.p1.jsonl.gz").exists()
    # The name given stands for the parts (replay takes it): an earlier archive of that
    # name would make it stand for something else.
    (tmp_path / "purged.p2.jsonl.gz").unlink()
    (tmp_path / "purged.jsonl.gz").write_bytes(b"an earlier one-process archive")
    again = redrive(fast, *purge, timeout=60)
    assert again.returncode == 1 and "purged.jsonl.gz already exists" in again.stderr, again
    assert checkout.depth() == (30, 0) and not (tmp_path / "purged.p1.jsonl.gz").exists()


def test_a_purge_process_sigkilled_mid_run_loses_nothing(
    distant: MotoServer, tmp_path: Path
) -> None:
    """Every message is in an archive, in the DLQ, or both: the killed process's archive
    (its unfinished last batch is not damage) is listed with the others."""
    from redrive.archive import read_records

    fast = distant
    checkout = make_family(fast.client(), "onion-checkout")
    dead = tasks(800, seed=77)
    seed_dlq(checkout, dead)
    ledger = tmp_path / "ledger.sqlite3"
    archive = tmp_path / "purged.jsonl.gz"
    args = ("purge", "checkout", "--archive", str(archive), "--execute", "--yes", "--json")
    # The first process to write its third archive batch is killed before deleting it.
    points = KillPoints(tmp_path / "kill", At("purge.archived", nth=3))
    parent = start_redrive(
        fast,
        *args,
        "--ledger",
        str(ledger),
        "--processes",
        "2",
        "--lease",
        "3",
        out=tmp_path / "killed",
        points=points,
    )
    report, died = finished_with_a_killed_child(parent, tmp_path / "killed", points)
    part = tmp_path / f"purged.p{died['process']}.jsonl.gz"
    assert str(part) in [str(Path(a)) for a in report["archives"]]
    # Its third batch archived and never deleted: in its archive and in the DLQ too.
    assert sum(1 for _ in read_records(str(part), on_problem=lambda _: None)) >= 30

    def archived() -> Counter[str]:
        got: Counter[str] = Counter()
        for where in tmp_path.glob("*.jsonl.gz"):
            got.update(r.body for r in read_records(str(where), on_problem=lambda _: None))
        return got

    # What the killed process held (its batch in flight) comes back when its lease ends.
    wait_for(lambda: checkout.depth()[1] == 0, timeout=90, every=0.2, what="the leases")
    in_dlq = set(dlq_messages(checkout).values())
    assert {d.body for d in dead} <= set(archived()) | in_dlq, "nothing lost"
    again = tmp_path / "rest.jsonl.gz"
    rest = ok_json(
        redrive(
            fast,
            "purge",
            "checkout",
            "--archive",
            str(again),
            "--execute",
            "--yes",
            "--json",
            timeout=120,
        )
    )
    assert rest["purged"] == len(in_dlq)
    assert set(archived()) == {d.body for d in dead} and checkout.depth() == (0, 0)


def test_with_a_result_backend_each_process_opens_its_own_and_skips_what_succeeded(
    fast: MotoServer, checkout: Family, tmp_path: Path
) -> None:
    """A result backend cannot cross a process boundary: each process opens it again (a
    Celery database backend on SQLite here, written as a worker would)."""
    pytest.importorskip("sqlalchemy")
    from celery import Celery

    dead = tasks(60, seed=61)
    fill(checkout, dead)
    url = f"db+sqlite:///{tmp_path / 'results.sqlite'}"
    app = Celery("writer", backend=url, set_as_current=False)
    succeeded = dead[:7]
    for job in succeeded:
        app.backend.store_result(job.ident, 42, "SUCCESS")
    app.backend.ResultSession().close()
    ledger = tmp_path / "ledger.sqlite3"
    data = ok_json(
        redrive(
            fast,
            "--result-backend",
            url,
            *MOVE,
            "--ledger",
            str(ledger),
            "--processes",
            "2",
            timeout=120,
        )
    )
    assert data["skipped_by_reason"] == {"already-succeeded": 7} and data["moved"] == 53
    moved = [d for d in dead if d not in succeeded]
    assert arrivals(checkout, by_body(dead)) == Counter({d.ident: 1 for d in moved})


def test_an_error_in_the_processes_is_one_line_and_exit_1(
    fast: MotoServer, checkout: Family, tmp_path: Path
) -> None:
    """The DLQ deleted under a running move: its processes fail, the parent stops the others
    and says what went wrong in one line (as one process does), no traceback."""
    fill(checkout, tasks(200, seed=71))
    ledger = tmp_path / "ledger.sqlite3"
    run = start_move_in_two(fast, ledger, tmp_path / "failing")
    try:
        wait_for_both_children(
            ledger, lambda: ledger_states(ledger)["done"] >= 10, "both processes moving"
        )
        checkout.client.delete_queue(QueueUrl=checkout.dlq_url)
        code, stdout, stderr = finished(run, tmp_path / "failing", timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
    assert code == 1, (code, stdout, stderr)
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "onion-checkout-dlq" in errors[0], stderr
    assert ledger_states(ledger)["claimed"] == 0


def test_a_child_stopped_by_an_error_still_counts_in_the_summary(
    fast: MotoServer, checkout: Family, tmp_path: Path
) -> None:
    """Issue 22, 11, with --processes: the child whose result backend answers with a record
    it cannot read stops with that error; what every child had done by then is the summary,
    the audit's counts, and what arrived. The unreadable record is in a real Redis."""
    import redis
    from result_backends import start_redis

    dead = tasks(120, seed=23)
    seed_dlq(checkout, dead)
    directory = tmp_path / "redis"
    directory.mkdir()
    server = start_redis(directory)
    try:
        client = redis.Redis(host="127.0.0.1", port=server.port)
        client.set(f"celery-task-meta-{dead[60].ident}", b"\x00 not a Celery record")
        client.close()
        ledger = tmp_path / "ledger.sqlite3"
        args = [*MOVE, "--ledger", str(ledger), "--processes", "2", "--workers", "1"]
        result = redrive(fast, *args, "--result-backend", server.url(), timeout=120)
    finally:
        server.stop()

    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and f"record of task {dead[60].ident} cannot be read" in errors[0]
    data = json.loads(result.stdout)
    assert data["processes"] == 2 and "cannot be read" in data["error"]
    assert "failed" in [c["outcome"] for c in data["children"]], data["children"]
    got = arrivals(checkout, by_body(dead))
    assert set(got.values()) <= {1}, "no task twice"
    assert data["moved"] == sum(got.values()) and data["in_doubt"] == 0
    assert dead[60].ident not in got
    assert ledger_states(ledger)["sent"] + ledger_states(ledger)["done"] == data["moved"]
    audit = ok_json(redrive(fast, "audit", "--ledger", str(ledger), "--json"))
    [run] = audit["runs"]
    assert run["outcome"] == "failed" and run["counts"]["moved"] == data["moved"]
    assert checkout.depth() == (len(dead) - data["moved"], 0), "what was held is given back"
