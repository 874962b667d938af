"""The DLQ page's message list, a page at a time (issue 41, item 8): every message of the
scan appears exactly once across the pages (of the whole DLQ, or of a task filter's groups),
the links keep the filters, paging reads no message from the broker again (SQS's own receive
counts say so), and what a scan holds in memory does not grow with the DLQ: every message's
record is spooled to disk, arguments withheld, and removed with the scan."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import pytest
from conftest import Family
from web_console import client, sqs_workspace

from redrive.broker.base import Delivery
from redrive.inspection.groups import GroupKey
from redrive.messages import decode
from redrive.sandbox.encoder import encode
from redrive.web import spool as spool_module
from redrive.web.console import Console
from redrive.web.samples import KEPT_PER_GROUP, SampleKeeper
from redrive.web.scans import ScanRequest, run_scan
from redrive.web.settings import ConsoleSettings
from redrive.web.shared_scans import SharedScanSource
from redrive.web.spool import MessageSpool

REFUND = "apps.payments.tasks.refund"
CAPTURE = "apps.payments.tasks.capture_payment"
SECRET = "4111-1111-1111-1111"


def fill(family: Family, refunds: int, captures: int) -> dict[str, str]:
    """message id -> task; each task's arguments hold a SECRET (never written to disk)."""
    sent = {}
    for n in range(refunds + captures):
        task = REFUND if n < refunds else CAPTURE
        sent[family.send_to_dlq(encode(task, [n, SECRET], task_id=f"t-{n}"))] = task
    return sent


def receives(family: Family) -> Counter[int]:
    """How many times SQS delivered each DLQ message before this look (which hides them)."""
    counts: Counter[int] = Counter()
    while got := family.client.receive_message(
        QueueUrl=family.dlq_url,
        MaxNumberOfMessages=10,
        VisibilityTimeout=600,
        MessageSystemAttributeNames=["ApproximateReceiveCount"],
    ).get("Messages", []):
        counts.update(int(m["Attributes"]["ApproximateReceiveCount"]) - 1 for m in got)
    return counts


def shared(tmp_path: Path) -> Console:
    now = time.time()
    workspace = sqs_workspace(ledger_uri=str(tmp_path / "ledger.sqlite3"))
    source = SharedScanSource(workspace, refresh=300.0, clock=lambda: now)
    settings = ConsoleSettings(secret=b"test-secret" * 3, refresh=300.0)
    return Console(settings, workspace, scans=source, clock=lambda: now)


def pages(test: Any, first: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every page from ``first``, following ``paging.next``: (messages, pagings)."""
    messages, pagings, path = [], [], first
    while True:
        data = test.get(path).json()
        messages += data["messages"]
        pagings.append(data["paging"])
        if data["paging"]["next"] is None:
            return messages, pagings
        path = first.split("?")[0] + data["paging"]["next"]


def test_every_message_is_on_exactly_one_page_and_paging_reads_none_again(
    family: Family, tmp_path: Path
) -> None:
    sent = fill(family, refunds=70, captures=33)
    with client(shared(tmp_path)) as test:
        everything, pagings = pages(test, "/api/dlq/checkout?per_page=20")
        refunds, refund_pagings = pages(test, f"/api/dlq/checkout?task={REFUND}&per_page=20")
        both, _ = pages(test, "/api/dlq/checkout?task=apps.payments.tasks.*&per_page=20")
        past = test.get("/api/dlq/checkout?per_page=20&page=9").json()
        page = test.get(f"/dlq/checkout?task={REFUND}&per_page=20&page=2")
        bad = test.get("/api/dlq/checkout?page=0")
    ids = [m["message_id"] for m in everything]
    assert sorted(ids) == sorted(sent) and len(set(ids)) == len(ids)  # each exactly once
    assert [p["page"] for p in pagings] == [1, 2, 3, 4, 5, 6]
    assert {p["total"] for p in pagings} == {103} and pagings[-1]["pages"] == 6
    assert [len(m) for m in (everything[:20], everything[100:])] == [20, 3]
    assert pagings[0]["previous"] is None and pagings[1]["previous"] == "?page=1&per_page=20"
    refund_ids = [m["message_id"] for m in refunds]
    assert sorted(refund_ids) == sorted(i for i, t in sent.items() if t == REFUND)
    assert {m["task"] for m in refunds} == {REFUND} and len(refund_pagings) == 4
    # Two groups picked: group by group (by name), a page across the boundary included.
    assert [m["task"] for m in both] == [CAPTURE] * 33 + [REFUND] * 70
    assert sorted(m["message_id"] for m in both) == sorted(sent)
    # The links keep the filter: task, then the page.
    assert dict(parse_qsl(refund_pagings[1]["next"][1:])) == {
        "task": REFUND,
        "page": "3",
        "per_page": "20",
    }
    assert past["messages"] == [] and past["paging"]["previous"] == "?page=6&per_page=20"
    assert page.status_code == 200
    assert f'href="/dlq/checkout?task={REFUND}&amp;page=3&amp;per_page=20" rel="next"' in page.text
    assert f'href="/dlq/checkout?task={REFUND}&amp;page=1&amp;per_page=20" rel="prev"' in page.text
    assert "21–40 of 70" in page.text
    assert bad.status_code == 400 and "page" in bad.json()["error"]
    assert SECRET not in str(everything)
    assert receives(family) == Counter({1: 103})  # one scan for the 17 pages


def test_a_message_past_the_kept_ones_opens_without_its_arguments(
    family: Family, tmp_path: Path
) -> None:
    fill(family, refunds=KEPT_PER_GROUP + 5, captures=0)
    with client(shared(tmp_path)) as test:
        listed = test.get("/api/dlq/checkout?per_page=100").json()["messages"]
        shown = [test.get(f"/api/dlq/checkout/messages/{m['message_id']}").json() for m in listed]
        not_kept = next(m for m in shown if not m["arguments_kept"])
        message_id = not_kept["record"]["message_id"]
        page = test.get(f"/dlq/checkout/message/{message_id}")
    assert sum(m["arguments_kept"] for m in shown) == KEPT_PER_GROUP
    assert not_kept["record"]["task"] == REFUND and not_kept["record"]["args"] is None
    assert page.status_code == 200 and "Reveal arguments" not in page.text
    assert "kept the arguments of the first 20 messages" in page.text


def test_the_spool_holds_every_message_on_disk_and_is_removed_with_the_scan(
    family: Family, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spool_module, "FLUSH_EVERY", 8)  # moto's receives slow with depth
    fill(family, refunds=KEPT_PER_GROUP + 9, captures=KEPT_PER_GROUP)
    stop = threading.Event()
    outcome = run_scan(sqs_workspace(), ScanRequest("checkout"), now=time.time(), stop=stop)
    spool = outcome.spool
    assert spool is not None and spool.total == 2 * KEPT_PER_GROUP + 9
    # In memory: the kept records (a few per group) and at most one write's worth.
    assert len(outcome.records) == 2 * KEPT_PER_GROUP and spool.most_pending == 8
    with open(os.path.join(spool.folder, "messages.sqlite3"), "rb") as f:
        assert SECRET.encode() not in f.read()
    folder = spool.folder
    del outcome, spool
    gc.collect()
    assert not os.path.exists(folder)


def test_what_a_scan_holds_in_memory_does_not_grow_with_the_dlq() -> None:
    """tracemalloc's peak while 600 and 6,000 messages are counted into the console's
    keeper (the kept records, and every record spooled to disk): about the same."""
    body = encode(REFUND, [1, SECRET], {"note": "x" * 200}, task_id="t")
    info = decode(body)

    def peak(n: int) -> int:
        spool = MessageSpool()
        keeper = SampleKeeper(now=time.time(), sources=("onion-checkout",), spool=spool)
        keys = [GroupKey(t, t) for t in (REFUND, CAPTURE)]
        gc.collect()
        tracemalloc.start()
        try:
            for i in range(n):
                message = Delivery(f"m-{i}", f"tag-{i}", body, {}, {}, 1, 1_700_000_000.0)
                keeper.offer(keys[i % 2], message, info, None)
            spool.finish()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            assert spool.total == n
            spool.close()

    small, large = peak(600), peak(6_000)
    print(f"peaks: {small:,} and {large:,} bytes")
    assert large < small * 1.25, (small, large)


def test_a_spool_left_by_a_killed_server_is_removed_by_the_next_server(tmp_path: Path) -> None:
    """A SIGKILLed server cannot remove its spools; the next one's first spool removes the
    folders of servers no longer running, and keeps a running one's and anything not a
    spool's."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / f"{spool_module.PREFIX}{dead.pid}-abc"
    running = tmp_path / f"{spool_module.PREFIX}{os.getppid()}-def"
    other = tmp_path / "redrive-web-scan-notapid"
    for folder in (left, running, other):
        folder.mkdir()
        (folder / "messages.sqlite3").write_bytes(b"x")
    spool = MessageSpool(str(tmp_path))
    try:
        assert not left.exists()
        assert running.exists() and other.exists()
        assert os.path.basename(spool.folder).startswith(f"{spool_module.PREFIX}{os.getpid()}-")
    finally:
        spool.close()
