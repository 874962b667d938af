"""The console's actions (redrive/web/actions.py, acting.py, operations.py) over in-process
moto with Starlette's test client: a dry run whose plan is shown, then exactly that plan
executed in a thread of the server's; checked through the broker (each task once in its
queue, byte-identical), and the CLI's plans and the console's being one format."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli, Family, as_json, wait_until
from starlette.testclient import TestClient
from web_console import (
    client,
    console,
    csrf_of,
    operation_json,
    sign_in,
    sqs_workspace,
    users,
)

from redrive.operations.coordinator import Outcome
from redrive.repair import open_task
from redrive.sandbox.encoder import encode
from redrive.web.actions import operations_of
from redrive.web.console import Console
from redrive.web.operations import Operations
from redrive.web.security import Person
from redrive.web.users import Role

CHARGE = "apps.shop.tasks.charge"
MAIL = "apps.mail.tasks.send_receipt"


_CHARGES: dict[int, str] = {}


def charge_body(n: int) -> str:
    """One publish of charge n: asked again, the same bytes."""
    if n not in _CHARGES:
        _CHARGES[n] = encode(CHARGE, [n], {"currency": "USD"}, task_id=f"charge-{n}")
    return _CHARGES[n]


def acting_console(tmp_path: Path, **changes: Any) -> Console:
    workspace = sqs_workspace(ledger_uri=str(tmp_path / "ledger.sqlite3"))
    return console(workspace, allow_actions=True, **changes)


def form_csrf(test: TestClient, path: str = "/actions/new?target=checkout") -> str:
    page = test.get(path)
    assert page.status_code == 200, page.text
    return csrf_of(page.text)


def dry_run(test: TestClient, **fields: str) -> str:
    """The dry run's plan id (its page)."""
    data = {"csrf": form_csrf(test), "target": "checkout", "kind": "move"} | fields
    done = test.post("/actions/dry-run", data=data)
    assert done.status_code == 303, done.text
    location = done.headers["location"]
    assert location.startswith("/actions/plans/")
    return location.rsplit("/", 1)[1]


def execute(test: TestClient, plan_id: str, confirm: str | None = None) -> dict[str, Any]:
    """Execute the plan; the operation as it ended."""
    page = test.get(f"/actions/plans/{plan_id}")
    data = {"csrf": csrf_of(page.text)} | ({"confirm": confirm} if confirm else {})
    started = test.post(f"/actions/plans/{plan_id}/execute", data=data)
    assert started.status_code == 303, started.text
    location = started.headers["location"]
    assert location.startswith("/actions/operations/"), location
    state: dict[str, Any] = {}

    def ended() -> bool:
        state.update(operation_json(test, location))
        return state["state"] != "running"

    wait_until(ended, timeout=60, what="the operation ends")
    assert test.get(location).status_code == 200
    return state


def bodies(family: Family, url: str) -> list[str]:
    return sorted(m["Body"] for m in family.drain(url))


def test_a_move_is_a_dry_run_whose_plan_is_shown_then_exactly_that_plan(
    family: Family, tmp_path: Path
) -> None:
    sent = [charge_body(n) for n in range(3)]
    for body in sent:
        family.send_to_dlq(body)
    family.send_to_dlq(encode(MAIL, [], {"order": 1}, task_id="mail-1"))
    with client(acting_console(tmp_path)) as test:
        plan_id = dry_run(test, tasks=CHARGE)
        page = test.get(f"/actions/plans/{plan_id}")
        assert page.status_code == 200
        assert page.text.count("sha256:") == 3 and "charge-" not in page.text.split("Items")[0]
        assert family.depth() == (4, 0)  # a dry run changes nothing
        family.send_to_dlq(charge_body(9))  # arrives after the review: not in the plan
        op = execute(test, plan_id)
        runs = test.get("/api/operations").json()["runs"]
    assert op["state"] == "completed", op["error"]
    assert (op["result"]["planned"], op["result"]["moved"]) == (3, 3)
    assert bodies(family, family.queue_url) == sorted(sent)  # each once, byte-identical
    left = bodies(family, family.dlq_url)
    assert len(left) == 2 and charge_body(9) in left
    assert any(r["command"] == "web apply" for r in runs)


def test_the_console_plan_is_the_cli_plan_both_ways(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    family.send_to_dlq(charge_body(1))
    with client(acting_console(tmp_path)) as test:
        plan_id = dry_run(test)
        downloaded = test.get(f"/actions/plans/{plan_id}/download")
        assert downloaded.status_code == 200
        assert "attachment" in downloaded.headers["content-disposition"]
        path = tmp_path / "console-plan.json"
        path.write_bytes(downloaded.content)
        applied = as_json(
            cli.ok(
                "apply",
                str(path),
                "--execute",
                "--yes",
                "--json",
                "--ledger",
                str(tmp_path / "ledger.sqlite3"),
            )
        )
        assert applied["moved"] == 1
        # And a CLI plan, uploaded and executed in the console.
        family.send_to_dlq(charge_body(2))
        cli_plan = tmp_path / "cli-plan.json"
        cli.ok("move", "checkout", "--plan-out", str(cli_plan))
        csrf = form_csrf(test)
        uploaded = test.post(
            "/actions/upload",
            data={"csrf": csrf},
            files={"plan": ("plan.json", cli_plan.read_bytes(), "application/json")},
        )
        assert uploaded.status_code == 303, uploaded.text
        op = execute(test, uploaded.headers["location"].rsplit("/", 1)[1])
    assert op["state"] == "completed" and op["result"]["moved"] == 1
    assert bodies(family, family.queue_url) == sorted([charge_body(1), charge_body(2)])


def test_a_purge_asks_for_the_dlqs_name_and_keeps_an_archive(
    family: Family, tmp_path: Path
) -> None:
    family.send_to_dlq(charge_body(1))
    archive = tmp_path / "purged.jsonl.gz"
    with client(acting_console(tmp_path)) as test:
        refused = test.post(
            "/actions/dry-run",
            data={"csrf": form_csrf(test), "target": "checkout", "kind": "purge"},
        )
        assert refused.status_code == 400 and "archive" in refused.text
        plan_id = dry_run(test, kind="purge", archive=str(archive))
        page = test.get(f"/actions/plans/{plan_id}")
        unconfirmed = test.post(
            f"/actions/plans/{plan_id}/execute",
            data={"csrf": csrf_of(page.text), "confirm": "checkout"},
        )
        assert unconfirmed.status_code == 303
        assert "type the DLQ" in test.get(unconfirmed.headers["location"]).text
        assert family.depth() == (1, 0)
        op = execute(test, plan_id, confirm="onion-checkout-dlq")
    assert op["state"] == "completed" and op["result"]["purged"] == 1
    assert archive.exists() and family.depth() == (0, 0)


def test_a_message_changed_since_the_plan_is_left(family: Family, tmp_path: Path) -> None:
    changed = family.send_to_dlq(charge_body(1))
    family.send_to_dlq(charge_body(2))
    with client(acting_console(tmp_path)) as test:
        plan_id = dry_run(test)
        path = Path(tmp_path / "state" / "web-plans" / f"{plan_id}.json")
        data = json.loads(path.read_text())
        for item in data["items"]:
            if item["message_id"] == changed:
                item["digest"] = "sha256:" + "0" * 64
        path.write_text(json.dumps(data))
        op = execute(test, plan_id)
    assert op["state"] == "needs-attention"
    assert (op["result"]["moved"], op["result"]["changed_since_plan"]) == (1, 1)
    assert bodies(family, family.dlq_url) == [charge_body(1)]


def test_a_repairs_plan_shows_the_diff_and_sends_the_edited_body(
    family: Family, tmp_path: Path
) -> None:
    family.send_to_dlq(charge_body(1))
    with client(acting_console(tmp_path)) as test:
        plan_id = dry_run(
            test, set='kwargs.currency="EUR"', archive=str(tmp_path / "originals.jsonl.gz")
        )
        page = test.get(f"/actions/plans/{plan_id}").text
        assert "kwargs.currency" in page and "→" in page
        op = execute(test, plan_id)
    assert op["state"] == "completed", op["error"]
    (sent,) = family.drain(family.queue_url)
    assert open_task(sent["Body"]).content.kwargs == {"currency": "EUR"}


def test_acting_needs_an_operator_a_csrf_token_and_allow_actions(
    family: Family, tmp_path: Path
) -> None:
    family.send_to_dlq(charge_body(1))
    workspace = sqs_workspace(ledger_uri=str(tmp_path / "ledger.sqlite3"))
    team = users(olga=Role.OPERATOR, vera=Role.VIEWER)
    with client(console(workspace, allow_actions=True, users=team)) as test:
        sign_in(test, "vera")
        csrf = csrf_of(test.get("/operations").text)
        viewer = test.post(
            "/actions/dry-run", data={"csrf": csrf, "target": "checkout", "kind": "move"}
        )
        assert viewer.status_code == 403
        test.post("/logout", data={"csrf": csrf})
        sign_in(test, "olga")
        forged = test.post("/actions/dry-run", data={"target": "checkout", "kind": "move"})
        assert forged.status_code == 403
    with client(console(sqs_workspace())) as test:  # read-only: no --allow-actions
        assert test.get("/actions/new?target=checkout").status_code == 403
    assert family.depth() == (1, 0)


def test_stopping_an_operation_or_the_server_stops_its_run() -> None:
    """The registry's side: stop sets the run's stop (which ends it as Ctrl-C does, its
    summary kept); closing stops every one still running and waits for it."""
    ops = Operations()
    person = Person("olga", Role.OPERATOR, "127.0.0.1", "local")
    ended = threading.Event()

    class Stopped:
        interrupted = True
        needs_attention = False

        def to_json(self) -> dict[str, Any]:
            return {"moved": 2}

    def work(stop: threading.Event, observer: Any) -> Outcome[Any]:
        stop.wait(60)
        ended.set()
        return Outcome(Stopped())

    first = ops.start(plan_id="0" * 16, kind="move", target="checkout", person=person, work=work)
    ops.stop(first.id)
    wait_until(lambda: first.state != "running", timeout=30, what="stopped")
    assert first.state == "interrupted" and first.result == {"moved": 2}
    ended.clear()
    second = ops.start(plan_id="1" * 16, kind="move", target="checkout", person=person, work=work)
    ops.close()
    assert ended.is_set() and second.state == "interrupted"
    with pytest.raises(Exception, match="stopping"):
        ops.start(plan_id="2" * 16, kind="move", target="checkout", person=person, work=work)


def test_an_operation_outlives_the_tab_and_stops_with_the_server(
    family: Family, tmp_path: Path
) -> None:
    for n in range(40):
        family.send_to_dlq(charge_body(n))
    shared = acting_console(tmp_path)
    test = client(shared)  # no lifespan: the server runs on after each request
    plan_id = dry_run(test)
    page = test.get(f"/actions/plans/{plan_id}")
    started = test.post(f"/actions/plans/{plan_id}/execute", data={"csrf": csrf_of(page.text)})
    op = operations_of(shared).get(started.headers["location"].rsplit("/", 1)[1])
    assert op.thread is not None
    op.thread.join(60)  # nothing more asked of the server: it went on alone
    assert op.state == "completed" and len(family.drain(family.queue_url)) == 40
    # The server stops while an operation runs: stopped as Ctrl-C stops the CLI's, every
    # message sent once or left in the DLQ visible, nothing held.
    for n in range(40, 400):
        family.send_to_dlq(charge_body(n))
    plan_id = dry_run(test)
    page = test.get(f"/actions/plans/{plan_id}")
    confirm = {"confirm": "onion-checkout-dlq"}
    test.post(f"/actions/plans/{plan_id}/execute", data={"csrf": csrf_of(page.text)} | confirm)
    shared.close()
    (last,) = [o for o in operations_of(shared).all() if o.plan_id == plan_id]
    assert last.state in ("interrupted", "completed") and last.ended_at is not None
    moved = family.drain(family.queue_url)
    left = family.drain(family.dlq_url)
    assert sorted(m["Body"] for m in moved + left) == sorted(charge_body(n) for n in range(40, 400))


def test_an_archive_is_replayed_after_its_dry_run_each_task_once(
    family: Family, tmp_path: Path
) -> None:
    sent = [charge_body(n) for n in (7, 8)]
    for body in sent:
        family.send_to_dlq(body)
    archive = tmp_path / "purged.jsonl.gz"
    with client(acting_console(tmp_path)) as test:
        execute(test, dry_run(test, kind="purge", archive=str(archive)), "onion-checkout-dlq")
        assert family.depth() == (0, 0)
        csrf = form_csrf(test)
        asked = {"csrf": csrf, "source": str(archive), "to": "onion-checkout"}
        done = test.post("/actions/replay", data=asked)
        assert done.status_code == 303, done.text
        page = test.get(done.headers["location"])
        assert "moved: 2" in page.text
        assert family.depth(family.queue_url) == (0, 0)  # the dry run sent nothing
        started = test.post(
            done.headers["location"] + "/execute", data={"csrf": csrf_of(page.text)}
        )
        location = started.headers["location"]
        wait_until(
            lambda: operation_json(test, location)["state"] != "running",
            timeout=60,
            what="the replay ends",
        )
        op = operation_json(test, location)
        again = test.post(done.headers["location"] + "/execute", data={"csrf": csrf_of(page.text)})
        wait_until(
            lambda: operation_json(test, again.headers["location"])["state"] != "running",
            timeout=60,
            what="the second replay ends",
        )
    assert op["state"] == "completed", op["error"]
    assert bodies(family, family.queue_url) == sorted(sent)  # once, though replayed twice


def test_messages_ticked_on_the_dlq_page_are_the_ones_a_dry_run_plans(
    family: Family, tmp_path: Path
) -> None:
    """The DLQ page's messages can be ticked (a plain GET form, no JS) for an operator of a
    console that allows actions; the new action's form arrives with exactly those, and the
    dry run plans only them. A read-only console shows no ticks."""
    for n in range(3):
        family.send_to_dlq(charge_body(n))
    with client(console(sqs_workspace(ledger_uri=str(tmp_path / "l.sqlite3")))) as test:
        assert 'name="message_id"' not in test.get("/dlq/checkout").text
    with client(acting_console(tmp_path)) as test:
        page = test.get("/dlq/checkout")
        assert page.status_code == 200, page.text
        ticks = re.findall(r'<input type="checkbox" name="message_id" value="([^"]+)"', page.text)
        assert len(ticks) == 3
        assert '<form method="get" action="/actions/new" class="ticked">' in page.text
        chosen = ticks[1]
        new = test.get("/actions/new", params={"target": "checkout", "message_id": chosen})
        assert new.status_code == 200 and chosen in new.text
        assert not any(t in new.text for t in ticks if t != chosen)
        plan_id = dry_run(test, message_ids=chosen)
        plan = test.get(f"/actions/plans/{plan_id}")
        assert plan.text.count("sha256:") == 1 and chosen in plan.text
    assert family.depth() == (3, 0)  # a dry run changes nothing
