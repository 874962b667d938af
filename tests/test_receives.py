"""Tests for redrive.dlq.receive_log: redrive's own receives per message, kept in the state dir."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from conftest import Family

from redrive.broker.sqs import SqsBroker
from redrive.broker.sqs.queues import resolve_family
from redrive.config import built_in_layout
from redrive.dlq import receive_log
from redrive.dlq.receive_log import KEEP_DAYS, ReceiveLog, default_path, message_digest
from redrive.ledger import SqliteLedger
from redrive.operations.move import MoveEngine, MoveOptions
from redrive.sandbox.encoder import encode
from redrive.selection import Selection
from redrive.where import compile_where

DAY = 86_400


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def entries(path: Path) -> dict[int, int]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT digest, count FROM receives").fetchall()
    return {d % (1 << 64): n for d, n in rows}


def test_each_receive_counts_this_one_included_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "receives.sqlite3"
    with ReceiveLog(path) as log:
        assert log.record(["a", "b"]) == [1, 1]
        assert log.record(["a"]) == [2]
    # A later process (a new log on the same file) knows what earlier ones did.
    with ReceiveLog(path) as log:
        assert log.record(["a", "c", "b"]) == [3, 1, 2]
        assert log.problem is None
    assert entries(path) == {message_digest("a"): 3, message_digest("b"): 2, message_digest("c"): 1}


@pytest.mark.e2e
def test_several_processes_and_threads_at_once_lose_no_count(tmp_path: Path) -> None:
    path = tmp_path / "receives.sqlite3"
    ids = [f"m-{i}" for i in range(50)]
    script = (
        "import sys; from pathlib import Path; from redrive.dlq.receive_log import ReceiveLog\n"
        "with ReceiveLog(Path(sys.argv[1])) as log:\n"
        "    for _ in range(20):\n"
        "        for i in range(0, 50, 10):\n"
        "            log.record([f'm-{j}' for j in range(i, i + 10)])\n"
        "            log.flush()\n"
    )
    others = [
        subprocess.Popen([sys.executable, "-c", script, str(path)], stdin=subprocess.DEVNULL)
        for _ in range(2)
    ]
    with ReceiveLog(path) as log:

        def work() -> None:
            for _ in range(20):
                log.record(ids)

        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [p.wait(60) for p in others] == [0, 0]
    assert entries(path) == {message_digest(m): 2 * 20 + 3 * 20 for m in ids}


def test_entries_older_than_sqs_keeps_messages_go_and_the_file_is_capped(tmp_path: Path) -> None:
    path = tmp_path / "receives.sqlite3"
    clock = Clock()
    with ReceiveLog(path, clock=clock) as log:
        log.record(["old"])
    clock.now += (KEEP_DAYS + 1) * DAY
    with ReceiveLog(path, clock=clock) as log:
        # Pruned once a day, when a log opens: "old" cannot still be in any DLQ.
        assert log.record(["old", "new"]) == [1, 1]
    # The cap: the least recently touched go first.
    with ReceiveLog(path, clock=clock, max_entries=100) as log:
        clock.now += DAY
        for start in range(0, 300, 10):
            clock.now += 1
            log.record([f"m-{i}" for i in range(start, start + 10)])
            log.flush()
    assert len(entries(path)) <= 100 + 100 // 10 + 10
    clock.now += DAY
    with ReceiveLog(path, clock=clock, max_entries=100):
        pass
    assert len(entries(path)) == 100
    assert set(entries(path)) == {message_digest(f"m-{i}") for i in range(200, 300)}


def test_an_unusable_file_is_said_never_raised(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    log = ReceiveLog(tmp_path / "dir")  # a directory where the file should be
    assert log.problem and "dir" in log.problem
    assert log.record(["a", "b"]) == [1, 1]
    log.close()
    damaged = tmp_path / "damaged.sqlite3"
    damaged.write_bytes(b"not a database at all" * 100)
    log = ReceiveLog(damaged)
    assert log.problem and "not a database" in log.problem
    assert log.record(["a"]) == [1]
    log.close()


def test_the_default_file_is_in_the_state_directory_private(tmp_path: Path) -> None:
    # conftest points REDRIVE_STATE_DIR at tmp_path / "state", which does not exist yet.
    assert default_path() == tmp_path / "state" / receive_log.FILE_NAME
    with ReceiveLog.open_default() as log:
        log.record(["a"])
    assert default_path().stat().st_mode & 0o777 == 0o600
    assert default_path().parent.stat().st_mode & 0o777 == 0o700


def test_counts_are_buffered_then_written_in_one_transaction(tmp_path: Path) -> None:
    path = tmp_path / "receives.sqlite3"
    log = ReceiveLog(path)
    log.record([f"m-{i}" for i in range(10)])
    other = ReceiveLog(path)
    # Not written yet (at most FLUSH_SECONDS later, or at the scan's end)...
    assert other.record(["m-0"]) == [1]
    log.flush()
    # ...then another process sees them.
    assert other.record(["m-1"]) == [2]
    log.close()
    other.close()


def test_a_receive_can_be_counted_without_reading_the_counts_back(tmp_path: Path) -> None:
    path = tmp_path / "receives.sqlite3"
    with ReceiveLog(path) as log:
        log.count_digests([message_digest("a"), message_digest("b")])
        assert log.record(["a"]) == [2]
    assert entries(path) == {message_digest("a"): 2, message_digest("b"): 1}


class ReadCounter(ReceiveLog):
    """A receive log that counts how often it was read (one read per received batch)."""

    reads = 0

    def _known(self, digests: Sequence[int]) -> dict[int, int]:
        self.reads += 1
        return super()._known(digests)


@pytest.mark.parametrize(
    ("where", "reads"),
    [((), False), (("consumer_receives < `100`",), True)],
    ids=["plain", "where"],
)
def test_a_move_reads_its_receive_counts_only_for_a_where_on_them(
    family: Family, tmp_path: Path, where: tuple[str, ...], reads: bool
) -> None:
    ids = [
        family.send_to_dlq(encode("apps.tasks.ping", [i], {}, task_id=f"t-{i}")) for i in range(15)
    ]
    layout = built_in_layout({}).family("checkout")
    assert layout is not None
    with ReadCounter(tmp_path / "receives.sqlite3") as log:
        result = MoveEngine(
            resolve_family(SqsBroker(family.client), layout),
            None,
            MoveOptions(selection=Selection(where=compile_where(where))),
            broker_factory=lambda: SqsBroker(family.client),
            receive_log=log,
        ).run()
        assert result.moved == 15  # a dry run: every message stays
        assert (log.reads > 0) is reads
        # Counted all the same: the next reader sees the dry run's receive of each.
        assert log.record(ids) == [2] * 15


def test_a_move_leaves_no_receive_counts_of_what_it_deleted(family: Family, tmp_path: Path) -> None:
    """A message moved is gone from the DLQ: nothing will show its receives, so the log
    does not write them (a million-message move would write a million entries, each write
    dearer as the file grows); the ones the move left in the DLQ are counted."""
    moved = [
        family.send_to_dlq(encode("apps.tasks.ping", [i], {}, task_id=f"t-{i}")) for i in range(12)
    ]
    left = [
        family.send_to_dlq(encode("apps.tasks.pong", [i], {}, task_id=f"u-{i}")) for i in range(8)
    ]
    layout = built_in_layout({}).family("checkout")
    assert layout is not None
    path = tmp_path / "receives.sqlite3"
    with ReceiveLog(path) as log, SqliteLedger(tmp_path / "ledger.sqlite3") as ledger:
        result = MoveEngine(
            resolve_family(SqsBroker(family.client), layout),
            ledger,
            MoveOptions(execute=True, selection=Selection(tasks=("apps.tasks.ping",))),
            broker_factory=lambda: SqsBroker(family.client),
            receive_log=log,
        ).run()
    assert result.moved == 12
    assert entries(path) == {message_digest(m): 1 for m in left}
    assert not set(entries(path)) & {message_digest(m) for m in moved}
