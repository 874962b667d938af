"""A DLQ page's filters keep after an action (issue 41: Mission Control's bulk retry "keeps
the filter"): the action started from a filtered page selects what it shows, and its dry
run, execute and stop pages, their redirects and their links back to the DLQ, all carry the
page's filters (task, age, ``--where``, group by), which live in its URL. Over in-process
moto with Starlette's test client, as tests/test_web_actions.py."""

from __future__ import annotations

import html
import re
import threading
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from conftest import Family, wait_until
from test_web_actions import CHARGE, MAIL, acting_console, bodies, charge_body
from web_console import client, csrf_of, operation_json

from redrive.operations.coordinator import Outcome
from redrive.sandbox.encoder import encode
from redrive.web.actions import operations_of
from redrive.web.security import Person
from redrive.web.users import Role

#: The filtered view: payments-like tasks by glob, an age, a --where, grouped by a kwarg.
VIEW = [
    ("task", "apps.shop.*"),
    ("older_than", "0s"),
    ("where", "kwargs.currency == 'USD'"),
    ("group_by", "kwargs.currency"),
]


def link(page: str, text: str) -> str:
    """The href of the link whose text starts with ``text``."""
    found = re.search(r'<a href="([^"]+)">' + re.escape(text), page)
    assert found is not None, text
    return html.unescape(found.group(1))


def form_action(page: str, ends: str) -> str:
    found = re.search(r'<form method="post" action="([^"]*' + re.escape(ends) + r'[^"]*)"', page)
    assert found is not None, ends
    return html.unescape(found.group(1))


def field(page: str, name: str) -> str:
    """A form field's value (an input's value or a textarea's text)."""
    found = re.search(r'<input type="hidden" name="' + name + r'" value="([^"]*)"', page)
    found = found or re.search(r'name="' + name + r'"[^>]*>([^<]*)</textarea>', page)
    found = found or re.search(r'name="' + name + r'" value="([^"]*)"', page)
    assert found is not None, name
    return html.unescape(found.group(1))


def keeps_the_view(url: str, path: str) -> None:
    parts = urlsplit(url)
    assert parts.path.startswith(path), url
    kept = [(k, v) for k, v in parse_qsl(parts.query) if k != "error"]
    assert kept == VIEW, url


def test_an_action_from_a_filtered_dlq_page_selects_it_and_keeps_it_to_the_end(
    family: Family, tmp_path: Path
) -> None:
    charges = [charge_body(n) for n in range(3)]
    for body in charges:
        family.send_to_dlq(body)
    family.send_to_dlq(encode(CHARGE, [9], {"currency": "EUR"}, task_id="charge-eur"))
    family.send_to_dlq(encode(MAIL, [], {"currency": "USD"}, task_id="mail-1"))
    with client(acting_console(tmp_path)) as test:
        page = test.get("/dlq/checkout", params=VIEW)
        assert page.status_code == 200, page.text
        ticked = re.search(
            r'<form method="get" action="/actions/new" class="ticked">.*?<table', page.text, re.S
        )
        assert ticked is not None
        hidden = re.findall(r'type="hidden" name="([^"]+)" value="([^"]*)"', ticked.group(0))
        kept = [(name, html.unescape(value)) for name, value in hidden if name != "target"]
        assert kept == VIEW  # ticked messages keep the view too
        new = test.get(link(page.text, "Move, purge or repair"))
        assert new.status_code == 200, new.text
        # The dry run's selection is the page's, and the view rides along.
        assert field(new.text, "tasks") == "apps.shop.*"
        assert field(new.text, "older_than") == "0s"
        assert field(new.text, "where") == "kwargs.currency == 'USD'"
        keeps_the_view(link(new.text, "Back to checkout"), "/dlq/checkout")
        asked = {
            name: field(new.text, name) for name in ("csrf", "view", "tasks", "older_than", "where")
        }
        done = test.post("/actions/dry-run", data={**asked, "target": "checkout", "kind": "move"})
        assert done.status_code == 303, done.text
        keeps_the_view(done.headers["location"], "/actions/plans/")
        plan = test.get(done.headers["location"])
        assert plan.text.count("sha256:") == 3  # the three USD charges, nothing else
        keeps_the_view(link(plan.text, "Back to checkout"), "/dlq/checkout")
        execute = form_action(plan.text, "/execute")
        keeps_the_view(execute, "/actions/plans/")
        started = test.post(execute, data={"csrf": csrf_of(plan.text)})
        assert started.status_code == 303, started.text
        location = started.headers["location"]
        keeps_the_view(location, "/actions/operations/")
        running = test.get(location).text
        keeps_the_view(link(running, "Back to checkout"), "/dlq/checkout")
        wait_until(
            lambda: operation_json(test, location)["state"] != "running",
            timeout=60,
            what="the move ends",
        )
        ended = test.get(location).text
        keeps_the_view(link(ended, "Back to checkout"), "/dlq/checkout")
    assert bodies(family, family.queue_url) == sorted(charges)


def test_a_refused_confirmation_and_a_stop_keep_the_view(family: Family, tmp_path: Path) -> None:
    """A purge's plan page sent back for its typed name, and an operation stopped from its
    page: both redirects keep the view."""
    family.send_to_dlq(charge_body(1))
    shared = acting_console(tmp_path)
    with client(shared) as test:
        new = test.get("/actions/new", params=[("target", "checkout"), *VIEW])
        archive = str(tmp_path / "purged.jsonl.gz")
        asked = {name: field(new.text, name) for name in ("csrf", "view", "tasks")}
        asked |= {"target": "checkout", "kind": "purge", "archive": archive}
        plan = test.get(test.post("/actions/dry-run", data=asked).headers["location"])
        refused = test.post(
            form_action(plan.text, "/execute"), data={"csrf": csrf_of(plan.text), "confirm": "no"}
        )
        keeps_the_view(refused.headers["location"], "/actions/plans/")
        assert "type the DLQ" in test.get(refused.headers["location"]).text
        # An operation that runs until stopped: its page's stop keeps the view.
        person = Person("local", Role.OPERATOR, "127.0.0.1", "local")

        def until_stopped(stop: threading.Event, observer: Any) -> Outcome[Any]:
            stop.wait(60)
            return Outcome(None)

        op = operations_of(shared).start(
            plan_id="0" * 16, kind="move", target="checkout", person=person, work=until_stopped
        )
        page = test.get(f"/actions/operations/{op.id}", params=VIEW).text
        stop = form_action(page, "/stop")
        keeps_the_view(stop, f"/actions/operations/{op.id}/stop")
        stopped = test.post(stop, data={"csrf": csrf_of(page)})
        assert stopped.status_code == 303, stopped.text
        keeps_the_view(stopped.headers["location"], f"/actions/operations/{op.id}")
        assert op.thread is not None
        op.thread.join(60)
    assert family.depth() == (1, 0)  # the purge was never confirmed
