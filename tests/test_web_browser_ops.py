"""The console's operations in a real browser (issue 41): an operation's page following its
progress live (the console's own script polling /api/operations/ID), and the on-call runbook
done in the console (docs/console.md), step by step as it says, on the SQS sandbox, checked
afterwards through the broker. Playwright drives Debian's Chromium as in test_web_browser.py
(its fixtures and skips); each test has a sandbox of its own, since it changes its queues."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_web_browser
from kill_points import At, KillPoints
from test_web_browser import Watched
from web_servers import ROOT, Sandbox, WebServer, redrive_web, sqs_sandbox

from redrive.ledger import Claim, open_ledger
from redrive.messages import decode
from redrive.operations.plan import Plan
from redrive.runs.observer import PlanItem
from redrive.sandbox.encoder import encode

try:
    from playwright.sync_api import Locator, Page, expect
except ImportError:  # skipped as test_web_browser's are (pytestmark)
    expect = None  # type: ignore[assignment]

pytestmark = test_web_browser.pytestmark  # a browser's skip when Chromium is absent
browser = test_web_browser.browser  # the fixture: one Chromium for the module
CHARGE = "apps.shop.tasks.charge"
OPERATION = re.compile(r"/actions/operations/[0-9a-f]{16}")


def queue_bodies(sandbox: Sandbox, name: str) -> list[str]:
    """Every body in the queue, each as many times as it is there (received until empty,
    then deleted: the test's last look)."""
    sqs = sandbox.sqs()
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    found: list[str] = []
    while messages := sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=300
    ).get("Messages", []):
        found += [m["Body"] for m in messages]
    return sorted(found)


@pytest.fixture
def empty_sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    directory = tmp_path / "sandbox"
    directory.mkdir()
    with sqs_sandbox(directory, per_family=0) as running:
        yield running


def state_and_counts(page: Any) -> str:
    return str(
        page.locator("[data-field=state]").inner_text()
        + " | "
        + " ".join(page.locator("[data-counts] li").all_inner_texts())
    )


def test_an_operations_page_shows_its_progress_live_until_it_ends(
    browser: Any, empty_sandbox: Sandbox, tmp_path: Path
) -> None:
    """25 tasks move in three batches; the run is held at its second batch's claim (a kill
    point's hold, not a pace), so the page that was loaded before shows the first batch's
    counts while the run is held, then the end, without a reload; the script then stops."""
    sqs = empty_sandbox.sqs()
    dlq = sqs.get_queue_url(QueueName="onion-checkout-dlq")["QueueUrl"]
    sent = sorted(encode(CHARGE, [n], {}, task_id=f"charge-{n}") for n in range(25))
    for body in sent:
        sqs.send_message(QueueUrl=dlq, MessageBody=body)
    points = KillPoints(tmp_path / "points", At("move.claimed", 2, "hold"))
    env = points.env(empty_sandbox.env)
    web_args = ("--allow-actions",)
    try:
        with redrive_web(tmp_path, env, *web_args, redrive=points.argv()) as web:
            watched = Watched(browser.new_page())
            page = watched.page
            page.goto(web.url + "/actions/new?target=checkout")
            page.get_by_role("button", name="Dry run").first.click()
            page.get_by_role("button", name="Execute").click()
            page.wait_for_url(OPERATION)
            page.evaluate("window.loadedOnce = true")  # gone if the page were loaded again
            points.wait_for_note()
            # The first batch's counts while the run is held: only a poll can show them.
            expect(
                page.locator("[data-counts] li", has_text=re.compile(r"^moved: 10$"))
            ).to_have_count(1, timeout=60_000)
            expect(page.locator("[data-field=state]")).to_have_text("running")
            assert page.locator("[data-operation]").count() == 1
            points.release()
            expect(page.locator("[data-field=state]")).not_to_have_text("running", timeout=60_000)
            shown = state_and_counts(page)
            assert page.evaluate("window.loadedOnce") is True  # no reload
            assert page.locator("[data-operation]").count() == 0  # the polling stopped
            assert page.get_by_role("button", name="Stop").count() == 0
            watched.clean()
    finally:
        points.release()
    assert shown.startswith("completed |") and "moved: 25" in shown, shown
    assert queue_bodies(empty_sandbox, "onion-checkout") == sent  # each once


CONSOLE_PAGE = ROOT / "docs" / "console.md"
RUNBOOK = "## Runbook: draining an SQS DLQ in the console"
PAYMENTS = "apps.payments.*"


def runbook_steps() -> list[str]:
    """The names in bold of the console runbook, in its order (a step's own title, which
    ends in a period, aside): the links, fields and buttons the operator uses."""
    text = CONSOLE_PAGE.read_text(encoding="utf-8")
    section = text.split(RUNBOOK, 1)[1].split("\n## ", 1)[0]
    return [name for name in re.findall(r"\*\*([^*]+)\*\*", section) if not name.endswith(".")]


def in_doubt_claim(sandbox: Sandbox, workdir: Path) -> PlanItem:
    """A payments task that a run claimed and then died before sending (it ended
    interrupted): the in-doubt message of the runbook's step 2, still in the DLQ. Its key is
    the one a move gives it, as a CLI dry run's plan says."""
    plan = workdir / "plan.json"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "redrive", "move", "checkout"),
            "--task",
            PAYMENTS,
            "--plan-out",
            str(plan),
        ],
        env=sandbox.env,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    item = next(i for i in Plan.read(str(plan)).items if i.action == "send" and i.key)
    assert item.key is not None
    ledger = open_ledger(str(Path(sandbox.env["REDRIVE_STATE_DIR"]) / "ledger.sqlite3"))
    try:
        ledger.start_run("run-died", command="redrive move checkout --execute", info={})
        claim = Claim(item.key, item.task, item.message_id, item.target or "onion-checkout")
        ledger.claim_many("run-died", [claim])
        ledger.end_run("run-died", outcome="interrupted", counts={})
    finally:
        ledger.close()
    return item


def follow_the_runbook(page: Page, web: WebServer, doubt: PlanItem) -> tuple[list[str], int]:
    """The runbook's steps as it says them, each bold name used by its name; the names
    used, and how many messages the plan moved."""
    used: list[str] = []

    def use(role: str, name: str) -> Locator:
        used.append(name)
        return page.get_by_role(role, name=name)  # type: ignore[arg-type]

    page.goto(web.url + "/")
    use("link", "Overview").click()  # 1. look
    assert page.get_by_role("link", name="checkout", exact=True).is_visible()
    use("link", "Operations").click()  # 2. running or in doubt: resolve
    assert "nothing proves" in page.locator("tr", has_text=doubt.message_id).inner_text()
    use("radio", "resend").check()
    use("button", "Resolve as chosen").click()
    expect(page.get_by_role("status")).to_contain_text("resend 1; 0 left in doubt")
    use("link", "Overview").click()  # 3. the DLQ, filtered
    page.get_by_role("link", name="checkout", exact=True).click()
    used.append("Task")
    page.get_by_label("Task", exact=True).fill(PAYMENTS)
    use("button", "Filter").click()
    page.wait_for_url(re.compile(r"task=apps\.payments\.(\*|%2A)"))
    use("link", "Move, purge or repair").click()  # 4. dry run, the filter's selection
    assert page.get_by_label("Tasks").first.input_value() == PAYMENTS
    use("button", "Dry run").first.click()
    items = page.locator("table").last.locator("tbody tr")
    planned = items.count()
    assert planned > 1 and items.filter(has_text=doubt.message_id).count() == 1
    use("button", "Execute").click()  # 5. execute, followed live
    page.wait_for_url(OPERATION)
    state = page.locator("[data-field=state]")
    expect(state).not_to_have_text("running", timeout=120_000)
    assert state.inner_text() == "completed"  # 6. the result
    assert f"moved: {planned}" in page.locator("[data-counts]").inner_text()
    use("link", "Back to").click()
    assert re.search(r"task=apps\.payments\.(\*|%2A)", page.url), page.url
    use("button", "Scan now").click()
    assert page.get_by_label("Task", exact=True).input_value() == PAYMENTS
    use("link", "Operations").click()  # 7. the record
    assert "0 message(s) in doubt" in page.locator("main").inner_text()
    trail = page.locator("table").last.inner_text()
    assert "web apply" in trail and "127.0.0.1" in trail
    return used, planned


def test_the_console_runbook_step_by_step_on_the_sqs_sandbox(browser: Any, tmp_path: Path) -> None:
    """docs/console.md's runbook, its bold names used in its order, on a seeded sandbox with
    a task left in doubt by a run that died; then the broker: each payments task the plan
    moved once in its queue (the one in doubt among them), the rest still in the DLQ."""
    directory = tmp_path / "sandbox"
    directory.mkdir()
    with sqs_sandbox(directory, per_family=30) as sandbox:
        doubt = in_doubt_claim(sandbox, tmp_path)
        with redrive_web(tmp_path, sandbox.env, "--allow-actions") as web:
            watched = Watched(browser.new_page())
            used, planned = follow_the_runbook(watched.page, web, doubt)
            watched.clean()
        moved = queue_bodies(sandbox, "onion-checkout")
        left = queue_bodies(sandbox, "onion-checkout-dlq")
    assert used == runbook_steps()
    assert len(moved) == planned and len(set(moved)) == planned  # each task once
    tasks = [decode(body) for body in moved]
    assert all(fnmatch.fnmatchcase(t.task, PAYMENTS) for t in tasks)
    assert doubt.task_id in {t.task_id for t in tasks}  # resolved as resend: sent, once
    assert not set(moved) & set(left) and len(moved) + len(left) == 30
