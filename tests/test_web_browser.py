"""The console in a real browser (issue 41 point 7): Playwright for Python driving Debian's
Chromium (``executable_path``: nothing is downloaded), ``redrive web`` (uvicorn) started by
the test on a free loopback port, over the SQS sandbox (moto's server) and a RabbitMQ node.

The on-call read path (overview, a DLQ, a filter, a message, a reveal that the audit trail
records); the security cases (no session: sign in; a viewer cannot act; a POST without its
CSRF token is refused; a hostile task name, header and argument inert on every page: no
dialog fires, the text shows as text); every page at 390 px without horizontal scroll; and
screenshots at 1280 and 390 px, light and dark, under $REDRIVE_ARTIFACTS (else the test's
temporary directory). Chromium is Debian's package (``make test`` installs it as root);
without it these tests skip locally and fail under CI=true."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import skip_unless_installed
from web_console import HOSTILE_ARG, HOSTILE_HEADER, HOSTILE_TASK, PASSWORD
from web_servers import ROOT, Sandbox, WebServer, redrive_web, sqs_sandbox

from redrive.sandbox.encoder import encode
from redrive.sandbox.rabbitmq_layout import fill_layout, rabbit_families
from redrive.sandbox.rabbitmq_node import Vhost
from redrive.web.users import Role, User, hash_password, set_password

CHROMIUM = next(
    (found for name in ("chromium", "chromium-browser") if (found := shutil.which(name))), None
)
try:
    from playwright.sync_api import Browser, Page, sync_playwright
except ImportError:  # the test extra installs it
    sync_playwright = None  # type: ignore[assignment]

pytestmark = [
    pytest.mark.e2e,  # a browser, a sandbox and the console, each a process
    skip_unless_installed(
        CHROMIUM is not None and sync_playwright is not None,
        "no chromium on PATH or no playwright (as root, `make test` installs Debian's "
        "chromium; the test extra installs playwright)",
    ),
]
WIDE, NARROW = 1280, 390
#: Read when the module loads: the autouse aws_env fixture clears REDRIVE_* for each test.
ARTIFACTS = os.environ.get("REDRIVE_ARTIFACTS")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert CHROMIUM is not None and sync_playwright is not None
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM,
            # Root in CI containers; and no name resolves: the console fetches nothing.
            args=["--no-sandbox", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"],
        )
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with sqs_sandbox(tmp_path_factory.mktemp("sandbox"), per_family=30) as running:
        sqs = running.sqs()
        sqs.send_message(
            QueueUrl=sqs.get_queue_url(QueueName="onion-checkout-dlq")["QueueUrl"],
            MessageBody=encode(
                HOSTILE_TASK, [HOSTILE_ARG], {"note": HOSTILE_ARG}, origin=HOSTILE_HEADER
            ),
        )
        yield running


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    where = Path(ARTIFACTS or tmp_path) / "console-screenshots"
    where.mkdir(parents=True, exist_ok=True)
    return where


class Watched:
    """A page whose dialogs (an alert a hostile value ran) and CSP reports are recorded."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.dialogs: list[str] = []
        self.violations: list[str] = []
        page.on("dialog", self._dialog)
        page.on("console", self._console)

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def _console(self, message: Any) -> None:
        if "Content Security Policy" in message.text or "Refused to" in message.text:
            self.violations.append(message.text)

    def clean(self) -> None:
        assert self.dialogs == [], f"a dialog fired: {self.dialogs}"
        assert self.violations == [], f"the CSP refused: {self.violations}"


def no_horizontal_scroll(page: Page) -> bool:
    return bool(
        page.evaluate(
            "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
        )
    )


def on_call_path(page: Page, web: WebServer) -> None:
    """Overview, a DLQ, a filter, a message, a reveal."""
    page.goto(web.url + "/")
    page.get_by_role("link", name="checkout", exact=True).click()
    page.wait_for_url(re.compile(r"/dlq/checkout$"))
    assert page.get_by_role("heading", name="checkout").is_visible()
    page.get_by_label("Task").fill("apps.payments.*")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"task=apps\.payments\.(\*|%2A)"))
    tasks = page.locator("table").first.locator("tbody tr td:first-child a").all_inner_texts()
    assert tasks and all(t.startswith("apps.payments.") for t in tasks), tasks
    page.locator("a[href*='/message/']").first.click()
    assert "task=apps.payments.%2A" in page.url  # the filter stays with the message
    assert page.get_by_text("Hidden: arguments may hold personal data").is_visible()
    page.get_by_role("button", name="Reveal arguments").click()
    assert page.get_by_text("the audit trail records it").is_visible()
    assert page.locator("pre.json").first.inner_text().startswith("args:")


def test_the_on_call_read_path_on_the_sqs_sandbox(
    browser: Browser, sandbox: Sandbox, tmp_path: Path
) -> None:
    with redrive_web(tmp_path, sandbox.env) as web:
        page = Watched(browser.new_page())
        on_call_path(page.page, web)
        page.page.goto(web.url + "/operations")
        trail = page.page.locator("table").last.inner_text()
        page.clean()
    assert "web reveal" in trail and "127.0.0.1" in trail


def test_the_on_call_read_path_on_rabbitmq(
    browser: Browser, rabbitmq_vhost: Vhost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families(), 12)
    env = {**os.environ, "REDRIVE_STATE_DIR": str(tmp_path / "state")}
    broker = ("--broker", rabbitmq_vhost.amqp_url, "--rabbitmq-api", rabbitmq_vhost.api_url)
    with redrive_web(tmp_path, env, global_args=broker) as web:
        page = Watched(browser.new_page())
        page.page.goto(web.url + "/")
        assert "rabbitmq" in page.page.locator("p.meta").first.inner_text()
        page.page.get_by_role("link", name="checkout", exact=True).click()
        deaths = page.page.locator("td[data-label='Deaths']").all_inner_texts()
        assert any("rejected" in d or "expired" in d or "delivery_limit" in d for d in deaths)
        page.page.locator("a[href*='/message/']").first.click()
        page.page.get_by_role("button", name="Reveal arguments").click()
        assert page.page.get_by_text("the audit trail records it").is_visible()
        page.page.goto(web.url + "/operations")
        assert "web reveal" in page.page.locator("table").last.inner_text()
        page.clean()


def _users(tmp_path: Path) -> Path:
    path = tmp_path / "users"
    for name, role in (("vic", Role.VIEWER), ("ops", Role.OPERATOR)):
        set_password(path, User(name, role, hash_password(PASSWORD)))
    return path


def _sign_in(page: Page, web: WebServer, name: str) -> None:
    page.goto(web.url + "/dlq/checkout")
    page.wait_for_url(re.compile(r"/login\?next=%2Fdlq%2Fcheckout"))
    page.get_by_label("User").fill(name)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/dlq/checkout$"))


POST_SCAN = """async (csrf) => {
  const body = new URLSearchParams(csrf === null ? {} : {csrf});
  const answer = await fetch('/dlq/checkout/scan', {method: 'POST', body, redirect: 'manual'});
  return answer.status;
}"""


def test_sign_in_roles_and_csrf_in_the_browser(
    browser: Browser, sandbox: Sandbox, tmp_path: Path
) -> None:
    users = _users(tmp_path)
    with redrive_web(tmp_path, sandbox.env, "--allow-actions", "--users", str(users)) as web:
        viewer = browser.new_context().new_page()
        _sign_in(viewer, web, "vic")
        assert viewer.get_by_role("button", name="Scan now").count() == 0
        csrf = viewer.locator("input[name=csrf]").first.get_attribute("value")
        assert viewer.evaluate(POST_SCAN, csrf) == 403  # a viewer cannot act
        operator = browser.new_context().new_page()
        _sign_in(operator, web, "ops")
        assert operator.evaluate(POST_SCAN, None) == 403  # no CSRF token
        token = operator.locator("input[name=csrf]").first.get_attribute("value")
        assert operator.evaluate(POST_SCAN, token) in (0, 303)  # 0: an opaque redirect
        operator.get_by_role("button", name="Sign out").click()
        operator.wait_for_url(re.compile(r"/login$"))
        operator.goto(web.url + "/")
        assert "/login" in operator.url


def _pages(page: Page, web: WebServer) -> dict[str, str]:
    """Every page, the hostile message's among them (its reveal too): name -> URL."""
    page.goto(web.url + "/dlq/checkout")
    hostile = page.locator("tr", has_text="alert('task')").locator("a[href*='/message/']")
    assert hostile.count() == 1
    href = hostile.first.get_attribute("href")
    assert href is not None
    return {
        "overview": web.url + "/",
        "dlq": web.url + "/dlq/checkout",
        "filtered": web.url + "/dlq/checkout?task=apps.*&older_than=1h",
        "message": web.url + href,
        "operations": web.url + "/operations",
        "login": web.url + "/login",
    }


def test_every_page_is_inert_to_hostile_values_and_fits_390px(
    browser: Browser, sandbox: Sandbox, tmp_path: Path, artifacts: Path
) -> None:
    with redrive_web(tmp_path, sandbox.env) as web:
        setup = browser.new_page()
        pages = _pages(setup, web)
        for scheme in ("light", "dark"):
            for width in (WIDE, NARROW):
                context = browser.new_context(
                    viewport={"width": width, "height": 900}, color_scheme=scheme
                )
                watched = Watched(context.new_page())
                for name, url in pages.items():
                    watched.page.goto(url)
                    if name == "message":
                        watched.page.get_by_role("button", name="Reveal arguments").click()
                        assert watched.page.get_by_text(HOSTILE_ARG, exact=False).count() >= 1
                    if name in ("dlq", "message"):
                        assert watched.page.get_by_text(HOSTILE_TASK, exact=False).count() >= 1
                    if width == NARROW:
                        assert no_horizontal_scroll(watched.page), f"{name} scrolls at 390 px"
                    watched.page.screenshot(
                        path=str(artifacts / f"{name}-{width}-{scheme}.png"), full_page=True
                    )
                watched.clean()
                context.close()


def test_actions_on_a_reachable_bind_without_authentication_do_not_start(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "redrive", "web", "--bind", "0.0.0.0:0", "--allow-actions"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "REDRIVE_STATE_DIR": str(tmp_path)},
    )
    assert done.returncode == 2
    assert done.stderr.strip().startswith("Error: --allow-actions on 0.0.0.0 (not loopback)")
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
