"""The console in this process (Starlette's test client over in-process moto): its pages are
the CLI's views, every value a message carries is inert text, and its security decisions
(sign-in, roles, CSRF, the login rate limit, the bind refusal, the headers) hold."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
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

from redrive.ledger import Claim, open_ledger
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


def _message_link(html: str) -> str:
    found = re.search(r'href="(/dlq/checkout/message/[^"]+)"', html)
    assert found is not None, html
    return found.group(1).replace("&amp;", "&")


def test_arguments_stay_hidden_until_revealed_and_each_reveal_is_audited(
    family: Family,
) -> None:
    family.send_to_dlq(encode("apps.users.tasks.erase", [], {"email": "ann@example.com"}))
    app = console(sqs_workspace(), users=users(vic=Role.VIEWER))
    with client(app) as test:
        sign_in(test, "vic")
        link = _message_link(test.get("/dlq/checkout").text)
        page = test.get(link)
        assert page.status_code == 200, page.text
        assert "ann@example.com" not in page.text
        reveal = link.replace("/message/", "/reveal/")
        assert test.post(reveal, data={}).status_code == 403  # no CSRF token
        assert test.get("/api/operations").json()["runs"] == []
        shown = test.post(reveal, data={"csrf": csrf_of(page.text)})
        assert shown.status_code == 200 and "ann@example.com" in shown.text
        runs = test.get("/api/operations").json()["runs"]
    assert [r["command"] for r in runs] == ["web reveal"]
    info = runs[0]["info"]
    assert info["person"]["name"] == "vic" and info["person"]["address"] == "testclient"
    assert info["task"] == "apps.users.tasks.erase" and info["target"] == "checkout"


def test_a_hostile_message_is_inert_text_on_every_page(family: Family) -> None:
    hostile(family)
    with client(console(sqs_workspace())) as test:
        dlq = test.get("/dlq/checkout").text
        link = _message_link(dlq)
        message = test.get(link).text
        revealed = test.post(link.replace("/message/", "/reveal/"), data={"csrf": csrf_of(message)})
        pages = [test.get("/").text, dlq, message, revealed.text, test.get("/operations").text]
    for page in pages:
        assert "<script>alert" not in page and "<img" not in page and "</td><script>" not in page
    assert "&lt;script&gt;alert(&#39;arg&#39;)" in revealed.text
    assert "onerror=alert(" in message and "&lt;img src=x onerror" in message


def test_the_api_answers_with_the_clis_json(family: Family, cli: Any) -> None:
    family.send_to_dlq(encode("apps.payments.tasks.refund", [1]))
    with client(console(sqs_workspace())) as test:
        status = test.get("/api/status").json()
        inspected = test.get("/api/dlq/checkout").json()["inspect"]
    assert status == json.loads(cli("status", "--json").stdout)
    expected = json.loads(cli("inspect", "checkout", "--json").stdout)
    assert set(inspected) == set(expected)
    assert [set(g) for g in inspected["groups"]] == [set(g) for g in expected["groups"]]
    assert inspected["groups"][0]["task"] == expected["groups"][0]["task"]


def test_a_target_that_is_no_dlq_is_404_and_a_bad_where_400(
    all_families: dict[str, Family],
) -> None:
    with client(console(sqs_workspace())) as test:
        assert test.get("/api/dlq/nope").status_code == 404
        assert test.get("/dlq/nope").status_code == 404
        assert test.get("/api/dlq/checkout?where=kwargs[").status_code == 400
        assert test.get("/dlq/checkout?older_than=soon").status_code == 400


@pytest.mark.e2e  # the run's owner is a process of its own, alive
def test_a_live_runs_progress_is_its_keys_in_the_ledger(
    all_families: dict[str, Family], tmp_path: Any
) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    ledger = open_ledger(str(tmp_path / "ledger.sqlite3"))
    try:
        info = {"host": socket.gethostname(), "pid": sleeper.pid}
        ledger.start_run("run-1", command="redrive move checkout --execute", info=info)
        ledger.claim_many("run-1", [Claim(f"k{i}", "apps.t", f"m{i}", "q") for i in range(3)])
        ledger.mark_sent_many("run-1", {"k0": "s0"})
        workspace = sqs_workspace(ledger_uri=str(tmp_path / "ledger.sqlite3"))
        with client(console(workspace)) as test:
            live = test.get("/api/operations").json()["live"]
            fragment = test.get("/operations/live").text
    finally:
        ledger.close()
        sleeper.kill()
        sleeper.wait()
    assert [(r["run_id"], r["keys"]) for r in live] == [("run-1", {"claimed": 2, "sent": 1})]
    assert "claimed 2, sent 1" in fragment


def _in_doubt_ledger(path: Any) -> None:
    """Three keys a run claimed and never confirmed: it ended interrupted."""
    ledger = open_ledger(str(path))
    try:
        ledger.start_run("run-1", command="redrive move checkout --execute", info={})
        ledger.claim_many("run-1", [Claim(f"k{i}", "apps.t", f"m{i}", "q") for i in range(3)])
        ledger.end_run("run-1", outcome="interrupted", counts={})
    finally:
        ledger.close()


def test_in_doubt_messages_are_resolved_by_an_operators_choice_and_audited(
    all_families: dict[str, Family], tmp_path: Any
) -> None:
    path = tmp_path / "ledger.sqlite3"
    _in_doubt_ledger(path)
    workspace = sqs_workspace(ledger_uri=str(path))
    app = console(workspace, users=users(ops=Role.OPERATOR, vic=Role.VIEWER), allow_actions=True)
    with client(app) as test:
        sign_in(test, "vic")
        page = test.get("/operations")
        assert page.status_code == 200 and "Resolve as chosen" not in page.text
        form = {"csrf": csrf_of(page.text), "choice:k1": "skip"}
        assert test.post("/operations/resolve", data=form).status_code == 403
        test.cookies.clear()
        sign_in(test, "ops")
        page = test.get("/operations")
        assert "Resolve as chosen" in page.text
        assert test.post("/operations/resolve", data={"choice:k1": "skip"}).status_code == 403
        form = {"csrf": csrf_of(page.text), "choice:k1": "skip", "choice:k2": "resend"}
        done = test.post("/operations/resolve", data=form)
        assert done.status_code == 200, done.text
        assert "Resolved: resend 1, skip 1, leave 1; 1 left in doubt." in done.text
        data = test.get("/api/operations").json()
    assert [m["key"] for m in data["in_doubt"]["messages"]] == ["k0"]
    audit = [r for r in data["runs"] if r["command"] == "web ledger resolve"]
    assert audit[0]["info"]["person"]["name"] == "ops"
    assert audit[0]["info"]["skip"] == ["k1"] and audit[0]["info"]["resend"] == ["k2"]


def test_without_allow_actions_nothing_is_resolved(
    all_families: dict[str, Family], tmp_path: Any
) -> None:
    path = tmp_path / "ledger.sqlite3"
    _in_doubt_ledger(path)
    with client(console(sqs_workspace(ledger_uri=str(path)))) as test:
        assert "Resolve as chosen" not in test.get("/operations").text
        form = {"csrf": test.get("/api/session").json()["csrf"], "choice:k1": "skip"}
        assert test.post("/operations/resolve", data=form).status_code == 403
        assert len(test.get("/api/operations").json()["in_doubt"]["messages"]) == 3
