"""``--execute`` asks before it changes anything, and never acts unasked.

With no terminal (a script, cron, ssh without a tty) it needs ``--yes`` and exits 2 without
touching anything. On a terminal the prompt names the DLQ, the filters and how many messages
are visible; answering no exits 1 (``aborted``), Ctrl-C at the prompt 130.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from conftest import Cli, Family, MotoServer, make_family

from redrive.cli import console
from redrive.cli.exit_codes import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE
from redrive.ledger import default_ledger_path
from redrive.sandbox.encoder import encode

CHARGE = "apps.shop.tasks.charge"
MAIL = "apps.mail.tasks.send_receipt"
REDRIVE = [sys.executable, "-m", "redrive"]
ROOT = Path(__file__).resolve().parent.parent


def seed(family: Family) -> None:
    for i in range(2):
        family.send_to_dlq(encode(CHARGE, [i], {}, task_id=f"charge-{i}"))
    family.send_to_dlq(encode(MAIL, [], {"order": 1}, task_id="mail-1"))


def one_line(result: Result, exit_code: int, *fragments: str) -> None:
    assert result.exit_code == exit_code, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a terminal: someone can answer the prompt (CliRunner's streams are no tty)."""
    monkeypatch.setattr(console, "terminal_attached", lambda: True)


@pytest.fixture
def archive(family: Family, tmp_path: Path, cli: Cli) -> str:
    """An archive of the seeded DLQ, from ``archive`` (which asks nothing: it deletes nothing)."""
    seed(family)
    path = str(tmp_path / "snapshot.jsonl")
    result = cli("archive", "checkout", "--archive", path)
    assert result.exit_code == 0, result.output
    return path


@pytest.fixture
def plan(family: Family, tmp_path: Path, cli: Cli) -> str:
    seed(family)
    path = str(tmp_path / "plan.json")
    assert cli("move", "checkout", "--plan-out", path).exit_code == 0
    return path


EXECUTES = {
    "move": ["move", "checkout", "--execute"],
    "move --native": ["move", "checkout", "--native", "--execute"],
    "purge": ["purge", "checkout", "--execute", "--archive", "{tmp}/purged.jsonl"],
    "purge --no-archive (PurgeQueue)": ["purge", "checkout", "--no-archive", "--execute"],
    "purge --no-archive --task": [
        "purge",
        "checkout",
        "--no-archive",
        "--task",
        CHARGE,
        "--execute",
    ],
    "apply": ["apply", "{plan}", "--execute"],
    "replay": ["replay", "{archive}", "--to", "onion-checkout", "--execute"],
}


@pytest.mark.parametrize("name", EXECUTES)
def test_without_a_terminal_execute_needs_yes_and_changes_nothing(
    name: str, family: Family, tmp_path: Path, request: pytest.FixtureRequest, cli: Cli
) -> None:
    words = " ".join(EXECUTES[name])
    values = {"tmp": str(tmp_path)}
    if "{plan}" in words:
        values["plan"] = request.getfixturevalue("plan")
    elif "{archive}" in words:
        values["archive"] = request.getfixturevalue("archive")
    else:
        seed(family)
    args = [word.format(**values) for word in EXECUTES[name]]
    one_line(cli(*args), EXIT_USAGE, "--yes", "no terminal", "nothing was changed")
    assert family.depth() == (3, 0), "the DLQ is as it was"
    assert family.depth(family.queue_url) == (0, 0), "nothing was sent"
    assert not default_ledger_path().exists(), "no run was recorded: none happened"
    assert not (tmp_path / "purged.jsonl").exists()
    if name != "move --native":  # moto has no StartMessageMoveTask (test_native stubs it)
        # The same command with --yes acts.
        assert cli(*args, "--yes").exit_code in (0, 3), name


def test_yes_without_a_terminal_acts(family: Family, cli: Cli) -> None:
    seed(family)
    result = cli("move", "checkout", "--execute", "--yes")
    assert result.exit_code == 0, result.output
    assert family.depth(family.queue_url) == (3, 0)


def test_prompt_names_the_dlq_the_filters_and_the_visible_count(
    family: Family, terminal: None, cli: Cli
) -> None:
    seed(family)
    result = cli("move", "checkout", "--task", "apps.shop.*", "--older-than", "0s", "--execute")
    text = result.stderr
    assert "DLQ:      onion-checkout-dlq (checkout): 3 message(s) visible" in text
    assert "filters:  --task 'apps.shop.*' --older-than 0s" in text
    assert "Move the selected messages from onion-checkout-dlq to onion-checkout? [y/N]" in text


def test_answering_no_exits_1_aborted_and_changes_nothing(
    family: Family, terminal: None, cli: Cli
) -> None:
    seed(family)
    result = cli("move", "checkout", "--execute", input="n\n")
    assert result.exit_code == EXIT_ERROR, result.output
    assert result.stderr.strip().splitlines()[-1] == "aborted: nothing was changed"
    assert family.depth() == (3, 0) and family.depth(family.queue_url) == (0, 0)
    assert not default_ledger_path().exists()


def test_the_default_answer_is_no(family: Family, terminal: None, cli: Cli) -> None:
    seed(family)
    result = cli("move", "checkout", "--execute", input="\n")
    assert result.exit_code == EXIT_ERROR and "aborted" in result.stderr
    assert family.depth() == (3, 0)


def test_answering_yes_acts(family: Family, terminal: None, cli: Cli) -> None:
    seed(family)
    result = cli("move", "checkout", "--execute", "--json", input="y\n")
    assert result.exit_code == 0, result.output
    assert family.depth(family.queue_url) == (3, 0) and family.depth() == (0, 0)


def test_purge_prompt_and_no(family: Family, terminal: None, tmp_path: Path, cli: Cli) -> None:
    seed(family)
    archive = tmp_path / "a.jsonl"
    result = cli(
        "purge", "checkout", "--task", CHARGE, "--archive", str(archive), "--execute", input="n\n"
    )
    assert result.exit_code == EXIT_ERROR, result.output
    assert "3 message(s) visible" in result.stderr
    assert f"--task {CHARGE}" in result.stderr
    assert "Delete the selected messages from onion-checkout-dlq after archiving them?" in (
        result.stderr
    )
    assert "aborted" in result.stderr
    assert family.depth() == (3, 0) and not archive.exists()


def test_purge_queue_prompt_says_every_message(family: Family, terminal: None, cli: Cli) -> None:
    seed(family)
    result = cli("purge", "checkout", "--no-archive", "--execute", input="n\n")
    assert result.exit_code == EXIT_ERROR
    assert "3 message(s) visible" in result.stderr and "EVERY message" in result.stderr
    assert family.depth() == (3, 0)


def test_replay_prompt_names_the_archive_and_the_queue(
    family: Family, terminal: None, archive: str, cli: Cli
) -> None:
    result = cli(
        "replay", archive, "--to", "onion-checkout", "--task", MAIL, "--execute", input="n\n"
    )
    assert result.exit_code == EXIT_ERROR, result.output
    assert f"archive:  {archive}" in result.stderr
    assert "to:       onion-checkout" in result.stderr
    assert f"filters:  --task {MAIL}" in result.stderr
    assert family.depth(family.queue_url) == (0, 0)


def test_apply_prompt(family: Family, terminal: None, plan: str, cli: Cli) -> None:
    result = cli("apply", plan, "--execute", input="n\n")
    assert result.exit_code == EXIT_ERROR, result.output
    assert "onion-checkout-dlq" in result.stderr and "aborted" in result.stderr
    assert family.depth() == (3, 0)


def test_archive_asks_nothing(family: Family, tmp_path: Path, cli: Cli) -> None:
    """archive deletes and sends nothing: like inspect, it needs neither --execute nor --yes."""
    seed(family)
    result = cli("archive", "checkout", "--archive", str(tmp_path / "x.jsonl"))
    assert result.exit_code == 0, result.output
    assert family.depth() == (3, 0)


def test_a_dry_run_asks_nothing(family: Family, cli: Cli) -> None:
    seed(family)
    assert cli("move", "checkout").exit_code == 0
    assert cli("purge", "checkout").exit_code == 0


# -- a real terminal: the prompt, "no" and Ctrl-C in a pseudo-terminal -------------------------


def _spawn_on_a_tty(server: MotoServer, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    master, slave = os.openpty()
    env = server.env()
    env["REDRIVE_RECEIVE_WAIT"] = "0"
    env["PYTHONFAULTHANDLER"] = "1"
    process = subprocess.Popen(
        [*REDRIVE, *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    os.close(slave)
    return process, master


def _read_until(master: int, text: str, *, timeout: float = 30) -> str:
    seen = b""
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {text!r} on the terminal; it showed: {seen.decode(errors='replace')}"
        ready, _, _ = select.select([master], [], [], left)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the process closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    return seen.decode(errors="replace")


def _drain(master: int, seconds: float) -> str:
    """Read what the terminal shows for a while, so the process never blocks writing to it."""
    shown = ""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([master], [], [], min(left, 0.1))
        if not ready:
            continue
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk.decode(errors="replace")
    return shown


def _why_still_running(process: subprocess.Popen[bytes], master: int, shown: str) -> str:
    """What a process that ignored Ctrl-C was doing: its signal masks, and every thread's stack
    (PYTHONFAULTHANDLER makes SIGABRT print them)."""
    status = Path(f"/proc/{process.pid}/status").read_text()
    masks = [line for line in status.splitlines() if line.startswith(("State", "Sig", "Shd"))]
    process.send_signal(signal.SIGABRT)
    stacks = _drain(master, 3)
    os.close(master)
    process.kill()
    process.wait(10)
    return "\n".join(["still running after 10 SIGINTs", *masks, "shown:", shown, stacks])


def _finish(process: subprocess.Popen[bytes], master: int) -> tuple[int, str]:
    rest = ""
    try:
        code = process.wait(30)
        while True:
            ready, _, _ = select.select([master], [], [], 0.2)
            if not ready:
                break
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            rest += chunk.decode(errors="replace")
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
            process.wait(10)
    return code, rest


@pytest.fixture
def tty_family(server: MotoServer) -> Family:
    family = make_family(server.client())
    seed(family)
    return family


@pytest.mark.e2e
def test_on_a_real_terminal_the_prompt_asks_and_no_exits_1(
    server: MotoServer, tty_family: Family
) -> None:
    process, master = _spawn_on_a_tty(server, "move", "checkout", "--task", CHARGE, "--execute")
    shown = _read_until(master, "[y/N]")
    assert "onion-checkout-dlq (checkout): 3 message(s) visible" in shown
    assert f"--task {CHARGE}" in shown
    os.write(master, b"n\r")
    code, rest = _finish(process, master)
    assert code == EXIT_ERROR, shown + rest
    assert "aborted" in rest and "Traceback" not in rest
    assert tty_family.depth() == (3, 0) and tty_family.depth(tty_family.queue_url) == (0, 0)


@pytest.mark.e2e
def test_on_a_real_terminal_ctrl_c_at_the_prompt_is_an_interruption(
    server: MotoServer, tty_family: Family
) -> None:
    process, master = _spawn_on_a_tty(server, "purge", "checkout", "--no-archive", "--execute")
    _read_until(master, "[y/N]")
    # What the terminal does on Ctrl-C: SIGINT to the process. A person presses it once the
    # prompt is up; a signal before the read starts would wait for the next key.
    shown = ""
    for _ in range(10):
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        shown += _drain(master, 2)
        if process.poll() is not None:
            break
    if process.poll() is None:
        pytest.fail(_why_still_running(process, master, shown))
    code, rest = _finish(process, master)
    rest = shown + rest
    assert code == EXIT_INTERRUPTED, rest
    assert "aborted" in rest and "Traceback" not in rest
    assert tty_family.depth() == (3, 0)


@pytest.mark.e2e
def test_with_no_terminal_the_real_command_exits_2(server: MotoServer, tty_family: Family) -> None:
    env: dict[str, Any] = server.env()
    done = subprocess.run(
        [*REDRIVE, "move", "checkout", "--execute"],
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stderr.strip().splitlines() == [
        "Error: --execute with no terminal to confirm on (stdin and stderr must both be one) "
        "needs --yes: nothing was changed; add --yes to act without asking"
    ]
    assert tty_family.depth() == (3, 0)
