"""The SQLite ledger's group commit: concurrent callers' writes share transactions, each
caller gets its own answer, only after the commit; failures, close and Ctrl-C while waiting;
threads and processes racing for the same keys (the contract itself runs on both paths in
test_ledger_contract.py)."""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from test_ledger_contract import claims

from redrive.errors import LedgerError
from redrive.ledger import ClaimResult, KeyState, SqliteLedger, group_commit

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite3"


@contextmanager
def write_lock_held(path: Path) -> Iterator[Callable[[], None]]:
    """Another connection (as another process would) holds the file's write lock until the
    returned function is called (or the block ends)."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            other.execute("ROLLBACK")

    try:
        yield release
    finally:
        release()
        other.close()


def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def queued(led: SqliteLedger) -> int:
    assert led._writer is not None
    return led._writer.queued()


class Calls:
    """Calls made each in a thread of its own; their answers or errors, by name."""

    def __init__(self) -> None:
        self.results: dict[str, Any] = {}
        self.threads: list[threading.Thread] = []

    def start(self, name: str, call: Callable[[], Any]) -> None:
        def run() -> None:
            try:
                self.results[name] = call()
            except Exception as e:  # the answer under test
                self.results[name] = e

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)

    def join(self, timeout: float = 30.0) -> None:
        for thread in self.threads:
            thread.join(timeout)
            assert not thread.is_alive()


def busy(led: SqliteLedger) -> bool:
    """A transaction is in flight (taking the lock, or holding it)."""
    assert led._writer is not None
    return led._writer.in_flight()


def ctrl_c_once_waiting(thread_id: int, function: str) -> None:
    """A real SIGINT to ``thread_id`` once it is inside ``function`` (its wait for its turn),
    not after a fixed delay, which a busy machine can outlast before the wait begins."""

    def inside() -> bool:
        frame = sys._current_frames().get(thread_id)
        while frame is not None:
            if frame.f_code.co_name == function:
                return True
            frame = frame.f_back
        return False

    wait_until(inside)
    signal.pthread_kill(thread_id, signal.SIGINT)


def writer_thread(led: SqliteLedger) -> threading.Thread | None:
    assert led._writer is not None
    return led._writer._thread


@contextmanager
def held_group(path: Path, led: SqliteLedger, calls: Calls, n: int) -> Iterator[None]:
    """Make the ``n`` calls started inside the block share one transaction: another
    connection holds the write lock while a first request (a heartbeat of run A) waits for
    it in the writer, and the block's calls queue behind it; leaving the block releases the
    lock once all ``n`` are queued."""
    with write_lock_held(path) as release:
        calls.start("first", lambda: led.heartbeat("A", lease_until=0))
        wait_until(lambda: busy(led))  # it waits for the lock, in flight
        yield
        wait_until(lambda: queued(led) == n)
        release()
    calls.join()


# ----------------------------------------------------------------------------- groups


def test_queued_callers_share_one_transaction_and_each_gets_its_own_answer(path: Path) -> None:
    led = SqliteLedger(path)
    for run_id in "ABC":
        led.start_run(run_id, command="move", info={})
    before = led.group_stats()
    assert before is not None
    calls = Calls()
    with held_group(path, led, calls, 3):
        # B's claim arrives before C's: of the key both want, B wins, as if serial.
        calls.start("B", lambda: led.claim_many("B", claims("b1", "both")))
        wait_until(lambda: queued(led) == 1)
        calls.start("C", lambda: led.claim_many("C", claims("both", "c1")))
        wait_until(lambda: queued(led) == 2)
        calls.start("sent", lambda: led.mark_sent_many("A", {"nothing": "x"}))
    after = led.group_stats()
    assert after is not None
    # the heartbeat alone, then the three queued behind it together
    assert after["groups"] - before["groups"] == 2
    assert after["requests"] - before["requests"] == 4

    b, c = calls.results["B"], calls.results["C"]
    assert isinstance(b, ClaimResult) and isinstance(c, ClaimResult)
    assert b.won == {"b1", "both"}
    assert c.won == {"c1"}
    assert c["both"].run_id == "B" and c["both"].state is KeyState.CLAIMED
    assert calls.results["sent"] is None and calls.results["first"] is None
    led.close()
    with SqliteLedger(path, group_commit=False) as plain:
        got = plain.get_many(["b1", "both", "c1"])
        assert {k: e.run_id for k, e in got.items()} == {"b1": "B", "both": "B", "c1": "C"}


def test_a_transaction_carries_at_most_max_group_requests(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(group_commit, "MAX_GROUP", 2)
    led = SqliteLedger(path)
    led.start_run("A", command="move", info={})
    before = led.group_stats()
    assert before is not None
    calls = Calls()
    with held_group(path, led, calls, 5):
        for i in range(5):
            calls.start(f"claim{i}", functools.partial(led.claim_many, "A", claims(f"k{i}")))
            wait_until(lambda n=i + 1: queued(led) == n)
    after = led.group_stats()
    assert after is not None
    # the heartbeat alone, then the five queued behind it two at a time: 2, 2, 1
    assert after["requests"] - before["requests"] == 6
    assert after["groups"] - before["groups"] == 4
    assert all(calls.results[f"claim{i}"].won == {f"k{i}"} for i in range(5))
    led.close()


@pytest.mark.parametrize(
    ("with_claim", "synchronous"), [(True, "FULL"), (False, "NORMAL")], ids=["claim", "records"]
)
def test_a_group_is_flushed_when_any_of_its_requests_needs_it(
    path: Path, with_claim: bool, synchronous: str
) -> None:
    """A claim must be on disk before its send: a group holding one commits with
    synchronous=FULL; SENT and DONE records alone commit as they did alone (NORMAL)."""
    led = SqliteLedger(path)
    led.start_run("A", command="move", info={})
    led.claim_many("A", claims("s1", "d1"))
    led.mark_sent_many("A", {"d1": "sqs-d1"})
    assert led._conn is not None
    statements: list[str] = []
    led._conn.set_trace_callback(statements.append)
    calls = Calls()
    with held_group(path, led, calls, 3):
        calls.start("sent", lambda: led.mark_sent_many("A", {"s1": "sqs-s1"}))
        wait_until(lambda: queued(led) == 1)
        if with_claim:
            calls.start("claim", lambda: led.claim_many("A", claims("new")))
        else:
            calls.start("claim", lambda: led.mark_sent_many("A", {"absent": "x"}))
        wait_until(lambda: queued(led) == 2)
        calls.start("done", lambda: led.mark_done_many("A", ["d1"]))
    led._conn.set_trace_callback(None)
    # the last transaction is the group of three: how it began, and what it committed with
    last_begin = max(i for i, s in enumerate(statements) if s == "BEGIN IMMEDIATE")
    before = [s for s in statements[:last_begin] if s.startswith("PRAGMA synchronous")]
    mode = "NORMAL" if before and before[-1] == "PRAGMA synchronous=NORMAL" else "FULL"
    after_commit = statements[statements.index("COMMIT", last_begin) :]
    assert mode == synchronous
    assert ("PRAGMA synchronous=FULL" in after_commit) == (synchronous == "NORMAL")
    assert statements[last_begin:].count("COMMIT") == 1  # one transaction for the three
    assert set(led.get_many(["s1"])) == {"s1"} and led.get_many(["d1"])["d1"].state is KeyState.DONE
    led.close()


def test_a_failing_transaction_fails_every_caller_of_its_group_and_commits_none(
    path: Path,
) -> None:
    led = SqliteLedger(path)
    led.start_run("A", command="move", info={})
    # SQLite rolls the whole transaction back when this fires, as it does on a full disk or
    # an I/O error: the group's transaction is lost, not one request's statements.
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TRIGGER lose_all AFTER INSERT ON keys WHEN NEW.key = 'poison'"
            " BEGIN SELECT RAISE(ROLLBACK, 'transaction lost'); END"
        )
    conn.close()
    calls = Calls()
    with held_group(path, led, calls, 3):
        calls.start("ok", lambda: led.claim_many("A", claims("k1", "k2")))
        wait_until(lambda: queued(led) == 1)
        calls.start("poison", lambda: led.claim_many("A", claims("poison")))
        wait_until(lambda: queued(led) == 2)
        calls.start("done", lambda: led.mark_done_many("A", ["k1"]))

    for name, what in (("ok", "claim keys"), ("poison", "claim keys"), ("done", "mark keys done")):
        error = calls.results[name]
        assert isinstance(error, LedgerError), (name, error)
        assert f"{what} failed (transaction lost)" in str(error)
    assert calls.results["first"] is None  # the heartbeat's own group committed
    assert led.get_many(["k1", "k2", "poison"]) == {}
    # The writer goes on: the next call commits.
    assert led.claim_many("A", claims("k1")).won == {"k1"}
    led.close()


def test_a_request_whose_own_statement_fails_does_not_poison_its_group(path: Path) -> None:
    led = SqliteLedger(path)
    led.start_run("A", command="move", info={})
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TRIGGER refuse_one AFTER INSERT ON keys WHEN NEW.key = 'bad'"
            " BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
    conn.close()
    calls = Calls()
    with held_group(path, led, calls, 4):
        calls.start("before", lambda: led.claim_many("A", claims("k1")))
        wait_until(lambda: queued(led) == 1)
        calls.start("bad", lambda: led.claim_many("A", claims("k2", "bad")))
        wait_until(lambda: queued(led) == 2)
        calls.start("again", lambda: led.start_run("A", command="move", info={}))
        wait_until(lambda: queued(led) == 3)
        calls.start("after", lambda: led.claim_many("A", claims("k3")))

    assert calls.results["before"].won == {"k1"}
    assert calls.results["after"].won == {"k3"}
    bad, again = calls.results["bad"], calls.results["again"]
    assert isinstance(bad, LedgerError) and "claim keys failed (refused)" in str(bad)
    assert isinstance(again, LedgerError) and "run A already exists" in str(again)
    # nothing of the failed call stays, not even its statement that succeeded
    assert set(led.get_many(["k1", "k2", "k3", "bad"])) == {"k1", "k3"}
    led.close()


def test_bad_arguments_are_refused_in_the_callers_thread(path: Path) -> None:
    with SqliteLedger(path) as led:
        led.start_run("A", command="move", info={})
        before = led.group_stats()
        with pytest.raises(ValueError, match=r"1\.\.128"):
            led.claim_many("A", claims("ok", "x" * 200))
        with pytest.raises(ValueError, match="outcome"):
            led.end_run("A", outcome="great", counts={})
        assert led.group_stats() == before  # never queued
        assert led.get_many(["ok"]) == {}


def test_many_threads_claiming_overlapping_keys_win_each_key_once(path: Path) -> None:
    keys = [f"k{i}" for i in range(300)]
    with SqliteLedger(path) as led:
        won: dict[str, list[str]] = {}
        answers: dict[str, list[ClaimResult]] = {}

        def worker(run_id: str) -> None:
            led.start_run(run_id, command="move", info={})
            rng = random.Random(run_id)
            batches = [keys[i : i + 10] for i in range(0, len(keys), 10)]
            rng.shuffle(batches)
            results = [led.claim_many(run_id, claims(*b)) for b in batches]
            answers[run_id] = results
            won[run_id] = [k for r in results for k in r.won]

        threads = [threading.Thread(target=worker, args=(f"t{i}",)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = {k: run for run, ks in won.items() for k in ks}
        assert sorted(k for ks in won.values() for k in ks) == sorted(keys)  # each exactly once
        stored = led.get_many(keys)
        assert all(stored[k].run_id == run for k, run in winners.items())
        # every answer agrees with the winner, won or not
        for run_id, results in answers.items():
            for result in results:
                for key, entry in result.items():
                    assert entry.run_id == winners[key]
                    assert (key in result.won) == (winners[key] == run_id)
        stats = led.group_stats()
        assert stats is not None and stats["groups"] < stats["requests"]


# ----------------------------------------------------------------------------- the lock


def test_waits_for_another_process_lock_then_fails_in_one_line(path: Path) -> None:
    # Patient enough for any machine to let go of the lock in time (0.1 s from now).
    patient = SqliteLedger(path, busy_timeout=120)
    patient.start_run("A", command="move", info={})
    with write_lock_held(path) as release:
        threading.Timer(0.1, release).start()
        assert patient.claim_many("A", claims("k1")).won == {"k1"}  # waited, then got it
    patient.close()
    led = SqliteLedger(path, busy_timeout=0.5)
    with write_lock_held(path):
        start = time.monotonic()
        with pytest.raises(LedgerError, match="stayed locked by another process") as e:
            led.claim_many("A", claims("k2"))
        assert 0.4 < time.monotonic() - start < 60
        assert "\n" not in str(e.value) and "claim keys" in str(e.value)
    assert set(led.get_many(["k1", "k2"])) == {"k1"}
    led.close()


def test_close_with_waiters_does_not_hang(path: Path) -> None:
    # The call in flight gives up after its busy timeout: the five below must queue before
    # that (milliseconds; 3 s leaves a loaded machine room).
    led = SqliteLedger(path, busy_timeout=3.0)
    led.start_run("A", command="move", info={})
    calls = Calls()
    with write_lock_held(path):
        calls.start("in flight", lambda: led.claim_many("A", claims("k0")))
        wait_until(lambda: busy(led))
        for i in range(1, 6):
            calls.start(f"queued {i}", functools.partial(led.claim_many, "A", claims(f"k{i}")))
        wait_until(lambda: queued(led) == 5)
        writer = writer_thread(led)  # none: the thread in flight hands over, when done
        start = time.monotonic()
        led.close()  # waits for the group in flight only, which gives up after 3 s
        # A hang bound: that the queued calls never waited is their "is closed" below.
        assert time.monotonic() - start < 60
    calls.join()
    assert "stayed locked" in str(calls.results["in flight"])
    for i in range(1, 6):
        error = calls.results[f"queued {i}"]
        assert isinstance(error, LedgerError) and "is closed" in str(error)
    assert (writer is None or not writer.is_alive()) and writer_thread(led) is None
    with pytest.raises(LedgerError, match="closed"):
        led.claim_many("A", claims("later"))
    with SqliteLedger(path) as again:
        assert again.get_many([f"k{i}" for i in range(6)]) == {}


def test_the_writer_ends_with_close_and_when_idle(path: Path) -> None:
    led = SqliteLedger(path)
    assert led._writer is not None
    led._writer._idle_exit_s = 60
    led.start_run("A", command="move", info={})
    calls = Calls()
    # A worker's request that queues while the main thread commits its own goes to the
    # writer thread, which is started for it.
    with write_lock_held(path) as release:

        def queue_behind_main() -> None:
            wait_until(lambda: busy(led))
            calls.start("worker", lambda: led.claim_many("A", claims("w")))
            wait_until(lambda: queued(led) == 0 and writer_thread(led) is not None)
            release()

        helper = threading.Thread(target=queue_behind_main)
        helper.start()
        assert led.claim_many("A", claims("main")).won == {"main"}
        helper.join()
    calls.join()
    assert calls.results["worker"].won == {"w"}
    first = writer_thread(led)
    assert first is not None
    with led._writer._cond:  # idle from now on: it ends within 50 ms
        led._writer._idle_exit_s = 0.05
        led._writer._cond.notify()
    wait_until(lambda: not first.is_alive())
    assert writer_thread(led) is None
    led.close()
    assert writer_thread(led) is None


def test_ctrl_c_while_waiting_withdraws_the_queued_call_and_leaves_the_writer_working(
    path: Path,
) -> None:
    led = SqliteLedger(path)
    led.start_run("A", command="move", info={})
    calls = Calls()
    with write_lock_held(path) as release:
        calls.start("in flight", lambda: led.heartbeat("A", lease_until=0))
        wait_until(lambda: busy(led))
        # Ctrl-C (a real SIGINT: it wakes a blocked wait, as a terminal's does) reaches the
        # main thread while it waits for its claim's turn.
        main = threading.main_thread().ident
        assert main is not None and threading.current_thread().ident == main
        threading.Thread(target=ctrl_c_once_waiting, args=(main, "_run_from_main")).start()
        with pytest.raises(KeyboardInterrupt):
            led.claim_many("A", claims("interrupted"))
        assert queued(led) == 0  # the main thread waited for its turn, never queued
        release()
        calls.join()
    assert calls.results["in flight"] is None
    assert led.claim_many("A", claims("next")).won == {"next"}
    assert set(led.get_many(["interrupted", "next"])) == {"next"}
    led.close()


def test_a_forked_child_is_told_to_open_the_ledger_again(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child forked with the ledger open has no writer thread (threads do not survive a
    fork) and must not use the parent's connection: an error, never a wait forever."""
    from redrive.ledger import group_commit

    with SqliteLedger(path) as led:
        led.start_run("A", command="move", info={})
        parent = os.getpid()
        monkeypatch.setattr(group_commit, "current_pid", lambda: parent + 1)
        with pytest.raises(LedgerError, match=f"opened by process {parent}, not this one"):
            led.claim_many("A", claims("k"))
        monkeypatch.undo()
        assert led.get_many(["k"]) == {}


# ----------------------------------------------------------------------------- processes

_CLAIMER = textwrap.dedent(
    """
    import json, sys, threading
    from pathlib import Path
    from redrive.ledger import Claim, SqliteLedger

    path, run_id, threads, mode = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    led = SqliteLedger(path)
    led.start_run(run_id, command="move", info={})
    out = threading.Lock()
    print("ready", flush=True)
    sys.stdin.readline()

    def claim(batch):
        result = led.claim_many(run_id, [Claim(k, "t", "m-" + k, "q") for k in batch])
        with out:
            print(json.dumps({"batch": batch, "won": sorted(result.won)}), flush=True)
        return result

    def worker(index):
        if mode == "race":
            import random
            rng = random.Random(run_id + str(index))
            keys = [f"k{i}" for i in range(400)]
            batches = [keys[i : i + 10] for i in range(0, 400, 10)]
            rng.shuffle(batches)
            for batch in batches:
                claim(batch)
        else:  # "forever": new keys until killed
            i = 0
            while True:
                claim([f"{run_id}-{index}-{i}-{j}" for j in range(10)])
                i += 1

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    led.close()
    print("end", flush=True)
    """
)


def claimer(path: Path, run_id: str, threads: int, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CLAIMER, str(path), run_id, str(threads), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


def go(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()


@pytest.mark.e2e
def test_two_processes_of_threads_on_one_file_never_win_a_key_twice(path: Path) -> None:
    SqliteLedger(path).close()
    procs = [claimer(path, f"p{i}", 8, "race") for i in range(2)]
    try:
        go(procs)
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    won_by: dict[str, str] = {}
    for run_id, p, (out, err) in zip(("p0", "p1"), procs, outputs, strict=True):
        assert p.returncode == 0, err
        lines = out.splitlines()
        assert lines[-1] == "end"
        for line in lines[:-1]:
            for key in json.loads(line)["won"]:
                assert key not in won_by, f"{key} won twice"
                won_by[key] = run_id
    assert len(won_by) == 400
    with SqliteLedger(path) as led:
        entries = led.get_many(list(won_by))
        assert all(entries[k].run_id == run for k, run in won_by.items())


@pytest.mark.e2e
def test_a_claim_is_in_the_file_when_claim_many_returns_even_if_killed_at_once(
    path: Path,
) -> None:
    """SIGKILL while 8 threads' claims are queued and in flight: every claim a caller saw
    returned is in the file, and every call is all or nothing (never half its keys)."""
    SqliteLedger(path).close()
    proc = claimer(path, "victim", 8, "forever")
    returned: list[dict[str, Any]] = []
    try:
        go([proc])
        assert proc.stdout is not None
        for _ in range(200):
            returned.append(json.loads(proc.stdout.readline()))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    # Lines written after those we read (before the kill) were returned too.
    returned += [json.loads(line) for line in out.splitlines() if line.endswith("}")]
    with SqliteLedger(path) as led:
        for answer in returned:
            assert answer["won"] == sorted(answer["batch"])
            got = led.get_many(answer["batch"])
            assert sorted(got) == sorted(answer["batch"])
            assert {e.state for e in got.values()} == {KeyState.CLAIMED}
        claimed = led.keys_for_run("victim")
        batches: dict[tuple[str, str], int] = {}
        for entry in claimed:  # keys are victim-THREAD-BATCH-J
            _, thread, batch, _ = entry.key.rsplit("-", 3)
            batches[(thread, batch)] = batches.get((thread, batch), 0) + 1
        assert set(batches.values()) == {10}  # no call half written
        assert len(claimed) >= 10 * len(returned)
