"""The operations page's in-doubt list a page at a time (issue 41): a ledger may hold
thousands of in-doubt keys; the page and its JSON show 50 at a time, count them all, and
page through them in the ledger's order, each key on one page only."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import Family
from web_console import client, console, csrf_of, sqs_workspace

from redrive.ledger import Claim, open_ledger
from redrive.web.reads import IN_DOUBT_PAGE

KEYS = 2 * IN_DOUBT_PAGE + 20


def in_doubt_ledger(path: Path) -> list[str]:
    """KEYS keys a run claimed and never confirmed (it ended interrupted), in claim order."""
    keys = [f"k{i:04d}" for i in range(KEYS)]
    ledger = open_ledger(str(path))
    try:
        ledger.start_run("run-1", command="redrive move checkout --execute", info={})
        ledger.claim_many("run-1", [Claim(k, "apps.t", f"m-{k}", "q") for k in keys])
        ledger.end_run("run-1", outcome="interrupted", counts={})
    finally:
        ledger.close()
    return keys


def test_the_in_doubt_list_is_paged(all_families: dict[str, Family], tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    keys = in_doubt_ledger(path)
    with client(console(sqs_workspace(ledger_uri=str(path)))) as test:
        pages = []
        for number in (1, 2, 3):
            data = test.get("/api/operations", params={"in_doubt_page": number}).json()
            pages.append(data["in_doubt"])
        first = test.get("/operations")
        following = re.search(r'<a href="([^"]+)">Next page</a>', first.text)
        assert following is not None
        second = test.get(following.group(1))
        beyond = test.get("/api/operations", params={"in_doubt_page": 4}).json()["in_doubt"]
        refused = test.get("/api/operations", params={"in_doubt_page": "0"})
        refused_page = test.get("/operations?in_doubt_page=x")
    assert [len(p["messages"]) for p in pages] == [IN_DOUBT_PAGE, IN_DOUBT_PAGE, 20]
    assert all(p["in_doubt"] == KEYS and p["pages"] == 3 for p in pages)
    assert all(p["by_action"] == {"leave": KEYS} for p in pages)  # counts of them all
    assert [m["key"] for p in pages for m in p["messages"]] == keys  # each once, in order
    assert beyond["messages"] == [] and beyond["in_doubt"] == KEYS
    assert refused.status_code == 400 and "page" in refused.json()["error"]
    assert refused_page.status_code == 400
    assert f"{KEYS} message(s) in doubt" in first.text
    shown = re.findall(r'<td data-label="Message">([^<]+)</td>', first.text)
    assert shown == [f"m-{k}" for k in keys[:IN_DOUBT_PAGE]]
    assert "Page 1 of 3" in first.text and "in_doubt_page=2" in first.text
    assert "Page 2 of 3" in second.text
    assert re.findall(r'<td data-label="Message">([^<]+)</td>', second.text) == [
        f"m-{k}" for k in keys[IN_DOUBT_PAGE : 2 * IN_DOUBT_PAGE]
    ]


def test_a_choice_on_a_later_page_is_resolved(
    all_families: dict[str, Family], tmp_path: Path
) -> None:
    """The second page's form names its own keys; resolving one (the paged resolve, as the
    CLI's) says what came of them all (the rest left), and the list is one shorter."""
    path = tmp_path / "ledger.sqlite3"
    keys = in_doubt_ledger(path)
    chosen = keys[IN_DOUBT_PAGE + 3]
    with client(console(sqs_workspace(ledger_uri=str(path)), allow_actions=True)) as test:
        page = test.get("/operations?in_doubt_page=2")
        assert f'name="choice:{chosen}"' in page.text
        assert f'name="choice:{keys[0]}"' not in page.text
        form = {"csrf": csrf_of(page.text), f"choice:{chosen}": "resend"}
        done = test.post("/operations/resolve", data=form)
        after = test.get("/api/operations").json()["in_doubt"]
    assert done.status_code == 200, done.text
    left = KEYS - 1
    assert f"Resolved: resend 1, leave {left}; {left} left in doubt." in done.text
    assert after["in_doubt"] == left
