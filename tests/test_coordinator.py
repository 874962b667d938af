"""Issue 38: the coordinator runs every operation for any front end, the CLI being one.

A front end without click (a script here, a web console later) runs move, apply, purge,
replay and inspect through ``run_operation``; two runs go at once in one process, on two
DLQs, and the stop signal of one ends it (what it held given back, nothing in doubt) while
the other finishes. The stop comes at a fixed point of the run (its second receive), never
from a sleep racing it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MotoServer, make_family

from redrive.sandbox.encoder import encode

pytestmark = pytest.mark.e2e

CHARGE = "apps.payments.tasks.charge"
RECEIPT = "apps.emails.tasks.send_receipt"
CHECKOUT = 40
DEFAULT = 30

SCRIPT = r"""
import json
import socket
import sys
import threading
import time
from pathlib import Path

from redrive.aws.session import AwsSettings
from redrive.broker import open_broker, resolve_target
from redrive.config import load_layout
from redrive.inspection.processes import InspectScan
from redrive.ledger import open_ledger
from redrive.operations.apply import ApplyOptions
from redrive.operations.coordinator import (
    Caller,
    InspectRequest,
    MoveRequest,
    PurgeRequest,
    ReplayRequest,
    Setup,
    apply_request,
    run_operation,
)
from redrive.operations.move import MoveOptions
from redrive.runs.observer import Callbacks
from redrive.operations.plan import Plan
from redrive.operations.purge import PurgeOptions

work = Path(sys.argv[1])
ledger = str(work / "ledger.sqlite3")
aws = AwsSettings()
setup = Setup(
    brokers=lambda region: open_broker(None, aws=aws, region=region),
    ledger_clients=aws.client,
)
alice = Caller.of("alice", "console: drain", address="10.0.0.7")
broker = setup.brokers(None)
layout = load_layout(None)
checkout = resolve_target(layout, "checkout", setup.brokers)
default = resolve_target(layout, "default", setup.brokers)
out = {}


def run(request, **kwargs):
    return run_operation(request, setup=setup, ledger=ledger, caller=alice, **kwargs).unwrap()


out["inspected"] = run(InspectRequest(checkout, InspectScan(now=time.time()))).total
out["held_after_inspect"] = broker.counts(checkout.dlq.url).held

plan_path = str(work / "plan.json")
planned = run_operation(
    MoveRequest(checkout, MoveOptions(), plan_out=plan_path),
    setup=setup, ledger=ledger, caller=alice,
)
out["planned"] = planned.plan.count
applied = run(apply_request(checkout, Plan.read(plan_path), ApplyOptions(execute=True)))
out["applied"] = applied.result.moved
print("applied", flush=True)
sys.stdin.readline()  # the parent seeds both DLQs meanwhile

# Two runs at once: the checkout move stops at its second receive, the purge of default's
# DLQ finishes.
stop = threading.Event()
received = []


def on_step(step):
    if step == "received":
        received.append(step)
        if len(received) == 2:
            stop.set()


results = {}
archive = str(work / "default.jsonl.gz")
requests = {
    "move": (
        MoveRequest(checkout, MoveOptions(execute=True, workers=1)),
        Callbacks(on_step=on_step),
        stop,
    ),
    "purge": (
        PurgeRequest(default, PurgeOptions(execute=True, archive_to=archive)),
        Callbacks(),
        threading.Event(),
    ),
}


def go(name):
    request, observer, signal = requests[name]
    results[name] = run(request, observer=observer, stop=signal)


threads = [threading.Thread(target=go, args=(name,)) for name in requests]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
moved, purged = results["move"], results["purge"]
counts = broker.counts(checkout.dlq.url)
out["stopped"] = {
    "interrupted": moved.interrupted,
    "moved": moved.moved,
    "in_doubt": moved.in_doubt,
    "ready": counts.ready,
    "held": counts.held,
}
out["finished"] = {"interrupted": purged.interrupted, "purged": purged.purged}

queue = broker.describe("onion")
replayed = run(ReplayRequest(archive, queue, MoveOptions(execute=True, to=queue)))
out["replayed"] = replayed.move.moved

with open_ledger(ledger) as opened:
    runs = [r for r in opened.runs() if r.info.get("command_line")]
out["audit"] = sorted({(r.info["user"], r.info["address"]) for r in runs})
out["hosts"] = sorted({r.info["host"] for r in runs} - {socket.gethostname()})
out["click"] = "click" in sys.modules
print(json.dumps(out))
"""


def seed(family: object, task: str, count: int, prefix: str) -> None:
    for i in range(count):
        family.send_to_dlq(encode(task, [i], {}, task_id=f"{prefix}-{i}"))  # type: ignore[attr-defined]


def test_a_front_end_without_click_runs_every_operation_and_two_at_once(
    server: MotoServer, tmp_path: Path
) -> None:
    client = server.client()
    checkout = make_family(client, "onion-checkout")
    default = make_family(client, "onion")
    seed(checkout, CHARGE, CHECKOUT, "planned")
    script = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        env=server.env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert script.stdin is not None and script.stdout is not None
    # Once the plan is applied the script waits for its line: the DLQs are seeded again.
    line = script.stdout.readline()
    assert line == "applied\n", line + script.communicate(timeout=60)[1]
    seed(checkout, CHARGE, CHECKOUT, "stopped")
    seed(default, RECEIPT, DEFAULT, "finished")
    stdout, stderr = script.communicate("go\n", timeout=300)
    assert script.returncode == 0, stderr
    out = json.loads(stdout)
    assert out["click"] is False
    assert out["held_after_inspect"] == 0
    assert out["planned"] == out["applied"] == CHECKOUT
    stopped = out["stopped"]
    assert stopped["interrupted"] is True
    # Stopped partway, everything it held given back: the rest waits in the DLQ, visible.
    assert 0 < stopped["moved"] < CHECKOUT
    assert stopped["held"] == 0 and stopped["in_doubt"] == 0
    assert stopped["moved"] + stopped["ready"] == CHECKOUT
    assert out["finished"] == {"interrupted": False, "purged": DEFAULT}
    assert out["replayed"] == DEFAULT
    assert out["audit"] == [["alice", "10.0.0.7"]]
    assert out["hosts"] == []
