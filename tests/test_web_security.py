"""The console's security decisions as pure functions and through the app: a trusted proxy's
user headers only from its addresses, signed sessions that a changed byte or age undoes, the
way back after signing in never leaving the console, and the timeline chart's geometry."""

from __future__ import annotations

import ipaddress

import pytest
from conftest import Family
from web_console import client, console, sqs_workspace, users

from redrive.web.charts import SERIES, timeline_chart
from redrive.web.pages import _next_path
from redrive.web.samples import public_record
from redrive.web.security import LoginLimiter, read_session, sign_session
from redrive.web.users import Role, Users, hash_password, parse_users, password_matches

PROXY = (ipaddress.ip_network("10.0.0.0/8"),)
NOW = 1_800_000_000.0


def test_a_trusted_proxys_user_header_names_the_person(all_families: dict[str, Family]) -> None:
    app = console(sqs_workspace(), trusted_proxies=PROXY, users=users(ops=Role.OPERATOR))
    headers = {
        "x-forwarded-user": "ops",
        "x-forwarded-for": "192.0.2.7",
        "x-forwarded-proto": "https",
    }
    with client(app, "10.1.2.3") as test:
        answer = test.get("/api/session", headers=headers)
        other = test.get("/api/session", headers={"x-forwarded-user": "eve"})
    assert answer.status_code == 200
    person = answer.json()["person"]
    assert person == {
        "name": "ops",
        "role": "operator",
        "address": "192.0.2.7",
        "via": "proxy",
        "email": None,
    }
    assert "Secure" in answer.headers["set-cookie"]  # HTTPS at the proxy
    assert other.json()["person"]["role"] == "viewer"  # not listed: a viewer


def test_the_user_header_from_any_other_address_is_ignored(all_families: dict[str, Family]) -> None:
    app = console(sqs_workspace(), trusted_proxies=PROXY)
    with client(app, "192.0.2.9") as test:
        answer = test.get("/api/session", headers={"x-forwarded-user": "ops"})
        page = test.get("/", headers={"x-forwarded-user": "ops"})
    assert answer.status_code == 401
    assert page.status_code == 303 and page.headers["location"].startswith("/login")


def test_a_session_is_undone_by_a_changed_byte_a_wrong_key_or_its_age() -> None:
    cookie = sign_session({"issued": NOW, "user": "ann", "csrf": "t"}, b"k" * 32)
    assert read_session(cookie, b"k" * 32, now=NOW + 10, max_age=60) is not None
    forged = sign_session({"issued": NOW, "user": "root", "csrf": "t"}, b"x" * 32)
    assert read_session(forged, b"k" * 32, now=NOW, max_age=60) is None
    payload, mac = cookie.split(".")
    assert read_session(payload[:-1] + "A." + mac, b"k" * 32, now=NOW, max_age=60) is None
    assert read_session(cookie, b"k" * 32, now=NOW + 61, max_age=60) is None
    assert read_session("garbage", b"k" * 32, now=NOW, max_age=60) is None


@pytest.mark.parametrize(
    ("asked", "goes"),
    [
        ("/dlq/checkout?task=x", "/dlq/checkout?task=x"),
        ("//evil.example/", "/"),
        ("https://evil.example/", "/"),
        ("/\\\\evil.example", "/"),
        ("", "/"),
    ],
)
def test_signing_in_goes_back_only_within_the_console(asked: str, goes: str) -> None:
    assert _next_path(asked) == goes


def test_the_users_file_keeps_roles_and_checks_passwords() -> None:
    stored = hash_password("pw", salt=b"s" * 16)
    parsed = parse_users(f"# team\nann:operator:{stored}\nops@example.com:viewer:-\n", source="f")
    assert isinstance(parsed, Users) and parsed.get("ann") is not None
    assert parsed.authenticate("ann", "pw") is not None
    assert parsed.authenticate("ann", "wrong") is None
    assert parsed.authenticate("ops@example.com", "") is None  # a proxy user signs in nowhere
    assert not password_matches("pw", "scrypt$bad")


def _group(task: str, start: str, counts: list[int]) -> dict[str, object]:
    return {"task": task, "timeline": {"start": start, "bucket_seconds": 3600, "counts": counts}}


def test_the_timeline_stacks_groups_over_one_span_and_names_the_rest_others() -> None:
    groups = [_group(f"t{i}", "2026-12-06T10:00:00Z", [1, 0, 2]) for i in range(SERIES + 2)]
    groups.append(_group("late", "2026-12-06T12:00:00Z", [5]))
    chart = timeline_chart(groups)
    assert chart is not None
    assert chart.peak == 2 * (SERIES + 2) + 5
    assert chart.start == "2026-12-06T10:00:00Z" and chart.end == "2026-12-06T13:00:00Z"
    assert chart.legend[-1] == (SERIES - 1, "4 others")
    assert all(b.y >= 0 and b.y + b.height <= chart.height for b in chart.bars)
    assert timeline_chart([{"task": "x", "timeline": None}]) is None


def test_a_public_record_withholds_the_arguments_wherever_they_are() -> None:
    record = {
        "task": "t",
        "args": [1],
        "kwargs": {"email": "a@b"},
        "body": "x",
        "json": {},
        "headers": {"argsrepr": "(1,)", "kwargsrepr": "{'email': 'a@b'}", "retries": 0},
        "attributes": {"kwargsrepr": "{'email': 'a@b'}", "priority": 0},
    }
    shown = public_record(record)
    assert "a@b" not in repr(shown)
    assert shown["headers"]["retries"] == 0 and shown["attributes"]["priority"] == 0
    assert record["kwargs"] == {"email": "a@b"}  # the kept record is left whole


def test_the_login_limit_forgets_quiet_keys_beyond_its_bound() -> None:
    now = [NOW]
    limiter = LoginLimiter(lambda: now[0], failures=1, window=60)
    for i in range(10_001):
        limiter.failed(f"user:{i}")
    now[0] += 61
    limiter.failed("user:new")
    assert len(limiter._seen) == 1
