"""The console in this process (Starlette's test client over in-process moto): its pages are
the CLI's views, every value a message carries is inert text, and its security decisions
(sign-in, roles, CSRF, the login rate limit, the bind refusal, the headers) hold."""

from __future__ import annotations

import re
from typing import Any

import pytest
from conftest import Family
from web_console import (
    HOSTILE_ARG,
    HOSTILE_HEADER,
    HOSTILE_TASK,
    client,
    console,
    csrf_of,
    sign_in,
    sqs_workspace,
    users,
)

from redrive.sandbox.encoder import encode
from redrive.web.security import CONTENT_SECURITY_POLICY
from redrive.web.settings import ConsoleSettings, bind_refusal
from redrive.web.users import Role


def hostile(family: Family) -> str:
    return family.send_to_dlq(
        encode(HOSTILE_TASK, [HOSTILE_ARG], {"note": HOSTILE_ARG}, origin=HOSTILE_HEADER)
    )


def test_the_overview_is_status_and_report_of_every_family(
    all_families: dict[str, Family],
) -> None:
    all_families["checkout"].send_to_dlq(encode("apps.payments.tasks.refund", [1]))
    with client(console(sqs_workspace())) as test:
        page = test.get("/")
        data = test.get("/api/overview").json()
    assert page.status_code == 200
    assert 'href="/dlq/checkout"' in page.text
    queues = {q["family"]: q for q in data["report"]["queues"]}
    assert queues["checkout"]["messages"] == 1
    assert queues["checkout"]["groups"][0]["task"] == "apps.payments.tasks.refund"
    assert {f["family"] for f in data["status"]["families"]} == set(queues)


def test_every_answer_carries_the_security_headers(all_families: dict[str, Family]) -> None:
    with client(console(sqs_workspace())) as test:
        answer = test.get("/")
    assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "unsafe-inline" not in CONTENT_SECURITY_POLICY
    assert answer.headers["x-frame-options"] == "DENY"
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" not in cookie


def test_a_hostile_task_header_and_argument_are_text_on_the_dlq_page(family: Family) -> None:
    hostile(family)
    with client(console(sqs_workspace())) as test:
        page = test.get("/dlq/checkout").text
    assert "<script>" not in page and "<img" not in page
    assert "apps.&lt;script&gt;alert(&#39;task&#39;)&lt;/script&gt;" in page


def test_no_session_is_sent_to_sign_in(all_families: dict[str, Family]) -> None:
    with client(console(sqs_workspace(), users=users(ann=Role.VIEWER))) as test:
        page = test.get("/dlq/checkout?task=x")
        api = test.get("/api/status")
    assert page.status_code == 303
    assert page.headers["location"] == "/login?next=%2Fdlq%2Fcheckout%3Ftask%3Dx"
    assert api.status_code == 401


def test_a_user_signs_in_and_out(all_families: dict[str, Family]) -> None:
    with client(console(sqs_workspace(), users=users(ann=Role.VIEWER))) as test:
        signed = sign_in(test, "ann")
        assert signed.status_code == 303
        overview = test.get("/")
        assert overview.status_code == 200 and "ann · viewer" in overview.text
        out = test.post("/logout", data={"csrf": csrf_of(overview.text)})
        assert out.status_code == 303
        assert test.get("/").status_code == 303


def test_a_post_without_its_csrf_token_is_refused(all_families: dict[str, Family]) -> None:
    with client(console(sqs_workspace(), users=users(ann=Role.VIEWER))) as test:
        test.get("/login")
        answer = test.post("/login", data={"user": "ann", "password": "x", "next": "/"})
    assert answer.status_code == 403


def test_sign_ins_are_limited_per_address_by_the_console_clock(
    all_families: dict[str, Family],
) -> None:
    now = [1_800_000_000.0]
    app = console(
        sqs_workspace(), users=users(ann=Role.VIEWER), clock=lambda: now[0], login_failures=3
    )
    with client(app) as test:
        codes = [sign_in(test, "ann", "wrong").status_code for _ in range(3)]
        assert codes == [401, 401, 401]
        assert sign_in(test, "ann").status_code == 429  # the right password, too soon
        now[0] += app.settings.login_window
        assert sign_in(test, "ann").status_code == 303


@pytest.mark.parametrize(
    ("host", "actions", "auth", "refused"),
    [
        ("0.0.0.0", True, False, True),
        ("0.0.0.0", False, False, False),
        ("0.0.0.0", True, True, False),
        ("127.0.0.1", True, False, False),
        ("::1", True, False, False),
        ("10.1.2.3", True, False, True),
    ],
)
def test_actions_on_a_reachable_bind_need_authentication(
    host: str, actions: bool, auth: bool, refused: bool
) -> None:
    settings = ConsoleSettings(
        host=host, allow_actions=actions, users=users(ann=Role.OPERATOR) if auth else None
    )
    assert (bind_refusal(settings) is not None) == refused


def test_the_cli_refuses_actions_on_a_reachable_bind_in_one_line(cli: Any) -> None:
    result = cli("web", "--bind", "0.0.0.0:8080", "--allow-actions")
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "needs authentication" in result.stderr


def test_passwd_writes_an_scrypt_hash_with_a_role(cli: Any, tmp_path: Any) -> None:
    path = tmp_path / "users"
    result = cli(
        "web",
        "passwd",
        "ann",
        str(path),
        "--role",
        "operator",
        "--password-stdin",
        input="s3cret\n",
    )
    assert result.exit_code == 0, result.stderr
    line = path.read_text().strip()
    assert re.fullmatch(r"ann:operator:scrypt\$16384\$8\$1\$[0-9a-f]{32}\$[0-9a-f]{64}", line)
    assert "s3cret" not in line
    assert path.stat().st_mode & 0o777 == 0o600
