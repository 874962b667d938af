"""``--processes`` (issue 17): what the processes share (redrive.runs.shared: --limit,
--rate, a dry run's planned keys, the end of their scans), and one result merged from theirs
(redrive.operations.merge). The cross-process tests spawn real processes, as the run does."""

from __future__ import annotations

import functools
import multiprocessing
import os
import pickle
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from redrive.errors import UsageProblem
from redrive.keys import key_for
from redrive.operations.merge import merge_move_results, merge_purge_results, merge_sightings
from redrive.operations.move import MAX_LISTED, Listed, MoveResult, TaskCounts
from redrive.operations.move import processes as move_processes
from redrive.operations.purge import PurgeResult
from redrive.runs import processes
from redrive.runs.processes import ChildStatus, ProcessesResult, check_processes
from redrive.runs.shared import (
    ProcessLock,
    ScanEnds,
    SharedLimit,
    SharedPlanned,
    SharedRate,
    make_shares,
)
from redrive.selection import Selection, Sightings

SPAWN = multiprocessing.get_context("spawn")


def _take_all(limit: SharedLimit, threads: int, out: Connection) -> None:
    """A child: ``threads`` threads take from the shared limit until none is left."""
    taken: list[int] = []

    def take() -> None:
        n = 0
        while limit.take():
            n += 1
        taken.append(n)

    workers = [threading.Thread(target=take) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    out.send(sum(taken))
    out.close()


def test_the_limit_is_exact_across_processes_and_their_threads(tmp_path: Path) -> None:
    limit = SharedLimit(37, SPAWN, ProcessLock(tmp_path / "limit.lock"))
    pipes = [SPAWN.Pipe(duplex=False) for _ in range(3)]
    children = [SPAWN.Process(target=_take_all, args=(limit, 4, send)) for _, send in pipes]
    for child in children:
        child.start()
    got = [receive.recv() for receive, _ in pipes]
    for child in children:
        child.join(30)
    assert sum(got) == 37
    assert limit.reached and not limit.take()
    limit.give_back()  # a claim lost to another run gives its message back
    assert not limit.reached and limit.take() and limit.reached


def _hold_forever(limit: SharedLimit, out: Connection) -> None:
    """A child that dies (the test SIGKILLs it) while it holds the limit's lock."""
    with limit._lock:
        out.send("holding")
        time.sleep(60)


def test_a_child_killed_while_it_holds_the_lock_does_not_hang_the_others(
    tmp_path: Path,
) -> None:
    limit = SharedLimit(5, SPAWN, ProcessLock(tmp_path / "limit.lock"))
    receive, send = SPAWN.Pipe(duplex=False)
    child = SPAWN.Process(target=_hold_forever, args=(limit, send))
    child.start()
    assert receive.recv() == "holding"
    child.kill()
    child.join(10)
    taken: list[bool] = []
    taker = threading.Thread(target=lambda: taken.append(limit.take()))
    taker.start()
    taker.join(10)
    assert taken == [True], "the kernel gave the dead child's lock back"
    assert limit.left == 4


def test_no_limit_is_never_reached(tmp_path: Path) -> None:
    limit = SharedLimit(None, SPAWN, ProcessLock(tmp_path / "limit.lock"))
    assert all(limit.take() for _ in range(1000)) and not limit.reached
    assert limit.left is None


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_the_rate_is_one_bucket_for_every_thread(tmp_path: Path) -> None:
    fake = FakeTime()
    lock = ProcessLock(tmp_path / "rate.lock")
    limiter = SharedRate(20, SPAWN, lock, clock=fake.clock, sleep=fake.sleep)
    for _ in range(40):
        limiter.acquire(10)
    # 400 messages at 20/s, the first second's worth at once: 19 s of waiting.
    assert sum(fake.sleeps) == pytest.approx(19.0)


def _acquire(rate: SharedRate, n: int, out: Connection) -> None:
    out.send(rate.acquire(n))
    out.close()


def test_a_childs_sends_take_from_the_same_bucket(tmp_path: Path) -> None:
    """The child's clock stands still at the parent's time: what it takes is gone for the
    parent, which then waits for the bucket to refill."""
    fake = FakeTime()
    frozen = functools.partial(float, fake.now)  # picklable, as the child needs it
    lock = ProcessLock(tmp_path / "rate.lock")
    limiter = SharedRate(10, SPAWN, lock, clock=frozen, sleep=fake.sleep)
    receive, send = SPAWN.Pipe(duplex=False)
    child = SPAWN.Process(target=_acquire, args=(limiter, 10, send))
    child.start()
    assert receive.recv() == 0.0
    child.join(30)
    assert limiter.acquire(5) == pytest.approx(0.5)


def test_planned_keys_are_seen_by_every_process(tmp_path: Path) -> None:
    mine = SharedPlanned(tmp_path / "planned.sqlite3")
    theirs = pickle.loads(pickle.dumps(mine))  # what a child gets: the file, not a copy
    assert "k1" not in mine and "k1" not in theirs
    theirs.add("k1")
    assert "k1" in mine and "k2" not in mine and 7 not in mine
    mine.add("k1")  # twice is once
    mine.close()
    theirs.close()


def _plan_all(planned: SharedPlanned, out: Connection) -> None:
    out.send([key for key in (f"task-{i}" for i in range(300)) if planned.add(key)])
    planned.close()


def test_each_planned_key_is_first_in_exactly_one_process(tmp_path: Path) -> None:
    """A dry run's claim: processes planning the same keys at once are each told "first"
    for a key once in all (so a second copy in a sibling counts as a duplicate, as in a real
    run), never twice and never not at all."""
    planned = SharedPlanned(tmp_path / "planned.sqlite3")
    pipes = [SPAWN.Pipe(duplex=False) for _ in range(3)]
    children = [SPAWN.Process(target=_plan_all, args=(planned, send)) for _, send in pipes]
    for child in children:
        child.start()
    firsts = Counter(key for receive, _ in pipes for key in receive.recv())
    for child in children:
        child.join(30)
    assert firsts == Counter({f"task-{i}": 1 for i in range(300)})
    assert planned.add("task-7") is False
    planned.close()


def test_an_executed_run_plans_nothing(tmp_path: Path) -> None:
    shares = make_shares(SPAWN, limit=None, rate=None, scratch=tmp_path, plans=False)
    shares.planned.add("k")
    assert "k" not in shares.planned


def test_a_scan_waits_for_its_siblings_scans_or_an_orphan_gives_up() -> None:
    ends = ScanEnds(2, SPAWN)
    give_up = threading.Event()
    waiter = threading.Thread(target=ends.wait_for_all, args=(1, give_up))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive(), "process 2 is still scanning"
    ends.end(2)  # its own end, or the parent's mark for a process that died
    waiter.join(60)
    assert not waiter.is_alive() and ends.all_ended
    lonely = ScanEnds(2, SPAWN)
    give_up.set()  # the parent is gone: nobody will mark a dead sibling
    lonely.wait_for_all(1, give_up)
    assert not lonely.all_ended


def test_processes_must_be_a_sane_number() -> None:
    check_processes(1)
    for bad in (0, 65):
        with pytest.raises(UsageProblem, match="--processes"):
            check_processes(bad)


# -- merging ------------------------------------------------------------------------------


def part(moved: int, task: str, *, listed: int = 0, hidden: int = 0) -> MoveResult:
    result = MoveResult(dry_run=False, target="checkout", dlq="dlq", run_id="child")
    result.scanned = result.matched = moved + listed
    result.moved = moved
    result.in_doubt = listed
    result.skipped["in-doubt"] = listed
    result.tasks[task] = TaskCounts(matched=moved, moved=moved, targets=Counter(q=moved))
    result.in_doubt_messages = [Listed(task, f"id{i}", f"m{i}", f"k{i}") for i in range(listed)]
    result.still_hidden = hidden
    return result


def test_move_results_merge_into_one() -> None:
    template = MoveResult(dry_run=False, target="checkout", dlq="dlq", run_id="parent")
    one, two = part(5, "a", listed=60, hidden=9), part(7, "a", listed=70, hidden=2)
    two.tasks["b"] = TaskCounts(matched=1, moved=1, skipped=Counter(poison=1))
    two.no_target_reason, two.no_target_candidates = "two sources", ["x", "y"]
    merged = merge_move_results(template, [one, two], None)
    assert merged.run_id == "parent"
    assert (merged.scanned, merged.moved, merged.in_doubt) == (142, 12, 130)
    assert merged.skipped == Counter({"in-doubt": 130})
    assert merged.tasks["a"].moved == 12 and merged.tasks["a"].targets == Counter(q=12)
    assert merged.tasks["b"].skipped == Counter(poison=1)
    assert len(merged.in_doubt_messages) == MAX_LISTED, "listed as one process lists"
    assert merged.no_target_candidates == ["x", "y"]
    assert merged.still_hidden == 2, "the last to end saw its siblings' holds given back"
    assert merged.needs_attention
    assert template.moved == 0 and not template.tasks, "the template is left as it was"


def test_purge_results_merge_into_one() -> None:
    template = PurgeResult(dry_run=False, target="t", dlq="d", archive="a")
    parts = []
    for n in (3, 4):
        p = PurgeResult(dry_run=False, target="t", dlq="d", archive="a")
        p.scanned = p.matched = p.archived = p.purged = n
        p.by_task["x"] = n
        parts.append(p)
    merged = merge_purge_results(template, parts, None)
    assert (merged.archived, merged.purged, merged.by_task) == (7, 7, Counter(x=7))


def test_a_task_filter_misses_only_when_no_process_saw_it() -> None:
    selection = Selection(tasks=("apps.*.refund",), message_ids=frozenset({"m1", "m2"}))
    seen, unseen = Sightings(selection), Sightings(selection)
    seen.add("apps.payments.refund", "m1")
    unseen.add("apps.other", "m3")
    merged = merge_sightings(selection, [seen, unseen])
    assert merged is not None
    misses = merged.misses()
    assert misses is not None and not misses.patterns and misses.ids_not_seen == ("m2",)
    alone = merge_sightings(selection, [unseen])
    assert alone is not None and alone.misses() is not None
    assert alone.misses().patterns[0].pattern == "apps.*.refund"  # type: ignore[union-attr]
    assert merge_sightings(Selection(), [None, None]) is None


def test_a_processes_result_needs_attention_when_a_child_died() -> None:
    result = MoveResult(dry_run=False, target="t", dlq="d")
    died = ChildStatus(2, "p.2", 4242, "died", -9, in_doubt=3, moved=10)
    outcome = ProcessesResult(result, 2, [ChildStatus(1, "p.1", 4241, "completed", 0), died])
    assert outcome.needs_attention and not outcome.interrupted
    assert died.describe() == (
        "process 2 (pid 4242, run p.2) killed by SIGKILL: 3 message(s) in doubt (claimed, "
        "send unconfirmed), 10 moved before"
    )
    data = outcome.to_json()
    assert data["processes"] == 2 and data["children"][1]["how"] == "killed by SIGKILL"


def test_a_dead_childs_sends_and_claims_are_counted_from_the_ledger(tmp_path: Path) -> None:
    """Issue 22: a killed child's moves were left out of the per-task table, its in-doubt
    rows had no task id and said an earlier run stopped, and matched could exceed scanned
    (its last progress report lagged its sends)."""
    from redrive.cli.processes import processes_text
    from redrive.ledger import Claim, SqliteLedger
    from redrive.messages import decode
    from redrive.render.move import move_text
    from redrive.sandbox.encoder import encode

    tasks = {f"id-{i}": ("apps.a.capture" if i % 2 else "apps.b.refund") for i in range(5)}
    claims = [
        Claim(
            key_for(
                decode(encode(task, [], {}, task_id=tid)),
                message_id=f"m-{tid}",
                generation=0,
                body="",
                namespace="sqs",
            ),
            task,
            f"m-{tid}",
            "https://sqs/1/onion-checkout",
        )
        for tid, task in tasks.items()
    ]
    ledger = SqliteLedger(tmp_path / "l.sqlite3")
    try:
        ledger.start_run("p.2", command="move", info={})
        ledger.claim_many("p.2", claims)
        ledger.mark_sent_many("p.2", {c.key: f"s-{c.key}" for c in claims[:3]})
        status = ChildStatus(2, "p.2", 4242, "died", -9)
        result = MoveResult(dry_run=False, target="checkout", dlq="dlq", run_id="p")
        # Its last report (2 scanned, 1 matched) came before most of what the ledger holds.
        move_processes._add_left(result, (2, 1, 1, 0), status, processes.left_by(ledger, status))
    finally:
        ledger.close()
    assert (status.moved, status.in_doubt) == (3, 2)
    assert (result.moved, result.in_doubt, result.died_in_doubt) == (3, 2, 2)
    assert result.scanned >= result.matched == 5
    assert sum(c.moved for c in result.tasks.values()) == result.moved
    assert sum(c.matched for c in result.tasks.values()) == result.matched
    assert result.tasks["apps.a.capture"].targets["onion-checkout"] >= 1
    assert {m.task_id for m in result.in_doubt_messages} == {"id-3", "id-4"}
    text = processes_text(ProcessesResult(result, 2, [status]), move_text(result))
    assert "an earlier run" not in text and "a process of this run died" in text
    assert "id-3" in text and "id-4" in text
    assert "process 2 (pid 4242, run p.2) killed by SIGKILL: 2 message(s) in doubt" in text
    result.in_doubt += 1  # one more, left by an earlier run
    assert "earlier run stopped (1) or a process of this run died (2" in move_text(result)


def test_a_where_crosses_to_a_process_as_its_text_compiled_again() -> None:
    from redrive.where import compile_where

    where = compile_where(["kwargs.amount > `100`", "task == 'a'"])
    assert where is not None
    again = pickle.loads(pickle.dumps(where))
    assert again.texts == where.texts
    record = {"kwargs": {"amount": 150}, "task": "a"}
    assert again.holds(record) and where.holds(record)
    assert not again.holds({"kwargs": {"amount": 5}, "task": "a"})


def test_inspect_groups_merge_into_one() -> None:
    from redrive.inspection.groups import TaskGroup
    from redrive.inspection.merge import merge_sent_times, merge_task_groups
    from redrive.inspection.timeline import SentTimes

    fine, coarse = SentTimes(), SentTimes(width=300)
    for t in (0.0, 30.0, 90.0):
        fine.add(1_000_000 + t)
    coarse.add(1_000_400.0)
    merged = merge_sent_times([fine, coarse])
    assert merged.width == 300 and sum(merged.counts.values()) == 4
    assert (merged.first, merged.last) == (1_000_000.0, 1_000_400.0)
    one = TaskGroup(task="t", count=2, oldest=5.0, newest=9.0, max_receive_count=3, poison=1)
    one.sample_message_ids = ["a", "b"]
    two = TaskGroup(task="t", count=3, oldest=2.0, newest=7.0, max_receive_count=6, poison=2)
    two.sample_message_ids = ["c", "d"]
    two.protocols["2"] = 3
    group = merge_task_groups([one, two])
    assert (group.count, group.oldest, group.newest, group.max_receive_count) == (5, 2.0, 9.0, 6)
    assert group.poison == 3 and group.protocols == Counter({"2": 3})
    assert group.sample_message_ids == ["a", "b", "c"], "as many samples as one scan keeps"
    assert group.to_json()["task"] == "t"
    unpickled = pickle.loads(pickle.dumps(one))
    assert merge_task_groups([unpickled]).to_json()["task"] == "t", "a task's group stays one"


def test_an_inspect_limit_is_split_so_the_parts_add_up() -> None:
    from redrive.inspection.processes import limit_share

    assert [limit_share(37, 3, n) for n in (1, 2, 3)] == [13, 12, 12]
    assert sum(limit_share(5, 4, n) or 0 for n in range(1, 5)) == 5
    assert limit_share(None, 2, 1) is None


def test_each_process_archives_beside_the_archive_named() -> None:
    from redrive.archive.storage import archive_part

    assert archive_part("./a/x.jsonl.gz", 2) == "./a/x.p2.jsonl.gz"
    assert archive_part("x.jsonl", 1) == "x.p1.jsonl"
    assert archive_part("s3://bucket/prefix", 3) == "s3://bucket/prefix", "a folder per run"


def test_every_copy_of_a_task_is_in_one_replay_share() -> None:
    from redrive.archive import ArchiveRecord
    from redrive.operations.replay.processes import share_of
    from redrive.sandbox.encoder import encode

    def record(message_id: str, task_id: str) -> ArchiveRecord:
        body = encode("apps.t", [1], {}, protocol=2, task_id=task_id, queue="q")
        return ArchiveRecord(
            message_id=message_id,
            task="apps.t",
            task_id=task_id,
            dlq="dlq",
            archived_at=datetime(2026, 12, 1, tzinfo=UTC),
            run_id="r",
            body=body,
            attributes={},
            message_attributes={},
        )

    shares = {share_of(record(f"m{i}", "same-task"), 4) for i in range(20)}
    assert len(shares) == 1
    spread = {share_of(record(f"m{i}", f"task-{i}"), 4) for i in range(200)}
    assert spread == {0, 1, 2, 3}


def _arenas(out: Connection) -> None:
    out.send(os.environ.get("MALLOC_ARENA_MAX"))


@pytest.mark.parametrize(("given", "child_sees"), [(None, "2"), ("4", "4")])
def test_children_start_with_few_malloc_arenas_unless_the_user_chose(
    monkeypatch: pytest.MonkeyPatch, given: str | None, child_sees: str
) -> None:
    if given is None:
        monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    else:
        monkeypatch.setenv("MALLOC_ARENA_MAX", given)
    receive, send = SPAWN.Pipe(duplex=False)
    child = SPAWN.Process(target=_arenas, args=(send,))
    with processes._allocator_bounded():
        child.start()
    send.close()
    assert receive.recv() == child_sees
    child.join(30)
    assert os.environ.get("MALLOC_ARENA_MAX") == given  # the parent's own is left as it was


class _SpinUntilAborted:
    """A child's job that ignores ``stop``: only the parent's abort ends it."""

    def run(self, child: processes.ChildRun) -> tuple[None, None]:
        child.observer.on_problem("running")
        while True:
            time.sleep(0.01)


def test_the_parents_abort_interrupts_a_child_as_a_second_ctrl_c_does_one_process(
    tmp_path: Path,
) -> None:
    """The abort was simulated as SIGINT, which a child ignores (the terminal's Ctrl-C is
    the parent's to answer), and simulating an ignored signal does nothing: a second Ctrl-C
    then aborted no child."""
    commands_in, commands_out = SPAWN.Pipe(duplex=False)
    reports_in, reports_out = SPAWN.Pipe(duplex=False)
    common = processes.make_shares(SPAWN, limit=None, rate=None, scratch=tmp_path, plans=False)
    shares = (common, processes.ScanEnds(1, SPAWN))
    child = SPAWN.Process(
        target=processes._child_main,
        args=(1, _SpinUntilAborted(), processes.Wiring(), shares, commands_in, reports_out, None),
    )
    child.start()
    try:
        assert reports_in.poll(60) and reports_in.recv() == ("problem", "running")
        commands_out.send("abort")
        assert reports_in.poll(60), "the child was not interrupted"
        assert reports_in.recv() == ("error", "aborted", "aborted by a second Ctrl-C")
        child.join(30)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
            child.join(10)
