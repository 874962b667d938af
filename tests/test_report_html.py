"""``report --format html`` (issue 16): one self-contained page, a chart per group, nothing
fetched, nothing a message holds turned into markup, no arguments unless --show-args; and the
hostile task name in every sink a report goes to (HTML, Markdown, Slack)."""

from __future__ import annotations

import json
import re
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

from conftest import Cli, Family

from redrive.celery.results import ResultCounts
from redrive.inspection.groups import Grouping, TaskGroup
from redrive.inspection.scan import InspectResult
from redrive.render.html import report_html
from redrive.render.report import report_text, since_last_text
from redrive.render.slack import slack_payload
from redrive.reporting.alerts import Change
from redrive.reporting.report import FamilyReport, Report
from redrive.sandbox.encoder import encode

NOW = 1_800_000_000.0
HOUR = 3600.0
HOSTILE = (
    "apps.x</span><script>alert(1)</script><img src=https://evil.example/x.png "
    "onerror=alert(2)>|a\\|b `code` [link](https://evil.example) <!here> <!channel> "
    "<@U024BE7LH> <https://evil.example|click me> & \"quoted\" 'single'"
)
CHARGE = "apps.shop.tasks.charge"


def grouped(times: dict[str, list[float]], *, show_args: bool = False) -> list[TaskGroup]:
    from redrive.messages import decode

    grouping = Grouping(now=NOW, show_args=show_args)
    for task, sent in times.items():
        body = encode(task, ["secret-argument <b>bold</b>"])
        for i, ts in enumerate(sent):
            grouping.add(
                decode(body),
                message_id=f"m{i}",
                sent_at=ts,
                receive_count=5,
                redrive_count=3 if i == 0 else 0,
                body=body,
            )
    return grouping.sorted_groups()


def result_of(groups: list[TaskGroup], dlq: str = "onion-checkout-dlq") -> InspectResult:
    return InspectResult(
        label="checkout",
        dlq=dlq,
        dlq_url=f"https://sqs.us-east-1.amazonaws.com/1/{dlq}",
        sources=["onion-checkout"],
        total=sum(g.count for g in groups),
        groups=groups,
        oldest=min((g.oldest for g in groups if g.oldest), default=None),
        scanned_at=NOW,
        seconds=0.1,
        depth_before=sum(g.count for g in groups),
        hidden_before=0,
        partial=False,
    )


def hostile_report(*, show_args: bool = False) -> Report:
    checkout = grouped(
        {
            HOSTILE: [NOW - 5 * HOUR + i * 60 for i in range(8)],
            CHARGE: [NOW - 2 * HOUR, NOW - HOUR],
        },
        show_args=show_args,
    )
    progress = grouped({"apps.p.tasks.save": [NOW - 26 * HOUR, NOW - 3 * HOUR]})
    return Report(
        NOW,
        "built-in",
        [
            FamilyReport("checkout", "onion-checkout-dlq", result_of(checkout)),
            FamilyReport("default", "onion-dlq", result_of([], "onion-dlq")),
            FamilyReport("progress", "onion-progress-dlq", result_of(progress)),
            FamilyReport("export", None, None, "queue <b>onion-export</b> does not exist"),
        ],
    )


HOSTILE_EXCEPTION = "Bad</dd><script>alert(3)</script>Error"


def why_report(*, show_args: bool = False) -> Report:
    """The hostile report as read with a result backend: states (a worker that died among
    them) and exceptions per group, one of them a hostile name."""
    report = hostile_report()
    checkout = report.queues[0].result
    assert checkout is not None
    checkout.result_backend = "redis://127.0.0.1:6379/0"
    hostile = next(g for g in checkout.groups if g.task == HOSTILE)
    hostile.results = ResultCounts(
        states=Counter({"FAILURE": 5, "STARTED": 3}),
        exceptions=Counter({HOSTILE_EXCEPTION: 4, "ValueError": 1}),
        samples={"ValueError": "amount <b>-1</b>"} if show_args else {},
        worker_died=3,
    )
    return report


class Page(HTMLParser):
    """What a browser would build: every tag with its attributes, and the text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parsed(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    return page


TAGS_WE_WRITE = {
    "html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "p", "section",
    "span", "dl", "div", "dt", "dd", "svg", "rect", "line", "details", "summary", "pre", "table",
    "thead", "tbody", "tr", "th", "td",
}  # fmt: skip


def test_html_is_self_contained_and_a_task_name_cannot_inject_markup() -> None:
    text = report_html(hostile_report())
    page = parsed(text)
    assert {tag for tag, _ in page.tags} <= TAGS_WE_WRITE
    for tag, attrs in page.tags:
        for name, value in attrs.items():
            # No handler, and nothing that points anywhere: the page fetches nothing.
            assert not name.startswith("on"), (tag, name)
            assert name not in ("src", "href", "srcset", "action", "xlink:href"), (tag, name)
            assert "evil.example" not in (value or "") or name == "aria-label", (tag, name)
    assert "url(" not in text and "@import" not in text and "<script" not in text
    csp = next(a for t, a in page.tags if t == "meta" and a.get("http-equiv"))
    assert csp["content"] == "default-src 'none'; style-src 'unsafe-inline'"
    # The name is shown, as text.
    assert HOSTILE in "".join(page.text)
    assert "could not be scanned: queue <b>onion-export</b> does not exist" in "".join(page.text)


def test_html_has_the_figures_a_chart_per_group_and_reads_on_a_phone() -> None:
    report = hostile_report()
    text = report_html(report)
    page = parsed(text)
    charts = [a for t, a in page.tags if t == "svg" and a.get("class") == "timeline"]
    assert len(charts) == 3, "one chart per group"
    checkout = report.queues[0].result
    assert checkout is not None
    hostile = next(g for g in checkout.groups if g.task == HOSTILE)
    assert hostile.timeline is not None
    bars = text.split('aria-label="')[1].split("</svg>")[0].count("<rect ")
    assert bars == sum(1 for c in hostile.timeline.counts if c)
    words = " ".join(" ".join(page.text).split())
    for figure in ("messages 10", "oldest age 5h", "poison 2", "expired 0", "leaving within 24h"):
        assert figure in words, figure
    assert 'name="viewport" content="width=device-width, initial-scale=1"' in text
    assert "@media (prefers-color-scheme: dark)" in text and "color-scheme: light dark" in text


def test_html_holds_no_argument_unless_show_args() -> None:
    assert "secret-argument" not in report_html(hostile_report())
    shown = report_html(hostile_report(show_args=True))
    assert "secret-argument &lt;b&gt;bold&lt;/b&gt;" in shown
    assert "<b>bold</b>" not in shown


def test_html_changes_since_last() -> None:
    change = Change("checkout", NOW - HOUR, 4, 10, new_tasks={HOSTILE: 8}, grown_tasks={})
    text = report_html(hostile_report(), changes=[change])
    page = parsed(text)
    words = " ".join(" ".join(page.text).split())
    assert "since the last report +6" in words
    assert f"new tasks: {HOSTILE} (8); grown: -" in words
    assert "since the last report" not in " ".join(parsed(report_html(hostile_report())).text)


def test_html_says_why_as_markdown_does_states_exceptions_and_worker_died() -> None:
    report = why_report()
    text = report_html(report)
    page = parsed(text)
    words = " ".join(" ".join(page.text).split())
    # What the Markdown table's cells say, the page says, in the hostile group's card.
    markdown = report_text(report, markdown=True)
    assert "FAILURE 5, STARTED 3; 3: worker died while running it" in markdown
    assert "states: FAILURE 5, STARTED 3; 3: worker died while running it" in words
    assert f"exceptions: {HOSTILE_EXCEPTION} 4, ValueError 1" in words
    # The other group of that DLQ: the backend said nothing of it, "-" as in the table.
    charge = text.split(f'<span class="task">{CHARGE}</span>')[1].split('<div class="group">')[0]
    assert "states:</dt> <dd>-</dd>" in charge and "exceptions:</dt> <dd" in charge
    # "worker died" stands out; the exception's name stays text.
    assert '<span class="died">3: worker died while running it</span>' in text
    assert "<script>alert(3)" not in text and "&lt;script&gt;alert(3)&lt;/script&gt;" in text
    assert {tag for tag, _ in page.tags} <= TAGS_WE_WRITE
    # A DLQ read without a result backend has no states line at all.
    progress = text.split("onion-progress-dlq")[1]
    assert "states" not in progress.split("</section>")[0]
    # Exception samples only with --show-args, escaped.
    assert "exception samples" not in text
    shown = report_html(why_report(show_args=True))
    assert "exception samples" in shown and "ValueError: amount &lt;b&gt;-1&lt;/b&gt;" in shown


def test_html_says_when_the_result_backend_stopped_answering() -> None:
    report = why_report()
    checkout = report.queues[0].result
    assert checkout is not None
    checkout.result_backend_problem = "the result backend <redis> stopped answering"
    text = report_html(report)
    words = " ".join(" ".join(parsed(text).text).split())
    assert "the result backend <redis> stopped answering; states and exceptions left out" in words
    assert "states</dt>" not in text


def test_markdown_cells_and_headings_keep_a_hostile_name_literal() -> None:
    text = report_text(hostile_report(), markdown=True)
    header = next(line for line in text.splitlines() if line.startswith("| task"))
    row = next(line for line in text.splitlines() if line.startswith("| apps.x"))
    # As many unescaped separators as the header: a "|" (even after a backslash) stays in
    # its cell.
    assert row.replace("\\\\", "").replace("\\|", "").count("|") == header.count("|")
    # Every character Markdown could read as markup has its backslash.
    assert not re.search(r"(?<!\\)[<>\[\]`]", row.replace("\\\\", "")), row
    assert "\\<script\\>" in row and "\\[link\\]" in row and "\\`code\\`" in row
    since = since_last_text([Change("checkout", None, 1, 2, new_tasks={HOSTILE: 1})], markdown=True)
    since_row = since.splitlines()[-1]
    since_header = since.splitlines()[2]
    assert since_row.replace("\\\\", "").replace("\\|", "").count("|") == since_header.count("|")


PINGS = ("<!here>", "<!channel>", "<@U024BE7LH>", "<https://evil.example|click me>")


def test_slack_text_cannot_ping_or_link() -> None:
    checkout = grouped({f"apps.t {raw} & more": [NOW - HOUR] for raw in PINGS})
    report = hostile_report()
    report.queues[0] = FamilyReport("checkout", "onion-checkout-dlq", result_of(checkout))
    payload = slack_payload(report)
    everything = payload["text"] + "".join(b["text"]["text"] for b in payload["blocks"])
    for raw in PINGS:
        assert raw not in everything, raw
        assert raw.replace("<", "&lt;").replace(">", "&gt;") in everything, raw
    assert "<" not in everything and ">" not in everything
    assert "&lt;!here&gt;" in everything and "&lt;@U024BE7LH&gt;" in everything
    assert "&amp; " in everything
    # One block per DLQ that holds messages or failed, after the headline.
    assert len(payload["blocks"]) == 1 + 3
    assert "checkout" in payload["blocks"][1]["text"]["text"]


# -- the command -----------------------------------------------------------------------------


def test_report_html_output_is_written_atomically(
    all_families: dict[str, Family], tmp_path: Path, cli: Cli
) -> None:
    all_families["checkout"].send_to_dlq(encode(HOSTILE, ["secret-argument"]))
    all_families["checkout"].send_to_dlq(encode(CHARGE, [1]))
    out = tmp_path / "dlq.html"
    cli.ok("report", "--format", "html", "--output", str(out), "--since-last")
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    page = parsed(text)
    assert sum(1 for t, a in page.tags if t == "svg" and a.get("class") == "timeline") == 2
    assert "since the last report" in page.text and "first report" in page.text
    assert "secret-argument" not in text
    shown = cli("report", "--format", "html", "--show-args")
    assert shown.exit_code == 0 and "secret-argument" in shown.stdout
    data = json.loads(cli.ok("report", "--format", "json", "--show-args").stdout)
    assert any(g.get("sample_args") for g in data["queues"][0]["groups"])
    help_text = cli("report", "--help").stdout
    for option in ("html", "--show-args", "--post", "--post-format", "--post-always"):
        assert option in help_text


def test_report_html_to_an_unwritable_place_is_one_line(
    tmp_path: Path, family: Family, cli: Cli
) -> None:
    result = cli("report", "--format", "html", "--output", str(tmp_path / "no" / "r.html"))
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and "cannot write the report" in result.stderr
