"""``report --post URL`` (issue 16), against a real HTTP server on 127.0.0.1 that records
every request: a Slack-compatible payload or the JSON report, the alert throttle, and
failures (refused, timeout, non-2xx) that are one line and exit 1, the report still written."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli, Family, free_port
from test_report import ctrl_c_after_first_receive

from redrive import webhook
from redrive.errors import PostFailed
from redrive.sandbox.encoder import encode

CHARGE = "apps.shop.tasks.charge"
SECRET_PATH = "/services/T000/B000/s3cr3t-token"


@dataclass
class Recorder:
    """What the webhook received; ``status`` and ``delay`` say how it answers."""

    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    delay: float = 0.0
    gone: threading.Event = field(default_factory=threading.Event)
    """Set when the test ends: a delayed answer is then sent at once."""

    def bodies(self) -> list[Any]:
        return [json.loads(r["body"]) for r in self.requests]


@pytest.fixture
def hook() -> Iterator[Recorder]:
    recorder: Recorder

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            recorder.requests.append(
                {"path": self.path, "headers": dict(self.headers), "body": body.decode()}
            )
            recorder.gone.wait(recorder.delay)
            try:
                self.send_response(recorder.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up waiting: what a timeout test wants

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    recorder = Recorder(f"http://127.0.0.1:{server.server_port}{SECRET_PATH}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        recorder.gone.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_post_sends_slack_text_and_a_block_per_non_empty_dlq(
    all_families: dict[str, Family], hook: Recorder, cli: Cli
) -> None:
    all_families["checkout"].send_to_dlq(encode(CHARGE, [1]))
    all_families["progress"].send_to_dlq(encode(CHARGE, [2]))
    result = cli("report", "--post", hook.url)
    assert result.exit_code == 0, result.output
    (request,) = hook.requests
    assert request["path"] == SECRET_PATH
    assert request["headers"]["Content-Type"].startswith("application/json")
    payload = json.loads(request["body"])
    assert (
        payload["text"].startswith("DLQ report, ")
        and "2 message(s) in 3 DLQ(s)" in (payload["text"])
    )
    families = [b["text"]["text"].split("*")[1] for b in payload["blocks"][1:]]
    assert families == ["checkout", "progress"], "one block per non-empty DLQ"
    assert f"`{CHARGE}` 1" in payload["blocks"][1]["text"]["text"]


def test_post_is_repeatable_takes_the_environment_and_posts_json(
    all_families: dict[str, Family], hook: Recorder, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    all_families["checkout"].send_to_dlq(encode(CHARGE, [1]))
    assert cli("report", "--post", hook.url, "--post", hook.url + "/2").exit_code == 0
    assert [r["path"] for r in hook.requests] == [SECRET_PATH, SECRET_PATH + "/2"]
    monkeypatch.setenv("REDRIVE_REPORT_WEBHOOK", hook.url)
    assert cli("report", "--post-format", "json").exit_code == 0
    report = hook.bodies()[-1]
    assert report["total"] == 1 and report["queues"][0]["groups"][0]["task"] == CHARGE
    assert "timeline" in report["queues"][0]["groups"][0]


def test_with_alert_state_it_posts_only_when_the_alert_fires(
    all_families: dict[str, Family], hook: Recorder, tmp_path: Path, cli: Cli
) -> None:
    all_families["checkout"].send_to_dlq(encode(CHARGE, [1]))
    state = str(tmp_path / "alert.json")
    alerting = ["report", "--fail-on-messages", "--alert-state", state, "--alert-throttle", "6h"]
    first = cli(*alerting, "--post", hook.url)
    assert first.exit_code == 1 and "alert FIRES" in first.stderr
    assert len(hook.requests) == 1
    held = cli(*alerting, "--post", hook.url)
    assert held.exit_code == 0 and "alert held" in held.stderr
    assert len(hook.requests) == 1, "an alert held back posts nothing"
    always = cli(*alerting, "--post", hook.url, "--post-always")
    assert always.exit_code == 0 and len(hook.requests) == 2


def test_an_alert_whose_post_failed_is_not_held_back_by_the_throttle(
    all_families: dict[str, Family], hook: Recorder, tmp_path: Path, cli: Cli
) -> None:
    all_families["checkout"].send_to_dlq(encode(CHARGE, [1]))
    state = str(tmp_path / "alert.json")
    alerting = ["report", "--fail-on-messages", "--alert-state", state, "--alert-throttle", "6h"]
    hook.status = 503
    failed = cli(*alerting, "--post", hook.url)
    assert failed.exit_code == 1 and "it answered 503" in failed.stderr
    hook.status = 200
    again = cli(*alerting, "--post", hook.url)
    assert again.exit_code == 1 and "alert FIRES" in again.stderr, "no one was told yet"
    assert len(hook.requests) == 2
    held = cli(*alerting, "--post", hook.url)
    assert held.exit_code == 0 and len(hook.requests) == 2


@pytest.mark.parametrize("status", [500, 404, 302])
def test_a_non_2xx_answer_is_one_line_and_exit_1_and_the_file_is_still_written(
    all_families: dict[str, Family], hook: Recorder, tmp_path: Path, status: int, cli: Cli
) -> None:
    all_families["checkout"].send_to_dlq(encode(CHARGE, [1]))
    hook.status = status
    out = tmp_path / "report.md"
    result = cli("report", "--format", "markdown", "--output", str(out), "--post", hook.url)
    assert result.exit_code == 1
    assert out.read_text().startswith("# DLQ report")
    assert result.stderr.count("\n") == 1, result.stderr
    port = hook.url.split(":")[2].split("/")[0]
    assert (
        f"error: cannot post the report to http://127.0.0.1:{port}/...: it answered {status}"
        in (result.stderr)
    )
    assert "s3cr3t" not in result.stderr, "a webhook's path is its secret"
    assert "Traceback" not in result.output


def test_a_refused_post_is_one_line_and_exit_1(all_families: dict[str, Family], cli: Cli) -> None:
    url = f"http://127.0.0.1:{free_port()}/hook"
    result = cli("report", "--post", url)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: cannot post the report to http://127.0.0.1:")
    assert "refused" in result.stderr.lower() and result.stderr.count("\n") == 1


def test_a_post_that_gets_no_answer_in_time_fails(hook: Recorder) -> None:
    hook.delay = 120.0  # an answer that would come long after any slow machine's 0.2 s
    started = time.monotonic()
    with pytest.raises(PostFailed, match=r"no answer within 0.2 s"):
        webhook.post_json(hook.url, {"text": "x"}, timeout=0.2)
    assert time.monotonic() - started < 60, "the post waited for the answer"


def test_an_interrupted_report_is_not_posted_and_says_so(
    all_families: dict[str, Family],
    hook: Recorder,
    monkeypatch: pytest.MonkeyPatch,
    cli: Cli,
    tmp_path: Path,
) -> None:
    # Posted, part of the DLQs would read in the channel as all of them, and an alert
    # throttle would record it: the operator who stopped it sees the report here instead.
    for i in range(15):
        all_families["default"].send_to_dlq(encode(CHARGE, [i]))
    state = tmp_path / "alerts.json"
    ctrl_c_after_first_receive(monkeypatch, "onion-dlq")
    result = cli(
        "report", "--post", hook.url, "--fail-on-messages", "--alert-state", str(state),
        "--post-always", "--post-format", "json",
    )  # fmt: skip
    assert result.exit_code == 130, result.output
    assert hook.requests == []
    assert "interrupted: the report was not posted" in result.stderr
    assert "note: interrupted" in result.stdout
    assert not state.exists(), "no alert recorded for part of the DLQs"


def test_post_usage_errors(all_families: dict[str, Family], cli: Cli) -> None:
    bad = cli("report", "--post", "ftp://example.com/x")
    assert bad.exit_code == 2 and "not an http(s) URL" in bad.stderr
    for url in ("http://[::1/x", "http://127.0.0.1:port/x", "127.0.0.1:9/x"):
        unreadable = cli("report", "--post", url)
        assert unreadable.exit_code == 2 and "not an http(s) URL" in unreadable.stderr, url
        assert "Traceback" not in unreadable.output
    alone = cli("report", "--post", "http://127.0.0.1:9/x", "--post-always")
    assert alone.exit_code == 2 and "--post-always goes with --alert-state" in alone.stderr


def test_a_post_that_is_not_a_url_is_quoted_as_given_before_anything_is_scanned(
    all_families: dict[str, Family], cli: Cli
) -> None:
    all_families["checkout"].send_to_dlq(encode(CHARGE, [1]))
    for given, quoted in (
        ("notaurl", "'notaurl'"),
        ("hooks.slack.com" + SECRET_PATH, "'hooks.slack.com/...'"),
        ("ftp://example.com/x", "'ftp://example.com/...'"),
    ):
        bad = cli("report", "--post", given)
        assert bad.exit_code == 2, bad.output
        assert f"--post {quoted}: not an http(s) URL" in bad.stderr, bad.stderr
        assert "give http:// or https:// and a host" in bad.stderr
        assert "://?" not in bad.stderr and "s3cr3t" not in bad.stderr
        assert bad.stdout == ""
    # Refused before the scan: the message was never received.
    checkout = all_families["checkout"]
    (message,) = checkout.drain(checkout.dlq_url)
    assert message["Attributes"]["ApproximateReceiveCount"] == "1"


def test_shown_url_keeps_the_host_and_hides_the_path() -> None:
    assert webhook.shown("https://hooks.slack.com/services/T/B/x") == "https://hooks.slack.com/..."
    assert webhook.shown("http://127.0.0.1:8080/") == "http://127.0.0.1:8080/"
