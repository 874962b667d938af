"""docs/console.md's ``redrive web`` commands run as the page says, against the SQS sandbox:
each console starts and answers (then is stopped), and the one the page expects to refuse
exits with its code. (tests/test_docs.py runs the page's other commands; a console runs until
stopped, so it leaves these to this test.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import test_docs
from conftest import free_port
from web_servers import ROOT, sqs_sandbox

pytestmark = pytest.mark.e2e  # the sandbox and each console are processes
PAGE = ROOT / "docs" / "console.md"


def _answers(url: str, process: subprocess.Popen[str]) -> bool:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            time.sleep(0.2)
    return False


def _serve(text: str, env: dict[str, str], workdir: Path) -> None:
    """Start the console as the line says, on a free loopback port instead of 8080 (and of
    any address: the test listens on loopback only), see it answer, stop it."""
    port = free_port()
    text = re.sub(r"--bind \S+", "", text).replace(
        "redrive web", f"redrive web --bind 127.0.0.1:{port}", 1
    )
    process = subprocess.Popen(
        ["bash", "-c", f"exec {text}"],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert _answers(f"http://127.0.0.1:{port}/healthz", process), text
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=30)
    assert "Traceback" not in out and "redrive console at" in out, out


def test_the_console_pages_commands_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(test_docs, "NOT_RUN_HERE", ("redrive sandbox",))
    lines = [c for c in test_docs.commands(PAGE) if c.text.startswith(("redrive web", "printf"))]
    assert any(c.text.startswith("redrive web --users") for c in lines)
    with sqs_sandbox(tmp_path, per_family=5) as sandbox:
        env = {**sandbox.env, "REDRIVE_STATE_DIR": str(tmp_path / "state")}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        for command in lines:
            if (
                command.expect
                or not command.text.startswith("redrive web")
                or " passwd " in command.text
            ):
                done = subprocess.run(
                    ["bash", "-c", command.text],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                    stdin=subprocess.DEVNULL,
                )
                assert done.returncode == command.expect, (command.text, done.stderr)
                assert "Traceback" not in done.stderr
            else:
                _serve(command.text, env, tmp_path)
