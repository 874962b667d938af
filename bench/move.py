"""Benchmark ``redrive move --execute`` against hand-written boto3 loops, on a local SQS.

One server (a subprocess on 127.0.0.1, so its CPU time can be read from /proc/<pid>/stat):
``fast`` is bench/fast_sqs.py (imported by path and run in the child; every operation O(1)),
``moto`` is moto's server as the project's sandbox runs it (serial: one request at a time,
because moto 5.2's threaded server is not safe for concurrent receives on one queue; its
SendMessage, DeleteMessage and visibility changes cost time proportional to queue depth).

Per size N and round, for each contender, in a rotating order (round 1: ABCDEFG, round 2:
BCDEFGA, ...: interleaved, so drift of a busy machine hits every contender alike):

1. fresh queues: onion-checkout-dlq and onion-checkout (RedrivePolicy to the DLQ,
   maxReceiveCount 5) are deleted and created again;
2. the DLQ is seeded with N realistic Celery messages (``redrive.sandbox.encoder.encode``: five
   tasks, protocol 1 and 2, some compressed, some with an eta, some with message
   attributes, one in 200 not Celery at all; every one movable: none expired, none poison)
   through SendMessageBatch, sent as raw JSON-protocol requests (not timed);
3. the contender runs as a subprocess of its own, started by a small launcher process
   (``_LAUNCHER``: a child forked from this large process would inherit its RSS high-water
   mark in ru_maxrss); wall time is spawn to exit, peak RSS and CPU come from ``os.wait4``
   (ru_maxrss is KiB on Linux), the server's CPU seconds during the run from /proc, and each
   contender also reports its own timer (after interpreter start-up, imports and client
   creation);
4. afterwards the target must hold exactly N messages (visible; none in flight or
   delayed) and the DLQ none, and redrive's JSON must say moved == N, failed == 0,
   in_doubt == 0; a run that fails a check is reported and left out of the medians.

Contenders (``--tools``):

- ``redrive``: ``python -m redrive move checkout --execute --yes --json --include-unknown
  --ledger FRESH`` (SQLite ledger on, default settings: one worker, lease 30 s; the bodies
  that are not Celery tasks move too, as they do in the loops);
- ``redrive-w1`` / ``redrive-w4``: the same with ``--workers 1`` / ``--workers 4``;
- ``batched`` / ``batched-4``: the minimal loop a person would write with boto3: receive 10
  (message attributes included), SendMessageBatch the 10 bodies and attributes to the
  source queue, DeleteMessageBatch the ones SQS confirmed; stop at the first empty
  receive; 1 thread, or 4 threads each with its own client (to set beside --workers 4);
- ``per-message``: receive 1, SendMessage 1, DeleteMessage 1 (boto3);
- ``null`` / ``null-4``: the *server's ceiling*: the same three batched calls as raw JSON
  over one keep-alive HTTP connection per thread (no botocore: no signing, no request
  validation, no response parsing beyond ``json.loads``). No client can do less per
  message, so its rate bounds what any client reaches on that server. The tables also
  give N / (server CPU seconds of the run): the rate at which the server would be busy
  all the time with that client's calls.

More contenders (``--tools`` only; see ``EXTRA_TOOLS``): ``redrive-shm`` (ledger on
tmpfs), ``batched-shaped`` (the batched loop sending redrive's requests); 16 threads:
``redrive-w16`` (``--workers 16``), ``redrive-p2-w16`` (``--processes 2 --workers 16``; a
redrive without ``--processes`` fails its check, said so), ``batched-16`` and ``null-16``;
``redrive-before`` (redrive from the tree ``--before DIR``, e.g. main's, in the same rounds);
purges: ``purge-archive`` (``redrive purge --execute`` archiving to a local file),
``purge-filtered`` (``--no-archive --task '*'``: a filtered purge drains, an unfiltered one
is one PurgeQueue call) and ``receive-delete`` (the batched loop: receive 10, delete them).
A purge run is checked for an empty DLQ, an empty target, ``purged`` == N and, archiving,
``archived`` == N. ``peak RSS MB`` is the contender's own, ``child RSS MB`` the largest of
its children's (``--processes``; RUSAGE_CHILDREN at its exit).
``--sqs-client lean|botocore`` gives every redrive contender that SQS client; ``both`` runs
each redrive contender twice a round, ``TOOL@lean`` and ``TOOL@botocore`` (interleaved like
any contenders), and prints lean / botocore (msgs/s and client CPU, same rounds).
``--profile-size N`` adds a step timer and a cProfile (every thread) of one redrive run of N
messages.

Ledgers and sizes (issue 40): ``--ledger-kind postgres`` gives every redrive move contender a
PostgreSQL ledger (``TOOL+pg``: a fresh schema a run, dropped after it, on a private server
this script starts as tests/postgres_server.py does, fsync on, or ``--postgres-url``'s);
``both`` runs each twice a round, on SQLite and on PostgreSQL. ``--interleave-sizes`` runs
round r of every size before round r+1 of any (``--large-rounds`` still sets the rounds at
100,000 and more), so a machine's drift spreads over the sizes too; the lines after the
table give, per contender, the largest size against the smallest: throughput, client CPU
a message and peak RSS. ``--child-timeout`` (default 1,800 s) bounds one run: a move of
1,000,000 on a loaded machine needs more.

Long polling: ``--receive-wait`` (default 0) is given to every contender alike: redrive
through REDRIVE_RECEIVE_WAIT, the loops as WaitTimeSeconds. With 0, a drained queue is
noticed at once by every contender (redrive stops at an empty receive once SQS counts
nothing visible, the loops at their first empty receive).

Usage (from the repository root, with the project's venv)::

    .venv/bin/python bench/move.py --server fast --sizes 1000,10000,100000 --rounds 3
    .venv/bin/python bench/move.py --server moto --sizes 1000 --rounds 2
    .venv/bin/python bench/move.py --server fast --sizes 10000 --rounds 3 \
        --tools redrive,redrive-shm,batched --profile-size 10000
    .venv/bin/python bench/move.py --server fast --sizes 1000000,10000 --rounds 3 \
        --large-rounds 1 --tools redrive --ledger-kind both --interleave-sizes \
        --child-timeout 5400

bench/README.md (section "move") has the commands behind its tables and what they show.

Every request goes to 127.0.0.1; every loop and every child process is bounded.
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder is sys.path[0], and bench/inspect.py would shadow the
# standard library's ``inspect`` module (dataclasses, boto3 ... import it). Drop the folder.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
# The repository root instead: what both scripts share is bench/common.py.
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import contextlib  # noqa: E402
import http.client  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Iterator, Sequence  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

from bench import ledger_scale  # noqa: E402
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
    TASKS,
    arguments,
    child_env,
    log,
    median,
    parse_sizes,
)

FAST_SQS_PATH = os.path.join(_HERE, "fast_sqs.py")
SHM = "/dev/shm"

TOOLS = (
    "redrive",
    "redrive-w1",
    "redrive-w4",
    "batched",
    "batched-4",
    "per-message",
    "null",
    "null-4",
)
#: Diagnostic variants, not run by default (see bench/README.md):
#: - redrive-shm: redrive with its ledger on tmpfs (/dev/shm: fsync costs nothing, so the
#:   best any fsync fix can do);
#:   (redrive-relaxed and redrive-tuned, which patched in a one-fsync-per-batch ledger and
#:   botocore's parameter validation off, were retired once redrive itself did both);
#: - batched-shaped: the batched loop sending what redrive sends, the way redrive sends it
#:   (system attributes received, three redrive-* attributes stamped on every message,
#:   adaptive retries, a second client for sends): what redrive's requests cost by themselves.
#: - redrive-where: redrive with ``--where EXPR`` (``--where``; issue 15's target is at least
#:   0.9x redrive's throughput without it, same run).
EXTRA_TOOLS = (
    "redrive-shm",
    "redrive-shm-w4",
    "batched-shaped",
    "redrive-where",
    # Issue 17: 16 threads, and --processes 2 (a run of redrive without --processes fails
    # its check, "no --processes"); all four with --latency-ms 20 are the targets.
    "redrive-w16",
    "redrive-p2-w16",
    "batched-16",
    "null-16",
    # redrive from another tree (--before DIR, e.g. main's), default settings: the same
    # engine before and after a change, in the same rounds.
    "redrive-before",
    # Purge (the DLQ is emptied, the target gets nothing): an archive to a local file, a
    # filtered --no-archive purge (every message matches), and the batched loop that
    # receives 10 and deletes what it received (no archive, no ledger).
    "purge-archive",
    "purge-filtered",
    "receive-delete",
)
PURGE_TOOLS = ("purge-archive", "purge-filtered", "receive-delete")
NO_PROCESSES = "this redrive has no --processes (exit 2)"
#: Issue 17's ratios, printed per size when both ran (median of per-round ratios).
PAIRS = (
    ("redrive-p2-w16", "redrive-w16"),
    ("redrive-w16", "batched-16"),
    ("redrive-where", "redrive"),
    ("redrive", "redrive-before"),
)
#: --before DIR: the tree redrive-before runs from.
BEFORE: list[str] = []
#: --sqs-client lean|botocore: the client every redrive contender is given (empty: its own
#: default). With ``both`` each redrive contender runs twice a round, as ``TOOL@lean`` and
#: ``TOOL@botocore`` (interleaved like any two contenders), and lean / botocore is printed.
SQS_CLIENT: list[str] = []
SQS_CLIENTS = ("lean", "botocore")
#: --ledger-kind postgres|both: a redrive contender named ``TOOL+pg`` runs with a PostgreSQL
#: ledger (a fresh schema a run, on the private server this script starts, or
#: --postgres-url's), not a fresh SQLite file. POSTGRES holds that server's URL.
PG = "+pg"
POSTGRES: list[str] = []
LEDGER_KINDS = ("sqlite", "postgres", "both")


def split_client(tool: str) -> tuple[str, str | None]:
    """A contender's name without its ``+pg`` and ``@client``, and the SQS client it runs
    (None: the redrive default)."""
    name, _, client = tool.partition("@")
    return name.removesuffix(PG), client or (SQS_CLIENT[0] if SQS_CLIENT else None)


def with_ledgers(tools: Sequence[str], kind: str) -> list[str]:
    """--ledger-kind: each redrive move contender with SQLite (``TOOL``), PostgreSQL
    (``TOOL+pg``) or both (two contenders, interleaved like any two)."""
    out: list[str] = []
    for tool in tools:
        movable = tool.startswith("redrive") and not tool.startswith(("redrive-shm", "redrive-b"))
        if not movable or kind == "sqlite":
            out.append(tool)
        else:
            out += [tool, tool + PG] if kind == "both" else [tool + PG]
    return out


def with_clients(tools: Sequence[str], choice: str | None) -> list[str]:
    """``--sqs-client both``: each redrive contender (not redrive-before, whose tree may
    lack the switch) as two, one per client."""
    if choice != "both":
        return list(tools)
    out: list[str] = []
    for tool in tools:
        if tool.startswith(("redrive", "purge-")) and tool != "redrive-before":
            out += [f"{tool}@{client}" for client in SQS_CLIENTS]
        else:
            out.append(tool)
    return out


def pairs_of(tools: Sequence[str]) -> list[tuple[str, str]]:
    """The ratios printed: PAIRS, per client when contenders run on both, and lean /
    botocore for each contender that ran on both."""
    present = set(tools)
    out: list[tuple[str, str]] = []
    for tool, base in PAIRS:
        for client in ("", *(f"@{c}" for c in SQS_CLIENTS)):
            other = f"{base}{client}" if f"{base}{client}" in present else base
            if f"{tool}{client}" in present and other in present:
                out.append((f"{tool}{client}", other))
    for tool in tools:
        name, client = tool.partition("@")[::2]
        if client == "lean" and f"{name}@botocore" in present:
            out.append((tool, f"{name}@botocore"))
    return out


# Reads a kwarg of every message (every message's arguments are decoded) and matches every
# one (a body that is not a Celery task has null kwargs: null != 'EUR'), so both move N.
DEFAULT_WHERE = "kwargs.currency != 'EUR'"
WHERE = [DEFAULT_WHERE]
#: The batched loop each contender is compared with (same number of pipelines).
BASELINE = {
    "batched-shaped": "batched",
    "redrive": "batched",
    "redrive-shm": "batched",
    "redrive-shm-w4": "batched-4",
    "redrive-w1": "batched",
    "redrive-w4": "batched-4",
    "redrive-where": "batched",
    "batched-4": "batched",
    "per-message": "batched",
    "null": "batched",
    "null-4": "batched-4",
    "redrive-w16": "batched-16",
    "redrive-p2-w16": "batched-16",
    "batched-16": "batched",
    "null-16": "batched-16",
    "redrive-before": "batched",
    "purge-archive": "receive-delete",
    "purge-filtered": "receive-delete",
}
#: Seconds one contender may take before it is killed (--child-timeout: a move of 1,000,000
#: on a loaded machine takes longer).
CHILD_TIMEOUT = [1_800]
SEED_TIMEOUT = 1_800  # seconds seeding one DLQ may take
#: Operations this benchmark needs from the server (fast_sqs is checked for them at start).
NEEDED_OPERATIONS = (
    "CreateQueue",
    "DeleteQueue",
    "GetQueueUrl",
    "GetQueueAttributes",
    "SetQueueAttributes",
    "ListDeadLetterSourceQueues",
    "SendMessage",
    "SendMessageBatch",
    "ReceiveMessage",
    "DeleteMessage",
    "DeleteMessageBatch",
    "ChangeMessageVisibilityBatch",
)


def load_fast_sqs() -> ModuleType:
    """bench/fast_sqs.py as a module (imported by path: bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location("fast_sqs", FAST_SQS_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The server children. Both print their endpoint on the first line of stdout.
_FAST_SERVER = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("fast_sqs", {FAST_SQS_PATH!r})
fast_sqs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fast_sqs)
sys.exit(fast_sqs.main(["--host", {HOST!r}, "--port", "0", *sys.argv[1:]]))
"""
_MOTO_SERVER = f"""
import signal, threading
from redrive.sandbox import start_server
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
signal.signal(signal.SIGINT, lambda *_: stop.set())
with start_server(0, host={HOST!r}, serial=True, extended=False) as server:
    print("moto: SQS on " + server.endpoint_url, flush=True)
    while not stop.wait(0.5):
        pass
"""


# redrive's CLI with a timer (wall and CPU time of the calling thread) around each step of
# the move engine; the totals go to the file named by BENCH_PHASES_OUT. Far less overhead
# than cProfile, so the shares are those of an ordinary run.
_PHASES = """
import atexit, functools, json, os, sys, time
import redrive.broker.sqs.calls, redrive.dlq.scan, redrive.ledger
import redrive.operations.move.candidate, redrive.operations.move.copies
import redrive.operations.move.decide, redrive.operations.move.engine, redrive.operations.move.send
stats = {}
def timed(owner, name, label):
    original = getattr(owner, name)
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            entry = stats.setdefault(label, [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - wall
            entry[2] += time.thread_time() - cpu
    setattr(owner, name, wrapper)
for name in ("get_many", "claim_many", "mark_sent_many", "mark_done_many", "heartbeat"):
    timed(redrive.ledger.SqliteLedger, name, "ledger." + name)
for name in ("receive", "send_batch", "delete_batch", "change_visibility_batch"):
    timed(redrive.broker.sqs.calls.SqsCalls, name, "sqs." + name)
for name in ("run", "_decide", "_execute"):
    timed(redrive.operations.move.engine.MoveEngine, name, "engine." + name)
# The engine's steps that moved to its parts keep their labels (comparable with earlier runs).
timed(redrive.operations.move.copies.KeySettler, "entries_for", "engine._entries_for")
timed(redrive.operations.move.send.Sender, "entry", "engine._entry")
timed(redrive.operations.move.decide, "decode", "messages.decode")
import redrive.selection
timed(redrive.selection.Selection, "matches", "selection.matches")  # --where runs in it
timed(redrive.operations.move.candidate, "key_for", "keys.key_for")
started = time.perf_counter()
def report():
    stats["process"] = [1, time.perf_counter() - started, time.process_time()]
    with open(os.environ["BENCH_PHASES_OUT"], "w") as out:
        json.dump(stats, out)
atexit.register(report)
"""
# botocore checks every request against the service model before sending it; redrive builds
# its requests itself, so the check only costs CPU (botocore.config.Config's
# parameter_validation=False turns it off).
_MAIN = """
import sys
from redrive.cli import main
sys.exit(main())
"""
# Every redrive contender runs through this: at its exit it writes its own peak RSS and the
# largest of its children's (RUSAGE_CHILDREN: --processes), both KiB, to BENCH_RSS_OUT. The
# launcher's os.wait4 sees only the larger of the two.
_RSS = """
import atexit, json, os, resource
def _bench_rss():
    path = os.environ.get("BENCH_RSS_OUT")
    if path:
        with open(path, "w") as out:
            json.dump({"self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                       "children": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}, out)
atexit.register(_bench_rss)
"""
# cProfile, in every thread (python -m cProfile sees the main thread only: a worker's second
# stage, the hold renewer and --workers threads would be missing). The threads' profiles are
# merged at exit into the file named by BENCH_PROFILE_OUT.
_PROFILE_THREADS = """
import atexit, cProfile, os, pstats, threading
_profiles = [cProfile.Profile()]
_thread_run = threading.Thread.run
def _profiled_run(self):
    profile = cProfile.Profile()
    _profiles.append(profile)
    profile.enable()
    try:
        _thread_run(self)
    finally:
        profile.disable()
threading.Thread.run = _profiled_run
def _dump_profiles():
    _profiles[0].disable()
    merged = pstats.Stats(_profiles[0])
    for profile in _profiles[1:]:
        try:
            merged.add(profile)
        except TypeError:  # a thread that never ran
            pass
    merged.dump_stats(os.environ["BENCH_PROFILE_OUT"])
atexit.register(_dump_profiles)
_profiles[0].enable()
"""


# -- a raw JSON-protocol SQS client (seeding, checks, and the "null" contender) ---------------


class RawSqs:
    """SQS's JSON protocol over one keep-alive HTTP connection, without botocore.

    The Authorization header is a syntactically valid SigV4 header with a fake signature:
    moto reads the service and region from its credential scope; neither server checks it.
    """

    def __init__(self, endpoint: str, *, timeout: float = 300) -> None:
        parts = urlsplit(endpoint)
        if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"refusing to talk to {endpoint}: loopback only")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.timeout = timeout
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        self.headers = {
            "Content-Type": "application/x-amz-json-1.0",
            "Authorization": (
                f"AWS4-HMAC-SHA256 Credential=bench/20260101/{REGION}/sqs/aws4_request, "
                "SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature=" + "0" * 64
            ),
            "X-Amz-Date": "20260101T000000Z",
        }

    def call_raw(self, operation: str, body: bytes) -> dict[str, Any]:
        headers = {**self.headers, "X-Amz-Target": f"AmazonSQS.{operation}"}
        for attempt in (1, 2):
            try:
                self.conn.request("POST", "/", body=body, headers=headers)
                response = self.conn.getresponse()
                data = response.read()
                break
            except (ConnectionError, http.client.HTTPException):
                # A keep-alive connection the server closed: reconnect once. Only for calls
                # that are safe to repeat (the benchmark's own; never counted as moves).
                self.conn.close()
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
                if attempt == 2:
                    raise
        if response.status != 200:
            raise RuntimeError(f"{operation}: HTTP {response.status}: {data[:300]!r}")
        return json.loads(data) if data else {}

    def call(self, operation: str, **request: Any) -> dict[str, Any]:
        return self.call_raw(operation, json.dumps(request).encode("utf-8"))

    def close(self) -> None:
        self.conn.close()


def clean_attributes(raw: dict[str, Any] | None) -> dict[str, Any]:
    """Only the fields SendMessage accepts (a receive may add empty list fields)."""
    out = {}
    for name, value in (raw or {}).items():
        kept = {"DataType": value["DataType"]}
        for key in ("StringValue", "BinaryValue"):
            if key in value:
                kept[key] = value[key]
        out[name] = kept
    return out


# -- the contenders that are not redrive (each runs in its own process) ----------------------


_SESSIONS: list[Any] = []


def _boto3_client() -> Any:
    """A client of one shared session (made one after the other, before any thread starts:
    clients are thread-safe, sessions are not), as redrive makes its workers' clients. A
    session per client cost the 16-thread loop 117 MB of peak RSS and 0.6 s of CPU at
    10,000 messages."""
    import boto3

    if not _SESSIONS:
        # Endpoint, region and credentials from the environment, like redrive's.
        _SESSIONS.append(boto3.session.Session())
    return _SESSIONS[0].client("sqs")


def _shaped_clients() -> tuple[Any, Any]:
    """Two clients configured as redrive's (redrive.aws.session.AwsSettings): adaptive
    retries, and a second one that never retries by itself, for sends."""
    import boto3
    from botocore.config import Config

    def client(attempts: int) -> Any:
        config = Config(
            retries={"mode": "adaptive", "total_max_attempts": attempts},
            connect_timeout=5,
            read_timeout=40,
            max_pool_connections=20,
        )
        return boto3.session.Session().client("sqs", config=config)

    return client(6), client(1)


def _stamp(attributes: dict[str, Any], message_id: str) -> dict[str, Any]:
    """What redrive adds to each message it sends (redrive.attributes.stamped)."""
    return {
        **attributes,
        "redrive-count": {"DataType": "Number", "StringValue": "1"},
        "redrive-key": {"DataType": "String", "StringValue": f"celery:{message_id}:r0:g0:0a1b2c3d"},
        "redrive-dlq": {"DataType": "String", "StringValue": DLQ},
    }


def batched_loop(expect: int, threads: int, wait: int, *, shaped: bool = False) -> dict[str, Any]:
    """receive 10 -> SendMessageBatch 10 -> DeleteMessageBatch 10, in ``threads`` threads.

    ``shaped``: with redrive's requests (see EXTRA_TOOLS), not the minimal ones."""
    if shaped:
        clients, senders = zip(*(_shaped_clients() for _ in range(threads)), strict=True)
    else:
        clients = senders = tuple(_boto3_client() for _ in range(threads))
    extra: dict[str, Any] = {"MessageSystemAttributeNames": ["All"]} if shaped else {}
    started = time.perf_counter()
    moved = [0] * threads
    errors: list[BaseException] = []

    def work(index: int) -> None:
        client, sender = clients[index], senders[index]
        try:
            dlq = client.get_queue_url(QueueName=DLQ)["QueueUrl"]
            target = client.get_queue_url(QueueName=QUEUE)["QueueUrl"]
            for _ in range(expect // 10 + 1_000):  # bounded: the first empty receive ends it
                messages = client.receive_message(
                    QueueUrl=dlq,
                    MaxNumberOfMessages=10,
                    WaitTimeSeconds=wait,
                    VisibilityTimeout=30,
                    MessageAttributeNames=["All"],
                    **extra,
                ).get("Messages", [])
                if not messages:
                    return
                entries = []
                for i, message in enumerate(messages):
                    entry: dict[str, Any] = {"Id": str(i), "MessageBody": message["Body"]}
                    attributes = clean_attributes(message.get("MessageAttributes"))
                    if shaped:
                        attributes = _stamp(attributes, message["MessageId"])
                    if attributes:
                        entry["MessageAttributes"] = attributes
                    entries.append(entry)
                sent = sender.send_message_batch(QueueUrl=target, Entries=entries)
                ok = [int(s["Id"]) for s in sent.get("Successful", [])]
                if ok:
                    client.delete_message_batch(
                        QueueUrl=dlq,
                        Entries=[
                            {"Id": str(i), "ReceiptHandle": messages[i]["ReceiptHandle"]}
                            for i in ok
                        ],
                    )
                moved[index] += len(ok)
        except BaseException as exc:
            errors.append(exc)

    run_threads(work, threads)
    if errors:
        raise errors[0]
    return {"moved": sum(moved), "seconds": time.perf_counter() - started}


def per_message_loop(expect: int, wait: int) -> dict[str, Any]:
    """receive 1 -> SendMessage -> DeleteMessage."""
    client = _boto3_client()
    started = time.perf_counter()
    dlq = client.get_queue_url(QueueName=DLQ)["QueueUrl"]
    target = client.get_queue_url(QueueName=QUEUE)["QueueUrl"]
    moved = 0
    for _ in range(expect + 1_000):  # bounded: the first empty receive ends it
        messages = client.receive_message(
            QueueUrl=dlq,
            MaxNumberOfMessages=1,
            WaitTimeSeconds=wait,
            VisibilityTimeout=30,
            MessageAttributeNames=["All"],
        ).get("Messages", [])
        if not messages:
            break
        message = messages[0]
        request: dict[str, Any] = {"QueueUrl": target, "MessageBody": message["Body"]}
        if message.get("MessageAttributes"):
            request["MessageAttributes"] = clean_attributes(message["MessageAttributes"])
        client.send_message(**request)
        client.delete_message(QueueUrl=dlq, ReceiptHandle=message["ReceiptHandle"])
        moved += 1
    return {"moved": moved, "seconds": time.perf_counter() - started}


def null_loop(expect: int, threads: int, wait: int) -> dict[str, Any]:
    """The batched loop's three calls as raw JSON: the least work any client can do."""
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    raws = [RawSqs(endpoint) for _ in range(threads)]
    started = time.perf_counter()
    moved = [0] * threads
    errors: list[BaseException] = []

    def work(index: int) -> None:
        raw = raws[index]
        try:
            dlq = raw.call("GetQueueUrl", QueueName=DLQ)["QueueUrl"]
            target = raw.call("GetQueueUrl", QueueName=QUEUE)["QueueUrl"]
            receive = json.dumps(
                {
                    "QueueUrl": dlq,
                    "MaxNumberOfMessages": 10,
                    "WaitTimeSeconds": wait,
                    "VisibilityTimeout": 30,
                    "MessageAttributeNames": ["All"],
                }
            ).encode()
            for _ in range(expect // 10 + 1_000):  # bounded: the first empty receive ends it
                messages = raw.call_raw("ReceiveMessage", receive).get("Messages", [])
                if not messages:
                    return
                entries = []
                for i, message in enumerate(messages):
                    entry: dict[str, Any] = {"Id": str(i), "MessageBody": message["Body"]}
                    if message.get("MessageAttributes"):
                        entry["MessageAttributes"] = clean_attributes(message["MessageAttributes"])
                    entries.append(entry)
                sent = raw.call("SendMessageBatch", QueueUrl=target, Entries=entries)
                ok = [int(s["Id"]) for s in sent.get("Successful", [])]
                if ok:
                    raw.call(
                        "DeleteMessageBatch",
                        QueueUrl=dlq,
                        Entries=[
                            {"Id": str(i), "ReceiptHandle": messages[i]["ReceiptHandle"]}
                            for i in ok
                        ],
                    )
                moved[index] += len(ok)
        except BaseException as exc:
            errors.append(exc)

    run_threads(work, threads)
    if errors:
        raise errors[0]
    return {"moved": sum(moved), "seconds": time.perf_counter() - started}


def receive_delete_loop(expect: int, threads: int, wait: int) -> dict[str, Any]:
    """A purge by hand: receive 10 -> DeleteMessageBatch them (no archive, no ledger)."""
    clients = [_boto3_client() for _ in range(threads)]
    started = time.perf_counter()
    deleted = [0] * threads
    errors: list[BaseException] = []

    def work(index: int) -> None:
        client = clients[index]
        try:
            dlq = client.get_queue_url(QueueName=DLQ)["QueueUrl"]
            for _ in range(expect // 10 + 1_000):  # bounded: the first empty receive ends it
                messages = client.receive_message(
                    QueueUrl=dlq,
                    MaxNumberOfMessages=10,
                    WaitTimeSeconds=wait,
                    VisibilityTimeout=30,
                    MessageAttributeNames=["All"],
                ).get("Messages", [])
                if not messages:
                    return
                done = client.delete_message_batch(
                    QueueUrl=dlq,
                    Entries=[
                        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                        for i, m in enumerate(messages)
                    ],
                )
                deleted[index] += len(done.get("Successful", []))
        except BaseException as exc:
            errors.append(exc)

    run_threads(work, threads)
    if errors:
        raise errors[0]
    # "moved" off the DLQ, as the other loops say it.
    return {"moved": sum(deleted), "seconds": time.perf_counter() - started}


def run_threads(work: Any, threads: int) -> None:
    if threads == 1:
        work(0)
        return
    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(CHILD_TIMEOUT[0])


# -- realistic, movable DLQ content ----------------------------------------------------------


def movable_messages(count: int, *, seed: int = 11) -> Iterator[dict[str, Any]]:
    """SendMessageBatch entries (without Id) a checkout DLQ holds, every one of which
    ``redrive move`` sends with default options: distinct task ids, nothing expired,
    no redrive-count at or over --max-redrives (3)."""
    from datetime import UTC, datetime, timedelta

    from redrive.sandbox.encoder import encode

    rng = random.Random(seed)
    names = [name for name, weight in TASKS for _ in range(weight)]
    now = datetime.now(UTC)
    for index in range(count):
        if rng.random() < 0.005:
            # Not written by Celery: redrive keys it by MessageId and moves it all the same.
            yield {"MessageBody": f"legacy cron {rng.randint(1000, 9999)}: resync store {index}"}
            continue
        task = rng.choice(names)
        args, kwargs = arguments(task, rng)
        options: dict[str, Any] = {
            # Random, as Celery's uuid4 task ids are (and so are the ledger's keys: every
            # batch touches pages all over its B-trees, as in production).
            "task_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            "retries": rng.choice((0, 0, 0, 1, 2, 3)),
            "queue": QUEUE,
            "protocol": 1 if rng.random() < 1 / 6 else 2,
        }
        kind = rng.random()
        if kind < 0.02:
            options["compression"] = rng.choice(("gzip", "bzip2"))
        elif kind < 0.10:
            options["expires"] = now + timedelta(days=30)  # not expired: it moves
        elif kind < 0.15:
            options["eta"] = now + timedelta(minutes=rng.choice((-1, 1)) * rng.randint(10, 600))
        elif kind < 0.17:
            options["base64_envelope"] = False
        entry: dict[str, Any] = {"MessageBody": encode(task, args, kwargs, **options)}
        if rng.random() < 0.05:
            entry["MessageAttributes"] = {
                "redrive-count": {"DataType": "Number", "StringValue": str(rng.randint(1, 2))},
                "trace-id": {"DataType": "String", "StringValue": f"{rng.getrandbits(128):032x}"},
            }
        yield entry


class SeedBatches:
    """The SendMessageBatch request bodies (without QueueUrl) for N messages, built once
    per size and reused by every run of that size."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.batches: list[list[dict[str, Any]]] = []
        batch: list[dict[str, Any]] = []
        for index, entry in enumerate(movable_messages(count)):
            batch.append({"Id": str(index % 10), **entry})
            if len(batch) == 10:
                self.batches.append(batch)
                batch = []
        if batch:
            self.batches.append(batch)
        self.body_bytes = sum(len(e["MessageBody"]) for b in self.batches for e in b)


# -- servers ---------------------------------------------------------------------------------


@dataclass
class Server:
    kind: str
    process: subprocess.Popen[bytes]
    endpoint: str

    def cpu_seconds(self) -> float:
        """utime + stime of the server process (all its threads) so far."""
        with open(f"/proc/{self.process.pid}/stat", encoding="ascii") as stat:
            data = stat.read()
        fields = data[data.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        with open(f"/proc/{self.process.pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(15)


def start_server(kind: str, latency_ms: float = 0.0) -> Server:
    code = _FAST_SERVER if kind == "fast" else _MOTO_SERVER
    extra = ["--latency-ms", str(latency_ms)] if kind == "fast" and latency_ms else []
    process = subprocess.Popen(
        [PYTHON, "-P", "-c", code, *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert process.stdout is not None
    line: list[bytes] = []
    reader = threading.Thread(target=lambda: line.append(process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(60)
    text = line[0].decode("utf-8", "replace").strip() if line else ""
    if not text or " on http://" not in text:
        process.kill()
        process.wait(15)
        raise RuntimeError(f"the {kind} server did not start (first line: {text!r})")
    endpoint = text.rsplit(" on ", 1)[1]
    if urlsplit(endpoint).hostname != HOST:
        process.kill()
        raise RuntimeError(f"the {kind} server is not on {HOST}: {endpoint}")
    # Its stdout is not read again; nothing more is printed on it.
    return Server(kind, process, endpoint)


# -- queues ------------------------------------------------------------------------------------


def fresh_family(raw: RawSqs) -> tuple[str, str]:
    """Delete and create onion-checkout-dlq and onion-checkout; return (dlq, queue) URLs."""
    for name in (QUEUE, DLQ):
        try:
            url = raw.call("GetQueueUrl", QueueName=name)["QueueUrl"]
        except RuntimeError:
            continue  # not there
        raw.call("DeleteQueue", QueueUrl=url)
    dlq_url = raw.call(
        "CreateQueue",
        QueueName=DLQ,
        Attributes={"MessageRetentionPeriod": str(DLQ_RETENTION)},
    )["QueueUrl"]
    arn = raw.call("GetQueueAttributes", QueueUrl=dlq_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": MAX_RECEIVE_COUNT})
    queue_url = raw.call("CreateQueue", QueueName=QUEUE, Attributes={"RedrivePolicy": policy})[
        "QueueUrl"
    ]
    return dlq_url, queue_url


#: Connections that seed a DLQ at once: 1 on loopback; with --latency-ms, 16, since one
#: connection would wait a round trip per 10 messages (100,000 at 20 ms: 200 s).
SEED_CONNECTIONS = [1]


def seed(raw: RawSqs, dlq_url: str, batches: SeedBatches) -> None:
    connections = min(SEED_CONNECTIONS[0], len(batches.batches))
    if connections <= 1:
        seed_batches(raw, dlq_url, batches.batches)
        return
    endpoint = f"http://{raw.host}:{raw.port}"
    errors: list[BaseException] = []

    def work(index: int) -> None:
        own = RawSqs(endpoint)
        try:
            seed_batches(own, dlq_url, batches.batches[index::connections])
        except BaseException as exc:
            errors.append(exc)
        finally:
            own.close()

    run_threads(work, connections)
    if errors:
        raise errors[0]


def seed_batches(raw: RawSqs, dlq_url: str, batches: Sequence[list[dict[str, Any]]]) -> None:
    deadline = time.monotonic() + SEED_TIMEOUT
    prefix = json.dumps({"QueueUrl": dlq_url})[:-1].encode() + b', "Entries": '
    for batch in batches:
        body = prefix + json.dumps(batch).encode("utf-8") + b"}"
        response = raw.call_raw("SendMessageBatch", body)
        if response.get("Failed") or len(response.get("Successful", [])) != len(batch):
            raise RuntimeError(f"seeding: SendMessageBatch failed: {response.get('Failed')}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"seeding took more than {SEED_TIMEOUT} s")


def depth(raw: RawSqs, url: str) -> tuple[int, int, int]:
    attrs = raw.call(
        "GetQueueAttributes",
        QueueUrl=url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    return (
        int(attrs["ApproximateNumberOfMessages"]),
        int(attrs["ApproximateNumberOfMessagesNotVisible"]),
        int(attrs.get("ApproximateNumberOfMessagesDelayed", 0)),
    )


# -- one measured run --------------------------------------------------------------------------


def redrive_command(
    tool: str, ledger: str, *, profile_out: str | None = None, phases: bool = False
) -> list[str]:
    """The command of a redrive contender: ``redrive[-pP][-wN]``, ``redrive-shm[-wN]``,
    ``redrive-where``, ``redrive-before`` (see EXTRA_TOOLS), or a purge; ``@lean`` or
    ``@botocore`` (or --sqs-client) adds ``--sqs-client``."""
    tool, client = split_client(tool)
    patches = _RSS + (_PHASES if phases else "") + (_PROFILE_THREADS if profile_out else "")
    head = [PYTHON, "-c", patches + _MAIN]
    if client:
        head += ["--sqs-client", client]
    if tool.startswith("purge-"):
        return [*head, *purge_arguments(tool, ledger)]
    # --include-unknown: the loops move the bodies that are not Celery tasks too.
    command = [*head, "move", FAMILY, "--execute", "--yes", "--json", "--include-unknown"]
    command += ["--ledger", ledger]
    if (workers := re.search(r"-w(\d+)$", tool)) is not None:
        command += ["--workers", workers.group(1)]
    if (processes := re.search(r"-p(\d+)-", tool)) is not None:
        command += ["--processes", processes.group(1)]
    if tool == "redrive-where":
        command += ["--where", WHERE[0]]
    return command


def purge_arguments(tool: str, ledger: str) -> list[str]:
    """``redrive purge`` archiving to a fresh local file next to the ledger, or deleting
    without an archive under a filter every message passes (unfiltered, --no-archive would
    be one PurgeQueue call, not a drain)."""
    arguments = ["purge", FAMILY, "--execute", "--yes", "--json", "--ledger", ledger]
    if tool == "purge-archive":
        return [*arguments, "--archive", ledger + ".archive.jsonl.gz"]
    return [*arguments, "--no-archive", "--task", "*"]


def threads_of(tool: str) -> int:
    """The threads of a hand-written loop: ``batched-16`` 16, ``batched`` 1."""
    last = tool.rsplit("-", 1)[-1]
    return int(last) if last.isdigit() else 1


def tool_command(tool: str, n: int, ledger: str, wait: int) -> list[str]:
    if tool.startswith(("redrive", "purge-")):
        return redrive_command(tool, ledger)
    kind = {"per-message": "per-message", "receive-delete": "receive-delete"}.get(tool)
    me = [PYTHON, "-P", os.path.abspath(__file__), "--child", kind or tool.split("-")[0]]
    if tool == "batched-shaped":
        me.append("--shaped")
    threads = "1" if tool == "batched-shaped" else str(threads_of(tool))
    return [*me, "--threads", threads, "--expect", str(n), "--receive-wait", str(wait)]


def tool_tree(tool: str) -> str:
    """The tree a contender's redrive comes from: --before's for redrive-before."""
    return BEFORE[0] if split_client(tool)[0] == "redrive-before" and BEFORE else ROOT


@dataclass
class Run:
    server: str
    n: int
    tool: str
    round: int
    wall_s: float
    own_s: float | None
    peak_rss_mb: float
    """The contender's own (the parent's, with --processes)."""
    client_cpu_s: float
    server_cpu_s: float
    moved: int | None
    target_after: tuple[int, int, int]
    dlq_after: tuple[int, int, int]
    ok: bool
    problem: str = ""
    load_before: float = 0.0
    seed_s: float = 0.0
    child_rss_mb: float = 0.0
    """The largest peak RSS among the contender's children (--processes); 0 without."""

    @property
    def rate_wall(self) -> float:
        return self.n / self.wall_s

    @property
    def rate_own(self) -> float | None:
        return self.n / self.own_s if self.own_s else None


# Each contender is started by this small launcher, not by the benchmark itself: Linux
# carries a process's RSS high-water mark over fork and exec into the child's ru_maxrss, so a
# child forked straight from this (large: it holds the seed messages) process would report
# this process's RSS as its own peak. The launcher is a fresh, small interpreter; it spawns
# the contender, waits for it with os.wait4 and writes the contender's own rusage and its
# wall time (spawn to exit) to a file.
_LAUNCHER = """
import json, os, sys, time
out, command = sys.argv[1], sys.argv[2:]
started = time.perf_counter()
pid = os.posix_spawn(command[0], command, os.environ)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - started
with open(out, "w") as f:
    json.dump({"wall": wall, "maxrss_kib": usage.ru_maxrss, "utime": usage.ru_utime,
               "stime": usage.ru_stime, "exit": os.waitstatus_to_exitcode(status)}, f)
sys.exit(0)
"""


@dataclass
class ChildResult:
    exit: int
    wall_s: float
    peak_rss_mb: float
    cpu_s: float
    stdout: str
    stderr: str


def run_child(
    command: list[str], env: dict[str, str], timeout: float, cwd: str = ROOT
) -> ChildResult:
    """Run ``command`` through the launcher; kill its process group after ``timeout`` s."""
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.NamedTemporaryFile(suffix=".json") as usage_file,
    ):
        launcher = subprocess.Popen(
            [PYTHON, "-I", "-S", "-c", _LAUNCHER, usage_file.name, *command],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=err,
            start_new_session=True,  # its own process group: a timeout kills it and the child
        )
        try:
            launcher.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(60)
        except BaseException:  # Ctrl-C, SIGTERM: take the contender down with us
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(60)
            raise
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
        try:
            with open(usage_file.name, encoding="utf-8") as f:
                usage = json.load(f)
        except (OSError, ValueError):
            usage = {"wall": timeout, "maxrss_kib": 0, "utime": 0, "stime": 0, "exit": -9}
    return ChildResult(
        exit=int(usage["exit"]),
        wall_s=float(usage["wall"]),
        peak_rss_mb=usage["maxrss_kib"] / 1024,
        cpu_s=float(usage["utime"]) + float(usage["stime"]),
        stdout=stdout,
        stderr=stderr,
    )


def contender_env(server: Server, state: str, wait: int, tool: str) -> dict[str, str]:
    env = child_env(server.endpoint, state, wait)
    if tool_tree(tool) != ROOT:
        env["PYTHONPATH"] = tool_tree(tool)  # that tree's redrive, not this one's
    return env


def measure(
    server: Server,
    raw: RawSqs,
    batches: SeedBatches,
    tool: str,
    rnd: int,
    state: str,
    wait: int,
) -> Run:
    n = batches.count
    dlq_url, queue_url = fresh_family(raw)
    seed_started = time.perf_counter()
    seed(raw, dlq_url, batches)
    seed_s = time.perf_counter() - seed_started
    seeded = depth(raw, dlq_url)
    if seeded != (n, 0, 0):
        raise RuntimeError(f"seeding left {seeded} (visible, in flight, delayed), expected {n}")
    env = contender_env(server, state, wait, tool)
    # The ledger is a fresh file in the temporary directory (on disk, like the default
    # ~/.local/state), or, for the redrive-shm variants, in /dev/shm (tmpfs: fsync is free).
    ledger_dir = SHM if tool.startswith("redrive-shm") else state
    ledger = os.path.join(
        ledger_dir, f"redrive-bench-ledger-{os.getpid()}-{tool}-{rnd}-{n}.sqlite3"
    )
    env["BENCH_RSS_OUT"] = ledger + ".rss.json"
    where = _pg_ledger(n, rnd) if PG in tool else ledger
    load = os.getloadavg()[0]
    cpu_before = server.cpu_seconds()
    child = run_child(tool_command(tool, n, where, wait), env, CHILD_TIMEOUT[0], tool_tree(tool))
    server_cpu = server.cpu_seconds() - cpu_before
    if where != ledger:
        ledger_scale.drop_schema(where)
    wall, stdout, stderr = child.wall_s, child.stdout, child.stderr
    rss = {"self": child.peak_rss_mb * 1024, "children": 0}
    with contextlib.suppress(OSError, ValueError), open(env["BENCH_RSS_OUT"]) as f:
        rss = json.load(f)
    archive = ledger + ".archive.jsonl.gz"
    archived_bytes = os.path.getsize(archive) if os.path.exists(archive) else 0
    for suffix in ("", "-wal", "-shm", ".rss.json", ".archive.jsonl.gz"):
        if os.path.exists(ledger + suffix):
            os.remove(ledger + suffix)
    target_after = depth(raw, queue_url)
    dlq_after = depth(raw, dlq_url)
    problems = []
    moved = own_s = None
    if child.exit != 0:
        if "No such option" in stderr and "--processes" in stderr:
            problems.append(NO_PROCESSES)
        else:
            problems.append(f"exit {child.exit}: {stderr.strip()[-300:]}")
    try:
        data = json.loads(stdout)
        moved, own_s = moved_by(tool, data), float(data["seconds"])
        if moved != n:
            problems.append(f"moved {moved}, expected {n}")
        if tool.startswith(("redrive", "purge-")) and (data.get("failed") or data.get("in_doubt")):
            problems.append(f"failed {data.get('failed')}, in doubt {data.get('in_doubt')}")
        if tool.startswith("purge-archive") and (data.get("archived") != n or not archived_bytes):
            problems.append(f"archived {data.get('archived')} ({archived_bytes:,} bytes written)")
    except (ValueError, KeyError, TypeError):
        if not problems:
            problems.append(f"no JSON result: {stdout.strip()[-200:]!r} {stderr.strip()[-300:]}")
    # A move leaves every message in the target, a purge none.
    expected = (0, 0, 0) if split_client(tool)[0] in PURGE_TOOLS else (n, 0, 0)
    # A redrive without --processes did nothing: that is the whole story.
    did_nothing = problems[:1] == [NO_PROCESSES]
    if target_after != expected and not did_nothing:
        problems.append(
            f"target holds {target_after} (visible, in flight, delayed), not {expected[0]}"
        )
    if dlq_after != (0, 0, 0) and not did_nothing:
        problems.append(f"DLQ holds {dlq_after} (visible, in flight, delayed), not 0")
    return Run(
        server=server.kind,
        n=n,
        tool=tool,
        round=rnd,
        wall_s=wall,
        own_s=own_s,
        peak_rss_mb=rss["self"] / 1024,
        child_rss_mb=rss["children"] / 1024,
        client_cpu_s=child.cpu_s,
        server_cpu_s=server_cpu,
        moved=moved,
        target_after=target_after,
        dlq_after=dlq_after,
        ok=not problems,
        problem="; ".join(problems),
        load_before=load,
        seed_s=seed_s,
    )


def _pg_ledger(n: int, rnd: int) -> str:
    """A fresh PostgreSQL ledger (an empty schema of its own on POSTGRES's server)."""
    return ledger_scale.fresh_schema(POSTGRES[0], f"bench_move_{os.getpid()}_{rnd}_{n}")


def moved_by(tool: str, data: dict[str, Any]) -> int:
    """What a contender's JSON says it took off the DLQ: moved, or purged."""
    return int(data["purged"] if tool.startswith("purge-") else data["moved"])


# -- the benchmark -----------------------------------------------------------------------------


@dataclass
class SizeResult:
    server: str
    n: int
    body_bytes: int
    runs: list[Run] = field(default_factory=list)


def tools_for(n: int, tools: Sequence[str], per_message_max: int) -> list[str]:
    return [t for t in tools if t != "per-message" or n <= per_message_max]


def bench_size(
    server: Server,
    n: int,
    rounds: int,
    tools: Sequence[str],
    wait: int,
    *,
    quiet: bool = False,
) -> SizeResult:
    return bench_sizes(server, [(n, rounds, tools)], wait, quiet=quiet)[0]


def bench_sizes(
    server: Server,
    plan: Sequence[tuple[int, int, Sequence[str]]],
    wait: int,
    *,
    quiet: bool = False,
) -> list[SizeResult]:
    """Each (size, rounds, contenders) of ``plan``; round r of every size before round r+1
    of any (--interleave-sizes: a machine's drift spreads over the sizes too), each round's
    contenders in a rotated order."""
    results, seeds = [], []
    for n, _, _ in plan:
        if not quiet:
            log(f"[{server.kind} N={n:,}] building {n:,} messages")
        seeds.append(SeedBatches(n))
        results.append(SizeResult(server.kind, n, seeds[-1].body_bytes))
    raw = RawSqs(server.endpoint)
    try:
        with tempfile.TemporaryDirectory(prefix="redrive-bench-move-") as state:
            for rnd in range(max(rounds for _, rounds, _ in plan)):
                for (_n, rounds, tools), batches, result in zip(plan, seeds, results, strict=True):
                    if rnd >= rounds:
                        continue
                    shift = rnd % len(tools)
                    for tool in [*tools[shift:], *tools[:shift]]:
                        run = measure(server, raw, batches, tool, rnd + 1, state, wait)
                        result.runs.append(run)
                        if not (quiet and run.ok):
                            log(_run_line(server.kind, run))
    finally:
        raw.close()
    return results


def _run_line(kind: str, run: Run) -> str:
    return (
        f"[{kind} N={run.n:,}] round {run.round} {run.tool:<12} "
        f"{run.wall_s:7.2f} s {run.rate_wall:7,.0f} msgs/s "
        f"(own {run.rate_own or 0:7,.0f})  cpu {1000 * run.client_cpu_s / run.n:.3f} ms/msg  "
        f"rss {run.peak_rss_mb:6.1f} MB  "
        f"server cpu {run.server_cpu_s:6.2f} s  seed {run.seed_s:5.1f} s  "
        f"load {run.load_before:.2f}" + ("" if run.ok else f"  FAILED: {run.problem}")
    )


def paired_ratio(
    result: SizeResult, tool: str, base: str, own: bool, *, cpu: bool = False
) -> float | None:
    """Median over rounds of (tool's rate / base's rate in the same round); ``cpu``: of
    (tool's client CPU / base's)."""
    ratios = []
    for rnd in {r.round for r in result.runs}:
        a = [r for r in result.runs if r.tool == tool and r.round == rnd and r.ok]
        b = [r for r in result.runs if r.tool == base and r.round == rnd and r.ok]
        if a and b:
            if cpu:
                ra, rb = a[0].client_cpu_s, b[0].client_cpu_s
            else:
                ra = a[0].rate_own if own else a[0].rate_wall
                rb = b[0].rate_own if own else b[0].rate_wall
            if ra and rb:
                ratios.append(ra / rb)
    return median(ratios) if ratios else None


def summary_rows(result: SizeResult, tools: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    per_message = [r for r in result.runs if r.tool == "per-message" and r.ok]
    for tool in tools:
        tried = [r for r in result.runs if r.tool == tool]
        runs = [r for r in tried if r.ok]
        if not tried:
            continue
        row: dict[str, Any] = {"N": result.n, "tool": tool, "ok": f"{len(runs)}/{len(tried)}"}
        if runs:
            wall = median([r.wall_s for r in runs])
            server_cpu = median([r.server_cpu_s for r in runs])
            base = BASELINE.get(split_client(tool)[0])
            row.update(
                {
                    "msgs/s": median([r.rate_wall for r in runs]),
                    "own msgs/s": median([r.rate_own or 0.0 for r in runs]),
                    "vs batched": paired_ratio(result, tool, base, own=False) if base else None,
                    "own vs batched": paired_ratio(result, tool, base, own=True) if base else None,
                    "baseline": base,
                    "vs per-msg": (
                        paired_ratio(result, tool, "per-message", own=False)
                        if per_message and tool != "per-message"
                        else None
                    ),
                    "wall s": wall,
                    "peak RSS MB": median([r.peak_rss_mb for r in runs]),
                    "child RSS MB": max(r.child_rss_mb for r in runs) or None,
                    "client CPU s": median([r.client_cpu_s for r in runs]),
                    "CPU ms/msg": median([r.client_cpu_s for r in runs]) / result.n * 1000,
                    "server CPU s": server_cpu,
                    "server CPU/wall": server_cpu / wall if wall else None,
                    "server-bound msgs/s": result.n / server_cpu if server_cpu else None,
                    "load": median([r.load_before for r in runs]),
                }
            )
        rows.append(row)
    return rows


HEADERS = [
    "N",
    "tool",
    "msgs/s",
    "vs batched",
    "vs per-msg",
    "own msgs/s",
    "own vs batched",
    "peak RSS MB",
    "child RSS MB",
    "client CPU s",
    "CPU ms/msg",
    "server CPU s",
    "server CPU/wall",
    "server-bound msgs/s",
    "load",
    "ok",
]


def _fmt(row: dict[str, Any], header: str) -> str:
    value = row.get(header)
    if header == "N":
        return f"{value:,}"
    if header in ("tool", "ok"):
        return str(value)
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if header in ("vs batched", "own vs batched"):
        base = row.get("baseline")
        return f"{value:.2f}x" + (f" ({base})" if base and base != "batched" else "")
    if header == "vs per-msg":
        return f"{value:.1f}x"
    if header in ("msgs/s", "own msgs/s", "server-bound msgs/s"):
        return f"{value:,.0f}"
    if header == "server CPU/wall":
        return f"{value:.0%}"
    if header == "CPU ms/msg":
        return f"{value:.3f}"
    if header in ("peak RSS MB", "child RSS MB"):
        return f"{value:.1f}"
    return f"{value:.2f}"


def render(
    kind: str,
    results: Sequence[SizeResult],
    tools: Sequence[str],
    wait: int,
    latency_ms: float = 0.0,
) -> str:
    lines: list[list[str]] = []
    for result in results:
        for row in summary_rows(result, tools):
            lines.append(
                [
                    _fmt(row, h) if "msgs/s" in row or h in ("N", "tool", "ok") else "-"
                    for h in HEADERS
                ]
            )
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(HEADERS)]
    text = [
        f"server: {kind}   receive wait: {wait} s   latency: {latency_ms:g} ms per call   "
        "medians over rounds; ratios are medians "
        "of per-round ratios",
        "| " + " | ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    for line in lines:
        cells = [
            c.ljust(w) if i == 1 else c.rjust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        text.append("| " + " | ".join(cells) + " |")
    text.append("")
    for result in results:
        for tool, base in pairs_of(tools):
            ratio = paired_ratio(result, tool, base, own=False)
            own = paired_ratio(result, tool, base, own=True)
            if ratio is None:
                continue
            where = split_client(tool)[0] == "redrive-where"
            what = f"redrive --where {WHERE[0]!r}{tool[13:]}" if where else tool
            cpu = paired_ratio(result, tool, base, own=False, cpu=True)
            text.append(
                f"N={result.n:,}: {what} / {base}, same rounds: {ratio:.2f}x msgs/s"
                + (f", {own:.2f}x own msgs/s" if own else "")
                + (f", {cpu:.2f}x client CPU" if cpu else "")
            )
    text.append(scaling(results, tools))
    text.append("seeding (SendMessageBatch as raw JSON into the fresh DLQ; not measured above):")
    for result in results:
        seeds = [r.seed_s for r in result.runs]
        text.append(
            f"  N={result.n:,}: median {median(seeds):.1f} s "
            f"({result.n / median(seeds):,.0f} msgs/s), bodies {result.body_bytes / 1e6:.1f} MB"
        )
    failed = [r for res in results for r in res.runs if not r.ok]
    for run in failed:
        text.append(f"FAILED: N={run.n:,} {run.tool} round {run.round}: {run.problem}")
    return "\n".join(text)


def scaling(results: Sequence[SizeResult], tools: Sequence[str]) -> str:
    """Throughput at the largest size against the smallest, per redrive contender."""
    if len(results) < 2:
        return ""
    small, large = min(results, key=lambda r: r.n), max(results, key=lambda r: r.n)
    out = [
        f"at N={large.n:,} / at N={small.n:,}: throughput (wall; own timer), client CPU a "
        "message, peak RSS (medians; rounds):"
    ]
    for tool in tools:
        a = [r for r in small.runs if r.tool == tool and r.ok]
        b = [r for r in large.runs if r.tool == tool and r.ok]
        if not a or not b:
            continue
        wall = median([r.rate_wall for r in b]) / median([r.rate_wall for r in a])
        own = median([r.rate_own or 0 for r in b]) / median([r.rate_own or 1 for r in a])
        cpu = median([r.client_cpu_s / r.n for r in b]) / median([r.client_cpu_s / r.n for r in a])
        rss = median([r.peak_rss_mb for r in b]) / median([r.peak_rss_mb for r in a])
        out.append(
            f"  {tool:<12} {wall:5.2f}x ; {own:5.2f}x   CPU {cpu:5.2f}x   RSS {rss:5.2f}x"
            f"   ({len(b)} and {len(a)} rounds)"
        )
    return "\n".join(out) + "\n"


def unmeasured_redrive(
    server: Server, batches: SeedBatches, wait: int, tool: str, **command_options: Any
) -> tuple[list[str], subprocess.CompletedProcess[bytes], float, str]:
    """Seed fresh queues and run redrive once (not part of the tables); return the command,
    its result, its wall time and what the checks found ("" when all is well)."""
    raw = RawSqs(server.endpoint)
    try:
        dlq_url, queue_url = fresh_family(raw)
        seed(raw, dlq_url, batches)
        with tempfile.TemporaryDirectory(prefix="redrive-bench-move-") as state:
            ledger_dir = SHM if tool.startswith("redrive-shm") else state
            ledger = os.path.join(ledger_dir, f"redrive-bench-ledger-{os.getpid()}-profile.sqlite3")
            command = redrive_command(tool, ledger, **command_options)
            env = contender_env(server, state, wait, tool)
            env["BENCH_PHASES_OUT"] = os.path.join(state, "phases.json")
            if command_options.get("profile_out"):
                env["BENCH_PROFILE_OUT"] = command_options["profile_out"]
            started = time.perf_counter()
            done = subprocess.run(
                command, cwd=tool_tree(tool), env=env, capture_output=True, timeout=CHILD_TIMEOUT[0]
            )
            wall = time.perf_counter() - started
            if command_options.get("phases") and os.path.exists(env["BENCH_PHASES_OUT"]):
                with open(env["BENCH_PHASES_OUT"], encoding="utf-8") as phases:
                    done.phases = json.load(phases)  # type: ignore[attr-defined]
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(ledger + suffix):
                    os.remove(ledger + suffix)
        problems = []
        if done.returncode != 0:
            problems.append(f"exit {done.returncode}: {done.stderr.decode()[-300:]}")
        elif json.loads(done.stdout)["moved"] != batches.count:
            problems.append(f"moved {json.loads(done.stdout)['moved']}")
        after = depth(raw, queue_url), depth(raw, dlq_url)
        if after != ((batches.count, 0, 0), (0, 0, 0)):
            problems.append(f"target, DLQ after: {after}")
    finally:
        raw.close()
    return command, done, wall, "; ".join(problems)


def profile_redrive(
    server: Server, n: int, wait: int, out_dir: str, tool: str, *, cprofile: bool = True
) -> str:
    """Where one redrive run of ``n`` messages spends its time: a step timer (low overhead),
    then cProfile (the whole call tree, slowed down by the profiler). Neither run is part of
    the tables."""
    import pstats

    os.makedirs(out_dir, exist_ok=True)
    batches = SeedBatches(n)
    lines: list[str] = []

    # 1. The step timer.
    command, done, wall, problem = unmeasured_redrive(server, batches, wait, tool, phases=True)
    phases: dict[str, list[float]] = getattr(done, "phases", {})
    run_wall = phases.get("engine.run", [1, 0.0, 0.0])[1] or float("nan")
    batches_n = phases.get("engine._execute", [0])[0] or 1
    lines.append(
        f"step timer: `{tool}` N={n:,} on {server.kind}, wall {wall:.2f} s (process), "
        f"MoveEngine.run {run_wall:.2f} s, {batches_n:,} batches"
        + (f"  PROBLEM: {problem}" if problem else "")
    )
    lines.append(
        "  step                          calls    wall s  share of run  ms/batch (wall)  "
        "ms/batch (CPU)"
    )
    order = sorted(
        (k for k in phases if k not in ("process",)), key=lambda k: phases[k][1], reverse=True
    )
    for key in order:
        calls, step_wall, step_cpu = phases[key]
        lines.append(
            f"  {key:<28} {int(calls):>7,} {step_wall:9.2f} {step_wall / run_wall:12.1%} "
            f"{step_wall / batches_n * 1000:16.2f} {step_cpu / batches_n * 1000:15.2f}"
        )
    steps = ("sqs.receive", "sqs.send_batch", "sqs.delete_batch")
    ledger_steps = [k for k in phases if k.startswith("ledger.")]
    http = sum(phases[k][1] for k in steps if k in phases)
    ledger = sum(phases[k][1] for k in ledger_steps)
    ledger_cpu = sum(phases[k][2] for k in ledger_steps)
    lines.append(
        f"  => SQS calls {http / run_wall:.0%} of the run, ledger {ledger / run_wall:.0%} "
        f"(of which not on the CPU, i.e. the disk flush or the other stage holding the GIL: "
        f"{(ledger - ledger_cpu) / run_wall:.0%}). A worker's two stages run at once (receive "
        "and decide in one thread, claim, send and delete in the other), so shares of the "
        "run add up to more than 100 %; CPU per batch is the column to add up."
    )

    if not cprofile:
        return "\n".join(lines)

    # 2. cProfile.
    prof = os.path.join(os.path.abspath(out_dir), f"{tool}-{server.kind}-{n}.prof")
    command, done, wall, problem = unmeasured_redrive(server, batches, wait, tool, profile_out=prof)
    stats = pstats.Stats(prof)
    total = stats.total_tt  # type: ignore[attr-defined]
    lines.append("")
    lines.append(
        f"cProfile: `{' '.join(command[1:])}` (N={n:,}, {server.kind}): wall {wall:.1f} s "
        f"under the profiler, profile total {total:.1f} s; file {prof}"
        + (f"  PROBLEM: {problem}" if problem else "")
    )
    entries = stats.stats  # type: ignore[attr-defined]

    def name(func: tuple[str, int, str]) -> str:
        path, line, fn = func
        short = path.split("site-packages/")[-1].replace(ROOT + "/", "")
        return f"{short}:{line}({fn})" if line else fn

    interesting = (
        "redrive/operations/move/",
        "redrive/ledger/",
        "redrive/broker/sqs/",
        "redrive/dlq/scan.py",
        "redrive/messages.py",
        "botocore/client.py:",
        "sqlite3",
        "_socket",
    )
    by_cum = sorted(entries.items(), key=lambda kv: kv[1][3], reverse=True)
    lines.append(
        "  redrive's own functions, botocore's API call, sqlite and sockets, by cumulative time:"
    )
    shown = 0
    for func, (_, calls, tt, ct, _callers) in by_cum:
        label = name(func)
        if not any(part in label for part in interesting) or ct / total < 0.005:
            continue
        lines.append(
            f"    {ct / total:6.1%} {ct:7.2f} s cum {tt:6.2f} s self {calls:>9,} calls  {label}"
        )
        shown += 1
        if shown >= 30:
            break
    by_self = sorted(entries.items(), key=lambda kv: kv[1][2], reverse=True)
    lines.append("  top by self time:")
    for func, (_, calls, tt, ct, _callers) in by_self[:15]:
        lines.append(
            f"    {tt / total:6.1%} {tt:7.2f} s self {ct:6.2f} s cum {calls:>9,} calls  "
            + name(func)
        )
    return "\n".join(lines)


def check_fast_sqs() -> None:
    fast_sqs = load_fast_sqs()
    missing = [op for op in NEEDED_OPERATIONS if op not in fast_sqs._OPERATIONS]
    if missing:
        raise SystemExit(f"bench/fast_sqs.py lacks operations this benchmark needs: {missing}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python bench/move.py",
        description="Throughput and peak memory of `redrive move --execute` vs hand-written "
        "boto3 loops, on a local SQS.",
    )
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=[1_000, 10_000, 100_000],
        help="DLQ sizes, comma separated (default 1000,10000,100000)",
    )
    parser.add_argument(
        "--moto-sizes",
        type=parse_sizes,
        help="sizes for the moto server (default: --sizes capped at 2,000: moto's cost per "
        "call grows with queue depth)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds per size (default 3)"
    )
    parser.add_argument(
        "--large-rounds",
        type=int,
        metavar="N",
        help="rounds at sizes of 100,000 and more (default: --rounds)",
    )
    parser.add_argument(
        "--no-warmup",
        action="store_true",
        help="skip the unmeasured warm-up run of each contender (100 messages) on each server",
    )
    parser.add_argument("--server", choices=("fast", "moto", "both"), default="fast")
    parser.add_argument(
        "--tools",
        default=",".join(TOOLS),
        help=f"comma-separated, from {', '.join(TOOLS + EXTRA_TOOLS)} (default: {','.join(TOOLS)})",
    )
    parser.add_argument(
        "--per-message-max",
        type=int,
        default=10_000,
        help="run the per-message loop only at sizes up to this (default 10,000: at 100,000 "
        "it alone takes minutes per round)",
    )
    parser.add_argument(
        "--receive-wait",
        type=int,
        default=0,
        choices=range(0, 21),
        metavar="S",
        help="long-poll seconds for every contender (REDRIVE_RECEIVE_WAIT for redrive, "
        "WaitTimeSeconds for the loops; default 0)",
    )
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="fast server only: milliseconds it waits before every answer, to model the "
        "network round trip to SQS that loopback lacks (default 0: CPU alone counts)",
    )
    parser.add_argument(
        "--where",
        metavar="EXPR",
        help="also run redrive-where: redrive move --where EXPR (an expression on a kwarg that "
        f"every message passes, e.g. {DEFAULT_WHERE!r}), and print its ratio to redrive",
    )
    parser.add_argument(
        "--before",
        metavar="DIR",
        help="also run redrive-before: redrive from the tree DIR (e.g. `git archive main | tar "
        "-x -C DIR`), default settings, in the same rounds; prints redrive / redrive-before",
    )
    parser.add_argument(
        "--sqs-client",
        choices=(*SQS_CLIENTS, "both"),
        help="the SQS client of every redrive contender (redrive's --sqs-client); both: each "
        "redrive contender twice a round, TOOL@lean and TOOL@botocore, and prints lean / "
        "botocore (default: redrive's own default)",
    )
    parser.add_argument(
        "--ledger-kind",
        choices=LEDGER_KINDS,
        default="sqlite",
        help="the ledger of each redrive move contender: a fresh SQLite file a run (default), "
        "a fresh PostgreSQL schema a run (contender TOOL+pg), or both (each contender twice "
        "a round, interleaved)",
    )
    parser.add_argument(
        "--postgres-url",
        metavar="URL",
        help="with --ledger-kind postgres|both: a server of yours (default: a private one "
        "this script starts and stops: tests/postgres_server.py, fsync on)",
    )
    parser.add_argument(
        "--interleave-sizes",
        action="store_true",
        help="round r of every size before round r+1 of any (default: one size after another)",
    )
    parser.add_argument(
        "--child-timeout",
        type=float,
        default=CHILD_TIMEOUT[0],
        metavar="S",
        help=f"seconds a contender may run before it is killed (default {CHILD_TIMEOUT[0]:,})",
    )
    parser.add_argument("--json-out", metavar="FILE", help="also write every run as JSON")
    parser.add_argument(
        "--profile-size",
        type=int,
        metavar="N",
        help="after the benchmark, profile one redrive run of N messages (cProfile) on each "
        "server and print where its time goes",
    )
    parser.add_argument(
        "--profile-tool",
        default="redrive",
        choices=("redrive", "redrive-shm", "redrive-where", "redrive-w16", "redrive-before"),
    )
    parser.add_argument(
        "--no-cprofile", action="store_true", help="with --profile-size: the step timer only"
    )
    parser.add_argument(
        "--profile-dir", default=os.path.join(tempfile.gettempdir(), "redrive-bench-prof")
    )
    # Internal: a hand-written contender's own process.
    parser.add_argument(
        "--child",
        choices=("batched", "per-message", "null", "receive-delete"),
        help=argparse.SUPPRESS,
    )
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--expect", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--shaped", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        if args.child == "batched":
            outcome = batched_loop(args.expect, args.threads, args.receive_wait, shaped=args.shaped)
        elif args.child == "null":
            outcome = null_loop(args.expect, args.threads, args.receive_wait)
        elif args.child == "receive-delete":
            outcome = receive_delete_loop(args.expect, args.threads, args.receive_wait)
        else:
            outcome = per_message_loop(args.expect, args.receive_wait)
        print(json.dumps(outcome))
        return 0

    # Run in the background by a shell, SIGINT may arrive ignored; and SIGTERM would end this
    # process without stopping the server and the contender it started. Both unwind instead.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    if args.where:
        WHERE[0] = args.where
        tools += [] if "redrive-where" in tools else ["redrive-where"]
    if args.before:
        if not os.path.isfile(os.path.join(args.before, "redrive", "__init__.py")):
            parser.error(f"--before {args.before}: no redrive package there")
        BEFORE[:] = [os.path.abspath(args.before)]
        tools += [] if "redrive-before" in tools else ["redrive-before"]
    elif "redrive-before" in tools:
        parser.error("redrive-before runs the tree --before DIR names: give --before")
    unknown = set(tools) - set(TOOLS + EXTRA_TOOLS)
    if unknown or not tools:
        parser.error(
            f"unknown tools {sorted(unknown)}; choose from {', '.join(TOOLS + EXTRA_TOOLS)}"
        )
    if args.sqs_client in SQS_CLIENTS:
        SQS_CLIENT[:] = [args.sqs_client]
    tools = with_clients(with_ledgers(tools, args.ledger_kind), args.sqs_client)
    CHILD_TIMEOUT[0] = args.child_timeout
    if any(t.startswith("redrive-shm") for t in tools) and not os.path.isdir(SHM):
        parser.error(f"the redrive-shm variants need {SHM} (tmpfs)")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    kinds = ["fast", "moto"] if args.server == "both" else [args.server]
    SEED_CONNECTIONS[0] = 16 if args.latency_ms else 1
    if "fast" in kinds:
        check_fast_sqs()
    # Compile and cache imports once, so that no measured run pays for writing .pyc files.
    subprocess.run(
        [
            PYTHON,
            "-c",
            "import boto3, redrive.cli, redrive.operations.move, redrive.ledger, redrive.sandbox",
        ],
        cwd=ROOT,
        check=True,
        timeout=300,
    )
    started = time.monotonic()
    log(
        f"bench/move.py: {', '.join(kinds)} server, sizes {args.sizes}, {args.rounds} rounds, "
        f"tools {tools}, receive wait {args.receive_wait} s, latency {args.latency_ms} ms, "
        f"load {os.getloadavg()}, "
        f"{os.cpu_count()} CPUs"
    )
    pg_server = None
    if any(PG in t for t in tools):
        url, _, pg_server = ledger_scale._postgres(args.postgres_url)
        POSTGRES[:] = [url]
        log(f"PostgreSQL ledgers on {url}")
    try:
        return _bench(args, kinds, tools, started)
    finally:
        ledger_scale._drop_schemas()
        if pg_server is not None:
            import postgres_server

            postgres_server.stop(pg_server)


def _bench(
    args: argparse.Namespace, kinds: Sequence[str], tools: Sequence[str], started: float
) -> int:
    tables = []
    everything: list[dict[str, Any]] = []
    failed = False
    for kind in kinds:
        sizes = args.sizes
        if kind == "moto":
            sizes = args.moto_sizes or sorted({min(n, 2_000) for n in args.sizes})
        log(f"[{kind}] starting the server")
        server = start_server(kind, args.latency_ms)
        try:
            if not args.no_warmup:
                # Page cache, .pyc files, the server's first connections: paid here, not by
                # whichever contender happens to run first.
                log(f"[{kind}] warm-up: each contender once on 100 messages (not measured)")
                bench_size(server, 100, 1, tools, args.receive_wait, quiet=True)
            plan = [
                (n, _rounds_of(n, args), tools_for(n, tools, args.per_message_max)) for n in sizes
            ]
            if args.interleave_sizes:
                results = bench_sizes(server, plan, args.receive_wait)
            else:
                results = [bench_sizes(server, [one], args.receive_wait)[0] for one in plan]
            log(f"[{kind}] server RSS {server.rss_mb():.0f} MB")
            for result in results:
                failed = failed or any(not r.ok for r in result.runs)
                everything.append(
                    {
                        **{k: v for k, v in asdict(result).items() if k != "runs"},
                        "runs": [asdict(r) for r in result.runs],
                        "summary": summary_rows(result, tools),
                    }
                )
            tables.append(render(kind, results, tools, args.receive_wait, args.latency_ms))
            print(tables[-1] + "\n", flush=True)
            if args.profile_size:
                print(
                    profile_redrive(
                        server,
                        args.profile_size,
                        args.receive_wait,
                        args.profile_dir,
                        args.profile_tool,
                        cprofile=not args.no_cprofile,
                    )
                    + "\n",
                    flush=True,
                )
        finally:
            server.stop()
    load = os.getloadavg()
    print(
        f"total wall {time.monotonic() - started:.0f} s; load average now "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs",
        flush=True,
    )
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as out:
            json.dump(everything, out, indent=1)
    return 1 if failed else 0


def _rounds_of(n: int, args: argparse.Namespace) -> int:
    return int(args.large_rounds if n >= 100_000 and args.large_rounds else args.rounds)


if __name__ == "__main__":
    sys.exit(main())
