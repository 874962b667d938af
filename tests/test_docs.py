"""Every command in the runbooks, the README and the pages of docs/ runs, against a sandbox.

A document cannot drift from the CLI: each ``$ command`` line of a ``console`` block (and each
command of a ``crontab`` block) is run, in order, and must exit 0, or the code named by a
trailing ``# expect exit N``. ``NAME=$(...)`` lines set a variable that later commands use,
as they would in the operator's shell. Each runbook runs in a fresh sandbox of its own; the
README and the docs pages run one after the other in one sandbox (the README's first three
commands on a RabbitMQ node too). Every relative link of them names a file, and a heading,
that exist.
"""

from __future__ import annotations

import collections
import contextlib
import gzip
import http.server
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import unicodedata
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest

from redrive.config import built_in_layout
from redrive.messages import decode
from redrive.sandbox import client_for, create_layout, sandbox_env, seed, start_server
from redrive.sandbox.rabbitmq_layout import (
    fill_layout,
    open_connection,
    queue_depth,
    rabbit_families,
    raw_channel,
)
from redrive.sandbox.rabbitmq_node import Vhost
from redrive.sandbox.seeding import sample_dlq

ROOT = Path(__file__).resolve().parent.parent
CHECKOUT_BEFORE_SPLIT = "apps.webhooks.tasks.save_checkout_ibft"
PROGRESS_BEFORE_SPLIT = "apps.engagements.tasks.save_progress_lesson"
RUNBOOKS = sorted((ROOT / "runbooks").glob("*.md"))
README = ROOT / "README.md"
MKDOCS = ROOT / "mkdocs.yml"
# The pages of docs/ in the site's order (mkdocs.yml's nav), runbooks/ (shown in the site
# through the docs/runbooks link) left to the runbooks' own tests.
PAGES = [
    ROOT / "docs" / name
    for name in re.findall(r"^\s*- [^:\n]+: (\S+\.md)$", MKDOCS.read_text(), re.MULTILINE)
    if not name.startswith("runbooks/")
]
DOCS = [README, *PAGES, *RUNBOOKS]
# Run against a private RabbitMQ node (the ``rabbitmq_vhost`` fixture), not the SQS sandbox.
RABBITMQ_RUNBOOKS = [p for p in RUNBOOKS if "rabbitmq" in p.name]
FENCE = re.compile(r"^```(\w*)\s*$")
EXPECT = re.compile(r"\s#\s*expect exit (\d+)\s*$")
ASSIGN = re.compile(r"^([A-Z_][A-Z0-9_]*)=\$\((.*)\)$")
CRON_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=")
# Started by the test itself (and tested end to end in test_e2e.py); it runs until stopped.
# The console runs until stopped too: tests/test_web_docs.py runs docs/console.md's
# `redrive web` lines, each until it answers.
NOT_RUN_HERE = ("redrive sandbox", "redrive web")


@dataclass(frozen=True)
class Command:
    line: int
    text: str
    expect: int


def commands(doc: Path) -> list[Command]:
    found: list[Command] = []
    fence: str | None = None
    for number, raw in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1):
        match = FENCE.match(raw.strip())
        if match:
            fence = match.group(1) if fence is None else None
            continue
        if fence == "console" and raw.startswith("$ "):
            text = raw[2:].strip()
        elif fence == "crontab" and CRON_ENV.match(raw):
            continue  # the jobs' environment: the test gives its own (a webhook on loopback)
        elif fence == "crontab" and raw.strip() and not raw.lstrip().startswith("#"):
            # Five schedule fields, then the command; the `||` fallback posts elsewhere.
            text = raw.split(None, 5)[5].split(" || ")[0]
            # The job's working directory is the operator's; the test has its own.
            text = re.sub(r"^cd \S+ && ", "", text)
        else:
            continue
        if text.startswith(NOT_RUN_HERE):
            continue
        expect = EXPECT.search(text)
        if expect:
            text = text[: expect.start()].rstrip()
        found.append(Command(number, text, int(expect.group(1)) if expect else 0))
    return found


class Received(list[bytes]):
    """The bodies posted to a webhook, and its URL."""

    url = ""


@pytest.fixture
def webhook() -> Iterator[Received]:
    """A chat webhook on 127.0.0.1 that records every body posted to it."""
    received = Received()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    received.url = f"http://127.0.0.1:{server.server_port}/services/T0/B0/x"
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def sandbox(tmp_path: Path, webhook: Received) -> Iterator[dict[str, str]]:
    server = start_server(0)
    try:
        # moto's state is per process, shared by every server in it: start from nothing.
        urllib.request.urlopen(
            urllib.request.Request(f"{server.endpoint_url}/moto-api/reset", method="POST"),
            timeout=10,
        ).close()
        client = client_for(server)
        layout = built_in_layout({})
        create_layout(client, layout)
        seed(client, layout, per_family=12)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "REDRIVE_"))}
        env.update(sandbox_env(server))
        env["REDRIVE_STATE_DIR"] = str(tmp_path / "state")
        env["REDRIVE_RECEIVE_WAIT"] = "0"  # moto answers short polls with every message
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        # What a crontab's environment line gives its jobs, on loopback.
        env["REDRIVE_REPORT_WEBHOOK"] = webhook.url
        yield env
    finally:
        server.stop()


def test_every_runbook_and_the_readme_have_commands() -> None:
    assert {p.name for p in RUNBOOKS} >= {
        "draining-an-sqs-dead-letter-queue.md",
        "sqs-queue-backlog.md",
        "dlq-blip-after-deploy.md",
        "scheduled-dlq-report.md",
    }
    # The README's examples moved to these pages (issue 37, point 10): still run below.
    with_examples = [ROOT / "docs" / n for n in ("sandbox.md", "repair.md", "where.md")]
    for doc in [README, *RUNBOOKS, *with_examples]:
        assert commands(doc), f"{doc.name} has no command to test"


def test_every_page_of_docs_is_in_the_sites_nav_and_run_here() -> None:
    """A page left out of mkdocs.yml's nav would be left out of the commands run here."""
    on_disk = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert on_disk == {p.name for p in PAGES}
    assert len(PAGES) == len(set(PAGES))


def test_every_runbook_lists_iam_permissions() -> None:
    for doc in RUNBOOKS:
        text = doc.read_text(encoding="utf-8")
        if doc in RABBITMQ_RUNBOOKS:  # no IAM on RabbitMQ: the vhost's permissions instead
            assert "## RabbitMQ permissions" in text and "**read**" in text, doc.name
            continue
        assert "## IAM permissions" in text, doc.name
        assert "sqs:" in text, doc.name


LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"``.*?``|`[^`]*`")
HEADING = re.compile(r"^(#{1,6}) +(.*?) *#*$")


def prose(doc: Path) -> list[str]:
    """The document's lines outside fenced blocks, code spans blanked (a link shown as code
    is an example, not a link)."""
    out: list[str] = []
    fence = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()) or line.strip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            out.append(CODE_SPAN.sub(lambda m: "`" + "x" * (len(m.group(0)) - 2) + "`", line))
    return out


def slug(heading: str) -> str:
    """A heading's anchor as the site (MkDocs, Python-Markdown's toc) makes it."""
    text = re.sub(r"`|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def anchors(doc: Path) -> set[str]:
    fence = False
    found = set()
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("```"):
            fence = not fence
        elif not fence and (match := HEADING.match(line)):
            found.add(slug(match.group(2)))
    return found


def test_slug_is_the_sites() -> None:
    assert slug("Holds: what a run keeps hidden") == "holds-what-a-run-keeps-hidden"
    assert (
        slug("`redrive ledger in-doubt [--run RUN_ID] [--ledger URI] [--json]`")
        == "redrive-ledger-in-doubt-run-run_id-ledger-uri-json"
    )


def test_every_link_of_the_readme_docs_and_runbooks_names_a_file_and_heading_that_exist() -> None:
    """As GitHub resolves them, from each file's own folder (the site's build, `make docs`,
    checks them again as MkDocs resolves them, docs_hooks.py bridging the two)."""
    broken = []
    for doc in DOCS:
        for line in prose(doc):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # https://, mailto:: not this repository's
                path, _, fragment = target.partition("#")
                where = doc if not path else (doc.parent / path).resolve()
                if not where.exists():
                    broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
                elif fragment and where.suffix == ".md" and fragment not in anchors(where):
                    broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_readme_is_a_front_page() -> None:
    """Issue 37, point 10: the README was 1,709 lines that opened on SQS alone; RabbitMQ came
    at line 235, its sandbox at 1,060, its runbook nowhere. Now: both brokers up front, the
    two commands first, the first things to try on both sandboxes, and links to the rest."""
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 150, len(lines)
    opening = " ".join(lines[:4])
    assert "SQS" in opening and "RabbitMQ" in opening
    first_block = text.split("```", 2)[1]
    assert first_block.split()[:2] == ["make", "demo"] and "make test" in first_block
    assert "$ redrive sandbox --broker rabbitmq" in text
    for runbook in RUNBOOKS:
        assert f"(runbooks/{runbook.name})" in text, runbook.name
    for page in PAGES:
        assert f"(docs/{page.name})" in text, page.name


MAIN_RUNBOOK = ROOT / "runbooks" / "draining-an-sqs-dead-letter-queue.md"
BLIP_RUNBOOK = ROOT / "runbooks" / "dlq-blip-after-deploy.md"
SCHEDULED_RUNBOOK = ROOT / "runbooks" / "scheduled-dlq-report.md"
RABBITMQ_RUNBOOK = ROOT / "runbooks" / "draining-a-rabbitmq-dead-letter-queue.md"
# Every runbook runs in its rehearsals below or in a test of its own (once each: a run costs a
# process per command); the README's and the docs pages' commands run here.
OTHER_DOCS = [d for d in DOCS if d not in RUNBOOKS]


@pytest.mark.e2e
def test_doc_commands_run_against_the_sandbox(sandbox: dict[str, str], tmp_path: Path) -> None:
    """The README, then every page in the site's order, in one sandbox (a sandbox per page
    would cost its start and seeding each time): each page from a working directory of its
    own, as a reader starts one, so that no page meets another's archives."""
    for doc in OTHER_DOCS:
        workdir = tmp_path / doc.stem
        workdir.mkdir()
        run_commands(doc, dict(sandbox), workdir)


@pytest.mark.e2e
def test_the_readmes_first_three_commands_run_on_a_rabbitmq_node(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    """The README promises the same first three commands on either sandbox."""
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families(), 12)
    env = rabbitmq_env(rabbitmq_vhost, tmp_path)
    assert [c.text for c in commands(README)] == [
        "redrive status",
        "redrive inspect checkout",
        "redrive move checkout --task 'apps.payments.*'",
    ]
    done = run_commands(README, env, tmp_path)
    assert "onion-checkout-dlq" in done[0][1].stdout
    assert "died of" in done[1][1].stdout, "inspect says what the messages died of"
    assert "DRY RUN" in done[2][1].stdout and "would move" in done[2][1].stdout


def rabbitmq_env(vhost: Vhost, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "REDRIVE_"))}
    env["REDRIVE_BROKER"] = vhost.amqp_url
    env["REDRIVE_RABBITMQ_API"] = vhost.api_url
    env["REDRIVE_STATE_DIR"] = str(tmp_path / "state")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_doc(
    doc: Path,
    sandbox: dict[str, str],
    tmp_path: Path,
    after: Callable[[Command], None] | None = None,
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    run_commands(doc, dict(sandbox), workdir, after=after)


def run_commands(
    doc: Path,
    env: dict[str, str],
    workdir: Path,
    after: Callable[[Command], None] | None = None,
) -> list[tuple[Command, subprocess.CompletedProcess[str]]]:
    """Run the document's commands in order in ``env`` (``NAME=$(...)`` lines set NAME in
    it, as a shell would); each must end as the document says. Returns what each did."""
    done_all = []
    for command in commands(doc):
        assign = ASSIGN.match(command.text)
        script = command.text
        if assign:
            script = f'{assign.group(1)}=$({assign.group(2)}) && printf %s "${assign.group(1)}"'
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        where = f"{doc.name}:{command.line}: {command.text}"
        assert done.returncode == command.expect, (
            f"{where}\nexit {done.returncode}, expected {command.expect}\n"
            f"stdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-2000:]}"
        )
        assert "Traceback" not in done.stderr, f"{where}\n{done.stderr}"
        if assign:
            assert done.stdout.strip(), f"{where}: set {assign.group(1)} to nothing"
            env[assign.group(1)] = done.stdout.strip()
        if after is not None:
            after(command)
        done_all.append((command, done))
    return done_all


@pytest.mark.e2e
def test_the_rabbitmq_runbook_runs_against_a_node_and_ends_with_an_empty_dlq(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    """The RabbitMQ runbook, step by step, on the layout's queues filled by the broker's own
    dead-lettering: every command works, and the checkout DLQ ends empty with each task
    back in its source queue once."""
    families = rabbit_families()
    fill_layout(rabbitmq_vhost.amqp_url, families, 12)
    env = rabbitmq_env(rabbitmq_vhost, tmp_path)
    assert next(c.text for c in commands(RABBITMQ_RUNBOOK)) == "redrive status"
    run_doc(RABBITMQ_RUNBOOK, env, tmp_path)
    before = json.loads((tmp_path / "work" / "checkout-before.json").read_text())
    assert before, "inspect wrote its JSON"
    connection = open_connection(rabbitmq_vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        assert queue_depth(channel, "onion-checkout-dlq") == 0
        assert queue_depth(channel, "onion-checkout") == 12
        assert queue_depth(channel, "onion-dlq") == 12, "other families untouched"
    finally:
        connection.close()


@pytest.mark.e2e
def test_the_scheduled_runbooks_jobs_write_the_page_and_post_to_chat(
    sandbox: dict[str, str], tmp_path: Path, webhook: Received
) -> None:
    """Issue 16: the crontab's jobs write the HTML page and post to the chat webhook (its
    environment line's URL, here on loopback)."""
    run_doc(SCHEDULED_RUNBOOK, sandbox, tmp_path)
    page = (tmp_path / "work" / "dlq-report.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and '<svg class="timeline"' in page
    posts = [json.loads(body) for body in webhook]
    assert posts and all("blocks" in post and "text" in post for post in posts)


@pytest.mark.e2e
def test_the_blip_runbooks_receive_counts_hold_after_each_of_its_own_steps(
    sandbox: dict[str, str], tmp_path: Path
) -> None:
    """Issue 11: "receive counts at the limit, 5 or 6" was false by the runbook's own third
    step, because every inspect and dry run raises SQS's count. The count it shows now
    leaves redrive's own receives out, so the claim holds however often one looks."""
    raw: list[int] = []

    def consumer_receives_are_5_or_6(command: Command) -> None:
        seen = subprocess.run(
            [sys.executable, "-m", "redrive", "inspect", "checkout", "--json"],
            env=sandbox,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        for group in json.loads(seen.stdout)["groups"]:
            assert group["max_consumer_receives"] in (5, 6), (command.text, group)
            raw.append(group["max_receive_count"])

    run_doc(BLIP_RUNBOOK, sandbox, tmp_path, after=consumer_receives_are_5_or_6)
    assert raw and max(raw) > 6, "SQS's own count did grow with every look"

    # The runbook's last claim: what is left is older than the window, or a blip message the
    # move kept for a reason its dry run names (issue 22: 3 of 11 were kept blip messages).
    def dry_run(*args: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-m", "redrive", "move", "checkout", *args, "--json"],
            env=sandbox,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return dict(json.loads(done.stdout))

    blip, before = dry_run("--newer-than", "6h"), dry_run("--older-than", "6h")
    assert blip["matched"] > 0 and blip["moved"] == 0, blip
    assert sum(blip["skipped_by_reason"].values()) == blip["matched"], blip
    assert blip["matched"] + before["matched"] == blip["scanned"], (blip, before)


def test_the_readme_names_every_command_make_demo_runs() -> None:
    """Issue 22: the README's account of ``make demo`` left out its fifth command."""
    demo = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    shown = re.findall(r"echo '\$\$ (redrive [^'#]*?)\s*(?:#[^']*)?'", demo)
    intro = " ".join(README.read_text().split("\n## ")[0].split())
    assert len(shown) == 5, shown
    for command in shown:
        quoted = "`" + command.replace('"', "'") + "`"
        assert quoted in intro, command


def test_make_demo_draws_the_same_tasks_every_run() -> None:
    """Issue 37: ``make demo`` seeded at random, so whether its dry run routed a progress task
    (the check below) depended on a draw. It passes a seed, and that seed's default DLQ holds
    a checkout and a progress task from before the split that have not expired."""
    demo = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "--seed $(SEED)" in demo, "make demo must seed the sandbox"
    found = re.search(r"^SEED\s*\?=\s*(\d+)\s*$", (ROOT / "Makefile").read_text(), re.M)
    assert found is not None, "the Makefile must give SEED a default"
    now = datetime.now(UTC)
    infos = [decode(m.body) for m in sample_dlq("default", 20, seed=int(found[1]), now=now)]
    live = {i.task for i in infos if not i.is_expired(now)}
    assert {CHECKOUT_BEFORE_SPLIT, PROGRESS_BEFORE_SPLIT} <= live, live


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo_runs() -> None:
    """The README's first command, as a newcomer runs it (in the project's own venv)."""
    venv = ROOT / ".venv"
    if not (venv / ".installed").exists():
        pytest.skip("no .venv made by `make install` (run `make test` first)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "REDRIVE_"))}
    env["REDRIVE_RECEIVE_WAIT"] = "0"  # a local endpoint needs no long polling
    done = subprocess.run(
        # 20: enough for the default DLQ to hold the tasks from before the onion split.
        ["make", "demo", "MESSAGES=20"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for text in ("redrive status", "onion-checkout-dlq", "DRY RUN"):
        assert text in done.stdout
    # Issue 13: the dry run routes the tasks from before the split to their queues now.
    assert "onion-checkout (by route; source onion)" in done.stdout
    assert "onion-progress (by route; source onion)" in done.stdout


# -- rehearsing twice in a row ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def sandbox_in_shell(shell: dict[str, str], workdir: Path) -> Iterator[None]:
    """``redrive sandbox`` started from ``shell``, whose environment then takes the lines it
    prints, as a user pastes them; stopped with Ctrl-C at the end."""
    port = free_port()
    out, err = workdir / "sandbox.out", workdir / "sandbox.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(
            # Seeded: the same tasks in both rehearsals, so the second meets the first's task ids.
            [
                sys.executable,
                "-m",
                "redrive",
                "sandbox",
                "--port",
                str(port),
                "--messages",
                "40",
                "--seed",
                "7",
            ],
            env=shell,
            cwd=workdir,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 60
        while "sandbox ready" not in err.read_text():
            assert process.poll() is None, err.read_text()
            assert time.monotonic() < deadline, "the sandbox did not start within 60 s"
            time.sleep(0.1)
        for line in out.read_text().splitlines():
            if line.startswith("export "):
                name, _, value = line.removeprefix("export ").partition("=")
                shell[name] = shlex.split(value)[0]
            elif line.startswith("unset "):
                for name in line.split()[1:]:
                    shell.pop(name, None)
        yield
        process.send_signal(signal.SIGINT)
        # A bound for a hang, not a speed: it stops in about a second, but a floors run at a
        # load of 18 once took over 10 s.
        assert process.wait(120) == 0, err.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def queue_bodies(shell: dict[str, str]) -> dict[str, collections.Counter[str]]:
    """Queue name -> every body it holds, left there (received, then made visible again)."""
    client = boto3.client(
        "sqs",
        endpoint_url=shell["AWS_ENDPOINT_URL"],
        region_name=shell["AWS_DEFAULT_REGION"],
        aws_access_key_id=shell["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=shell["AWS_SECRET_ACCESS_KEY"],
    )
    out: dict[str, collections.Counter[str]] = {}
    try:
        for url in client.list_queues().get("QueueUrls", []):
            deadline = time.monotonic() + 60
            # Whatever redrive held must be back before it can be counted.
            while int(
                client.get_queue_attributes(
                    QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
                )["Attributes"]["ApproximateNumberOfMessagesNotVisible"]
            ):
                assert time.monotonic() < deadline, f"messages of {url} stay in flight"
                time.sleep(0.2)
            got: list[dict[str, Any]] = []
            while batch := client.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60, WaitTimeSeconds=0
            ).get("Messages", []):
                got.extend(batch)
            for message in got:
                client.change_message_visibility(
                    QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
                )
            out[url.rsplit("/", 1)[1]] = collections.Counter(m["Body"] for m in got)
    finally:
        client.close()
    time.sleep(0.01)  # visible again from the next millisecond
    return out


def archived_bodies(workdir: Path) -> collections.Counter[str]:
    bodies: collections.Counter[str] = collections.Counter()
    for path in workdir.glob("*.jsonl.gz"):
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            bodies.update(json.loads(line)["body"] for line in lines if line.strip())
    return bodies


def total(counters: Iterable[collections.Counter[str]]) -> collections.Counter[str]:
    out: collections.Counter[str] = collections.Counter()
    for counter in counters:
        out.update(counter)
    return out


DUPLICATES_DELETED = re.compile(
    r"(\d+) duplicate cop(?:y|ies) deleted|\"duplicates_deleted\": (\d+)"
)


def drained_with_archives_and_an_audit_record(
    shell: dict[str, str], workdir: Path, after: dict[str, collections.Counter[str]]
) -> None:
    """The main runbook's promise: followed step by step, the DLQ ends empty, with archives
    and an audit record: checked in its first rehearsal, not in a third run of its own."""
    run = [sys.executable, "-m", "redrive"]
    inspect = subprocess.run(
        [*run, "inspect", "checkout", "--json"],
        env=shell,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert inspect.returncode == 0 and '"total": 0' in inspect.stdout, inspect.stderr
    assert not after["onion-checkout-dlq"]
    assert len(list(workdir.glob("*.jsonl.gz"))) >= 2
    audit = subprocess.run(
        [*run, "audit", "--json"], env=shell, capture_output=True, text=True, timeout=60
    )
    assert audit.returncode == 0 and '"outcome": "completed"' in audit.stdout, audit.stderr


# Rehearsed twice: the runbooks that change queues. The scheduled report's only reports (its
# second rehearsal would check nothing the first did not); the RabbitMQ runbook's steps run on
# a real node in its own test above, and on an SQS sandbox they would be the draining
# runbook's steps again.
REHEARSED = [d for d in RUNBOOKS if d not in (SCHEDULED_RUNBOOK, *RABBITMQ_RUNBOOKS)]


def test_every_runbook_not_rehearsed_changes_no_queue_or_has_its_own_broker_test() -> None:
    for doc in set(RUNBOOKS) - set(REHEARSED):
        texts = [c.text for c in commands(doc)]
        assert doc in RABBITMQ_RUNBOOKS or not any("--execute" in t for t in texts), doc.name


@pytest.mark.e2e
@pytest.mark.parametrize("doc", REHEARSED, ids=[d.name for d in REHEARSED])
def test_a_runbook_rehearsed_twice_in_a_row_loses_and_misreports_nothing(
    doc: Path, tmp_path: Path
) -> None:
    """One user (one HOME, one shell) rehearses a runbook on a sandbox, stops it, starts a
    new one and rehearses again, pasting each sandbox's lines. The second rehearsal must go
    as the first: every task that leaves a DLQ reaches a queue (or an archive), none is
    deleted as a "duplicate copy" of one moved in the first, and nothing lands in the user's
    own ledger."""
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "tmp").mkdir()
    shell = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "REDRIVE_", "XDG_"))}
    shell.update(
        HOME=str(home),
        TMPDIR=str(tmp_path / "tmp"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{shell.get('PATH', '')}",
        REDRIVE_RECEIVE_WAIT="0",  # moto answers short polls with every message
        AWS_CONFIG_FILE=str(home / "aws-config-absent"),
        AWS_SHARED_CREDENTIALS_FILE=str(home / "aws-credentials-absent"),
    )
    state_dirs: list[str | None] = []
    for rehearsal in (1, 2):
        # A new working directory, as the runbook asks: archives are never overwritten.
        workdir = tmp_path / f"rehearsal-{rehearsal}"
        workdir.mkdir()
        with sandbox_in_shell(shell, workdir):
            before = queue_bodies(shell)
            done = run_commands(doc, dict(shell), workdir)
            after = queue_bodies(shell)
            if rehearsal == 1 and doc == MAIN_RUNBOOK:
                drained_with_archives_and_an_audit_record(shell, workdir, after)
            state_dirs.append(shell.get("REDRIVE_STATE_DIR"))
        where = f"rehearsal {rehearsal} of {doc.name}"
        dlqs = [name for name in before if name.endswith("-dlq")]
        sources = [name for name in before if not name.endswith("-dlq")]
        seeded = total(before[name] for name in dlqs)
        assert sum(seeded.values()) == 120 and not total(before[n] for n in sources), where
        left = total(after[name] for name in dlqs)
        arrived = total(after[name] for name in sources)
        kept = left + arrived + archived_bodies(workdir)
        lost = seeded - kept
        if lost:
            pytest.fail(f"{where}: {sum(lost.values())} task(s) left a DLQ and went nowhere")
        assert not arrived - seeded, f"{where}: a queue got a task no DLQ held"
        assert all(arrived[b] <= seeded[b] for b in arrived), f"{where}: a task arrived twice"
        for command, result in done:
            for match in DUPLICATES_DELETED.finditer(result.stdout + result.stderr):
                count = int(match.group(1) or match.group(2))
                assert count == 0, f"{where}: `{command.text}` deleted {count} as duplicates"
    first, second = state_dirs
    assert first is not None and second is not None and first != second
    # Each removed when its sandbox stopped.
    assert not Path(first).exists() and not Path(second).exists()
    # Nothing reached the ledger and audit trail the user keeps for real queues.
    assert not (home / ".local" / "state" / "redrive").exists()
