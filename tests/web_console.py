"""What the console's tests share: a console over a broker (in-process moto, a moto server,
a RabbitMQ vhost), Starlette's test client on it, and the hostile values every page must
show as text."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from starlette.testclient import TestClient

from redrive.aws.session import AwsSettings
from redrive.broker import open_broker
from redrive.config import load_layout
from redrive.web.app import create_app
from redrive.web.console import Console
from redrive.web.settings import ConsoleSettings
from redrive.web.users import Role, User, Users, hash_password
from redrive.web.workspace import Workspace

#: Values a message may carry that would be markup or script if a page did not escape them.
HOSTILE_TASK = "apps.<script>alert('task')</script>"
HOSTILE_HEADER = '"><img src=x onerror=alert("header")>'
HOSTILE_ARG = "</td><script>alert('arg')</script>"
#: One password for every test user: scrypt of it once, not per test.
PASSWORD = "correct horse battery staple"
_HASH = hash_password(PASSWORD, salt=b"redrive-tests-16")


def users(**roles: Role) -> Users:
    return Users("test-users", {name: User(name, role, _HASH) for name, role in roles.items()})


def sqs_workspace(config: str | None = None, **options: Any) -> Workspace:
    aws = AwsSettings(None, None, None)
    return Workspace(
        load_layout(config),
        lambda region: open_broker(
            None, aws=aws, region=region, sqs_client="botocore", rabbitmq_api=None
        ),
        client_factory=aws.client,
        **options,
    )


def console(
    workspace: Workspace,
    settings: ConsoleSettings | None = None,
    clock: Callable[[], float] | None = None,
    **changes: Any,
) -> Console:
    settings = replace(settings or ConsoleSettings(secret=b"test-secret" * 3), **changes)
    return Console(settings, workspace, clock=clock) if clock else Console(settings, workspace)


def client(console: Console, address: str = "testclient") -> TestClient:
    return TestClient(
        create_app(console),
        base_url="http://127.0.0.1",
        follow_redirects=False,
        client=(address, 50000),
    )


_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    found = _CSRF.search(html)
    assert found is not None, html[:2000]
    return found.group(1)


def sign_in(test: TestClient, name: str, password: str = PASSWORD) -> Any:
    page = test.get("/login")
    return test.post(
        "/login",
        data={"user": name, "password": password, "csrf": csrf_of(page.text), "next": "/"},
    )


def operation_json(test: TestClient, location: str) -> dict[str, Any]:
    """The operation an execute redirected to (its page's URL), as /api/operations/ID has
    it: what the page's script polls."""
    op_id = location.split("?", 1)[0].rsplit("/", 1)[1]
    answer = test.get(f"/api/operations/{op_id}")
    assert answer.status_code == 200, answer.text
    data: dict[str, Any] = answer.json()
    return data
