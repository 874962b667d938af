"""What renewing holds costs, and how long a killed run's holds last, at 100,000 held.

A scan keeps hidden what it does not consume (everything, for inspect) and renews those
holds while it lives (redrive.dlq.scan.hold_seconds), so that a run killed by SIGKILL hides its
messages for a bounded time. This script measures, against bench/fast_sqs.py (started as a
subprocess with ``--latency-ms`` to model the network), on a DLQ of ``--messages`` messages:

1. ``inspect``: ``redrive inspect checkout --json --lease L`` as a subprocess, every message
   held until the end. The server counts each call: ReceiveMessage, and
   ChangeMessageVisibilityBatch split into renewals (``:hide``) and releases.
2. ``idle``: one scan in this process receives every message, keeps it (as inspect does),
   then holds all of them for ``--hold-seconds`` without receiving more, as a slow run
   would (a move at a low ``--rate`` past a deep DLQ of skipped messages). Renewal calls
   are sampled every few seconds: the steady cost of holding that many.
3. ``kill``: ``redrive inspect`` again, SIGKILLed once it has held ``--kill-at`` of the
   messages; then the time until every message is visible again, beside the bound
   ``max(lease, min(age, held / 100))`` the run's holds promise.

For comparison, renewing every held handle every ``lease/2`` seconds (the naive way to keep
a dead run's holds within the lease) costs ``held / 10 / (lease / 2)`` calls a second.

Usage (from the repository root, with the project's venv)::

    .venv/bin/python bench/hold.py --messages 100000 --latency-ms 5 --lease 30

Every request goes to 127.0.0.1; every loop and child process is bounded.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from typing import Any  # noqa: E402

from bench.common import (  # noqa: E402
    DLQ,
    DLQ_RETENTION,
    FAMILY,
    HOST,
    MAX_RECEIVE_COUNT,
    PYTHON,
    QUEUE,
    REGION,
    ROOT,
    child_env,
    log,
)

CHILD_TIMEOUT = 3_600


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def start_server(latency_ms: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [PYTHON, "-P", os.path.join(_HERE, "fast_sqs.py"), "--port", str(port)]
    command += ["--latency-ms", str(latency_ms), "--inflight-limit", "0"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    endpoint = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"fast_sqs exited with {process.returncode}")
        try:
            with urllib.request.urlopen(endpoint + "/", timeout=2):
                return process, endpoint
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("fast_sqs did not start")


def calls(endpoint: str) -> dict[str, int]:
    with urllib.request.urlopen(endpoint + "/stats", timeout=10) as answer:
        data: dict[str, int] = json.loads(answer.read())
    return data


def since(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] != before.get(k)}


def client_for(endpoint: str) -> Any:
    import boto3

    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )


def create_family(client: Any) -> str:
    dlq_url = str(client.create_queue(QueueName=DLQ)["QueueUrl"])
    client.set_queue_attributes(
        QueueUrl=dlq_url, Attributes={"MessageRetentionPeriod": str(DLQ_RETENTION)}
    )
    arn = client.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    queue_url = str(client.create_queue(QueueName=QUEUE)["QueueUrl"])
    policy = {"deadLetterTargetArn": arn, "maxReceiveCount": MAX_RECEIVE_COUNT}
    client.set_queue_attributes(
        QueueUrl=queue_url, Attributes={"RedrivePolicy": json.dumps(policy)}
    )
    return dlq_url


def seed(client: Any, dlq_url: str, count: int) -> None:
    from redrive.sandbox.encoder import encode

    for first in range(0, count, 10):
        entries = [
            {"Id": str(i), "MessageBody": encode(f"apps.bench.tasks.t{(first + i) % 5}", [i])}
            for i in range(min(10, count - first))
        ]
        response = client.send_message_batch(QueueUrl=dlq_url, Entries=entries)
        if response.get("Failed"):
            raise RuntimeError(f"seeding failed: {response['Failed'][:1]}")


def depth(client: Any, url: str) -> tuple[int, int]:
    attrs = client.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]), int(
        attrs["ApproximateNumberOfMessagesNotVisible"]
    )


def bound(lease: int, age: float, held: int) -> int:
    from redrive.dlq.scan import hold_seconds

    return hold_seconds(lease=lease, age=age, held=held)


# -- 1. inspect ------------------------------------------------------------------------------


def inspect_run(
    endpoint: str, env: dict[str, str], client: Any, dlq_url: str, lease: int
) -> dict[str, Any]:
    before = calls(endpoint)
    started = time.monotonic()
    done = subprocess.run(
        [PYTHON, "-m", "redrive", "inspect", FAMILY, "--json", "--lease", str(lease)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"inspect failed ({done.returncode}): {done.stderr[-2000:]}")
    total = json.loads(done.stdout)["total"]
    used = since(before, calls(endpoint))
    after = depth(client, dlq_url)
    return {"wall_s": round(wall, 1), "counted": total, "calls": used, "depth_after": after}


# -- 2. idle ---------------------------------------------------------------------------------


def idle_run(
    endpoint: str, dlq_url: str, lease: int, hold_seconds: float, every: float
) -> dict[str, Any]:
    from redrive.broker.sqs import SqsBroker as Sqs
    from redrive.dlq.scan import DlqScan

    def sqs() -> Sqs:
        return Sqs(client_for(endpoint))

    first = sqs()
    scan = DlqScan(url=dlq_url, lease=lease, receive_held=True, wait_seconds=0, broker_factory=sqs)
    started = time.monotonic()
    try:
        while (batch := scan.next_batch(first)) is not None:
            scan.keep(first, batch)
        gathered = time.monotonic() - started
        log(f"idle: {scan.stats.received} held after {gathered:.0f} s; holding {hold_seconds} s")
        samples = []
        t0 = time.monotonic()
        last_calls = scan.stats.renew_calls
        while time.monotonic() - t0 < hold_seconds:
            time.sleep(every)
            now_calls = scan.stats.renew_calls
            age = time.monotonic() - started
            samples.append(
                {
                    "age_s": round(age),
                    "hold_s": scan.hold(),
                    "renew_calls": now_calls,
                    "calls_per_s": round((now_calls - last_calls) / every, 2),
                }
            )
            last_calls = now_calls
        result = {
            "held": scan.stats.received,
            "gathered_s": round(gathered, 1),
            "held_for_s": hold_seconds,
            "renew_calls": scan.stats.renew_calls,
            "renewed": scan.stats.renewed,
            "renew_failed": scan.stats.renew_failed,
            "renew_errors": scan.stats.renew_errors,
            "seen_again": scan.stats.seen_again,
            "samples": samples,
        }
        scan.release_all(first)
        return result
    finally:
        scan.close()


# -- 3. kill ---------------------------------------------------------------------------------


def kill_run(
    env: dict[str, str], client: Any, dlq_url: str, lease: int, kill_at: int
) -> dict[str, Any]:
    with tempfile.TemporaryFile() as out:
        started = time.monotonic()
        victim = subprocess.Popen(
            [PYTHON, "-m", "redrive", "inspect", FAMILY, "--json", "--lease", str(lease)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = started + CHILD_TIMEOUT
            while depth(client, dlq_url)[1] < kill_at:
                if victim.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the inspect ended before it could be killed")
                time.sleep(0.5)
            held = depth(client, dlq_url)[1]
            victim.send_signal(signal.SIGKILL)
            victim.wait(30)
        finally:
            if victim.poll() is None:
                victim.kill()
                victim.wait(30)
    killed = time.monotonic()
    age = killed - started
    promised = bound(lease, age, held)
    while depth(client, dlq_url)[1] > 0:
        if time.monotonic() - killed > promised + 120:
            break
        time.sleep(0.5)
    back = time.monotonic() - killed
    return {
        "held_at_kill": held,
        "age_at_kill_s": round(age, 1),
        "bound_s": promised,
        "all_visible_after_s": round(back, 1),
        "depth_after": depth(client, dlq_url),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python bench/hold.py", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--latency-ms", type=float, default=5.0)
    parser.add_argument("--lease", type=int, default=30)
    parser.add_argument("--hold-seconds", type=float, default=300.0)
    parser.add_argument("--sample-every", type=float, default=10.0)
    parser.add_argument("--kill-at", type=float, default=0.7, help="fraction of --messages held")
    parser.add_argument("--skip", default="", help="comma-separated: inspect,idle,kill")
    parser.add_argument("--receive-wait", type=int, default=1, help="long poll of each receive")
    parser.add_argument("--json-out", metavar="FILE")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    # Stopped with SIGTERM, still stop the server (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    n, lease = args.messages, args.lease
    server, endpoint = start_server(args.latency_ms)
    report: dict[str, Any] = {
        "messages": n,
        "latency_ms": args.latency_ms,
        "lease": lease,
        "naive_renewal_calls_per_s": round(n / 10 / (lease / 2), 1),
    }
    try:
        client = client_for(endpoint)
        dlq_url = create_family(client)
        t = time.monotonic()
        seed(client, dlq_url, n)
        log(f"seeded {n} in {time.monotonic() - t:.0f} s")
        with tempfile.TemporaryDirectory() as state:
            env = child_env(endpoint, state, args.receive_wait)
            if "inspect" not in skip:
                report["inspect"] = inspect_run(endpoint, env, client, dlq_url, lease)
                log(f"inspect: {report['inspect']}")
            if "idle" not in skip:
                report["idle"] = idle_run(
                    endpoint, dlq_url, lease, args.hold_seconds, args.sample_every
                )
                log(f"idle: { ({k: v for k, v in report['idle'].items() if k != 'samples'}) }")
            if "kill" not in skip:
                report["kill"] = kill_run(env, client, dlq_url, lease, int(n * args.kill_at))
                log(f"kill: {report['kill']}")
    finally:
        server.terminate()
        server.wait(15)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    ok = all(
        (r := report.get(k)) is None or r.get("depth_after", (n, 0)) == (n, 0) for k in ("inspect",)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
