"""The console's operations in a real browser (issue 41): an operation's page following its
progress live (the console's own script polling /api/operations/ID), and the on-call runbook
done in the console (docs/console.md), step by step as it says, on the SQS sandbox, checked
afterwards through the broker. Playwright drives Debian's Chromium as in test_web_browser.py
(its fixtures and skips); each test has a sandbox of its own, since it changes its queues."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_web_browser
from kill_points import At, KillPoints
from test_web_browser import Watched
from web_servers import Sandbox, redrive_web, sqs_sandbox

from redrive.sandbox.encoder import encode

try:
    from playwright.sync_api import expect
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
