"""Many operators, one ledger (issue 41, item 6): two consoles executing overlapping plans,
and the CLI beside a console on one shared PostgreSQL ledger, never send a task twice.

The DLQ holds two copies of each publish (as an unconfirmed send or SQS's at-least-once
delivery leaves them): copy A in one plan, copy B in another. Nothing but the ledger tells
the second apply that the task was sent: each test has its control, the same two plans on
two ledgers, which sends every task twice. Checked through the broker: each task once in its
queue, byte-identical to what was dead-lettered."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from conftest import Cli, Family, as_json, wait_until
from starlette.testclient import TestClient
from web_console import client, console, csrf_of, operation_json, sqs_workspace

from redrive.sandbox.encoder import encode
from redrive.web.console import Console

CHARGE = "apps.shop.tasks.charge"
TASKS = 6
_BODIES = [encode(CHARGE, [n], {}, task_id=f"charge-{n}") for n in range(TASKS)]


def two_copies(family: Family) -> tuple[list[str], list[str]]:
    """Each publish twice in the DLQ: (copies A, copies B), their MessageIds."""
    first = [family.send_to_dlq(body) for body in _BODIES]
    second = [family.send_to_dlq(body) for body in _BODIES]
    return first, second


def acting(ledger: str) -> Console:
    return console(sqs_workspace(ledger_uri=ledger), allow_actions=True)


def plan_of(test: TestClient, message_ids: list[str]) -> str:
    """An operator's dry run of exactly these messages: the plan's id."""
    csrf = csrf_of(test.get("/actions/new?target=checkout").text)
    done = test.post(
        "/actions/dry-run",
        data={
            "csrf": csrf,
            "target": "checkout",
            "kind": "move",
            "message_ids": "\n".join(message_ids),
        },
    )
    assert done.status_code == 303, done.text.split('role="alert">')[-1][:300]
    return done.headers["location"].rsplit("/", 1)[1]


def start(test: TestClient, plan_id: str) -> str:
    page = test.get(f"/actions/plans/{plan_id}")
    started = test.post(f"/actions/plans/{plan_id}/execute", data={"csrf": csrf_of(page.text)})
    assert started.status_code == 303, started.text
    return str(started.headers["location"])


def ended(test: TestClient, location: str) -> dict[str, Any]:
    state: dict[str, Any] = {}

    def done() -> bool:
        state.update(operation_json(test, location))
        return state["state"] != "running"

    wait_until(done, timeout=120, what="the operation ends")
    return state


def sent_bodies(family: Family) -> list[str]:
    return sorted(m["Body"] for m in family.drain(family.queue_url))


def two_operators(
    family: Family, ledgers: tuple[str, str], *, at_once: bool = True
) -> list[dict[str, Any]]:
    """Two consoles (two operators), each a plan of its own, executed at once (or one after
    the other: the controls, whose outcome must not depend on how the scans interleave)."""
    copies_a, copies_b = two_copies(family)
    with client(acting(ledgers[0])) as first, client(acting(ledgers[1])) as second:
        # Overlapping: the first plan has every A and half the Bs; the second every B.
        plans = [plan_of(first, copies_a + copies_b[: TASKS // 2]), plan_of(second, copies_b)]
        if not at_once:
            return [ended(first, start(first, plans[0])), ended(second, start(second, plans[1]))]
        locations = [start(first, plans[0]), start(second, plans[1])]
        return [ended(first, locations[0]), ended(second, locations[1])]


def swept(family: Family, cli: Cli, ledger: str) -> list[str]:
    """What the queue got, once a last move on the same ledger took what the two left (a
    copy whose task the other run was sending is left to a rerun, never sent again)."""
    cli.ok("move", "checkout", "--execute", "--yes", "--ledger", ledger)
    assert family.depth() == (0, 0)
    return sent_bodies(family)


def test_two_operators_executing_overlapping_plans_send_each_task_once(
    family: Family, cli: Cli, tmp_path: Path
) -> None:
    shared = str(tmp_path / "ledger.sqlite3")
    ops = two_operators(family, (shared, shared))
    assert all(op["state"] in ("completed", "needs-attention") for op in ops), ops
    assert swept(family, cli, shared) == sorted(_BODIES)


def test_control_without_one_ledger_the_same_plans_send_tasks_twice(
    family: Family, tmp_path: Path
) -> None:
    two_operators(
        family, (str(tmp_path / "one.sqlite3"), str(tmp_path / "two.sqlite3")), at_once=False
    )
    sent = sent_bodies(family)
    assert all(sent.count(body) == 2 for body in _BODIES[TASKS // 2 :])


def cli_and_console(
    family: Family, cli: Cli, tmp_path: Path, ledgers: tuple[str, str], *, at_once: bool = True
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The console executes the plan of copies A while the CLI applies its own plan of
    copies B (``move --message-id ... --plan-out``, then ``apply``)."""
    for ledger in set(ledgers):
        if ledger.startswith("postgresql://"):
            cli.ok("ledger", "init", ledger)
    copies_a, copies_b = two_copies(family)
    cli_plan = tmp_path / "cli-plan.json"
    ids = [arg for m in copies_b for arg in ("--message-id", m)]
    cli.ok("move", "checkout", *ids, "--plan-out", str(cli_plan), "--ledger", ledgers[1])
    applied: dict[str, Any] = {}

    def apply() -> None:
        args = ("apply", str(cli_plan), "--execute", "--yes", "--json", "--ledger", ledgers[1])
        applied.update(as_json(cli(*args)))

    with client(acting(ledgers[0])) as test:
        location = start(test, plan_of(test, copies_a))
        if not at_once:
            op = ended(test, location)
        thread = threading.Thread(target=apply)
        thread.start()
        if at_once:
            op = ended(test, location)
        thread.join(120)
    return op, applied


def test_the_cli_and_the_console_on_one_postgresql_ledger_send_each_task_once(
    family: Family, cli: Cli, tmp_path: Path, postgres_url: str
) -> None:
    op, applied = cli_and_console(family, cli, tmp_path, (postgres_url, postgres_url))
    assert op["state"] in ("completed", "needs-attention"), op
    assert applied["dry_run"] is False
    assert swept(family, cli, postgres_url) == sorted(_BODIES)


def test_control_the_cli_and_the_console_on_two_ledgers_send_tasks_twice(
    family: Family, cli: Cli, tmp_path: Path, postgres_url: str
) -> None:
    cli_and_console(
        family, cli, tmp_path, (postgres_url, str(tmp_path / "cli.sqlite3")), at_once=False
    )
    assert sent_bodies(family) == sorted(_BODIES * 2)
