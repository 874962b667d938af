"""What keeps the suite honest (issue 37): under CI=true a real component that is missing
fails the run instead of turning its tests into skips, and Hypothesis draws the same
examples on every CI run; locally both stay as they were (skips that say why, new examples)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import missing_component

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
MAKE = shutil.which("make")


def bare_path(tmp_path: Path) -> str:
    """A PATH with python and ``id`` only: no chromium, no apt-get."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, target in (("python", sys.executable), ("id", shutil.which("id"))):
        if target is not None and not (bin_dir / name).exists():
            (bin_dir / name).symlink_to(target)
    return str(bin_dir)


@pytest.mark.e2e  # make as a subprocess
@pytest.mark.skipif(MAKE is None, reason="make is not installed")
@pytest.mark.parametrize("target", ["browser", "rabbitmq"])
def test_make_fails_in_ci_when_a_real_component_is_missing(target: str, tmp_path: Path) -> None:
    """``make rabbitmq``/``make browser`` said "will skip" and went on under CI too."""
    assert MAKE is not None
    args = [MAKE, "-s", "-C", str(ROOT), target, "RABBITMQ_SERVER=/nonexistent/rabbitmq-server"]
    env = {"PATH": bare_path(tmp_path), "HOME": str(tmp_path)}
    local = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert local.returncode == 0, local.stderr
    assert "will skip" in local.stdout
    ci = subprocess.run(args, env=env | {"CI": "true"}, capture_output=True, text=True, timeout=60)
    assert ci.returncode != 0, ci.stdout
    assert "CI=true" in ci.stderr and "is missing" in ci.stderr


def test_a_missing_component_skips_locally_and_fails_in_ci() -> None:
    with pytest.raises(pytest.skip.Exception, match="no thing"):
        missing_component("no thing", ci=False)
    with pytest.raises(pytest.fail.Exception, match=r"no thing.*CI=true"):
        missing_component("no thing", ci=True)


PROBE = """
from hypothesis import settings

def test_the_profile():
    print("derandomize", settings.default.derandomize, "database", settings.default.database)

def test_a_node(rabbitmq_node):
    pass
"""

NO_RABBITMQ = """
from pathlib import Path
import redrive.sandbox.rabbitmq_node as node
node.RABBITMQ_SERVER = Path("/nonexistent/rabbitmq-server")
"""


def run_probe(tmp_path: Path, *, ci: bool) -> str:
    """tests/conftest.py's fixtures and profile, in a pytest of their own, with neither
    RabbitMQ's server (a plugin points at none) nor chromium (not on PATH)."""
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "no_rabbitmq.py").write_text(NO_RABBITMQ)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env |= {"PATH": bare_path(tmp_path), "PYTHONPATH": f"{tmp_path}{os.pathsep}{TESTS}"}
    if ci:
        env["CI"] = "true"
    plugins = ["-p", "no_rabbitmq", "-p", "conftest", "-p", "no:xdist", "-p", "no:cacheprovider"]
    probes = [str(tmp_path / "test_probe.py"), str(TESTS / "test_report_browser.py")]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *plugins,
            "-c",
            os.devnull,
            "--rootdir",
            str(tmp_path),
            "-s",
            "-rA",
            *probes,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.stdout + done.stderr


@pytest.mark.e2e  # pytest as a subprocess
def test_in_ci_missing_rabbitmq_and_chromium_fail_and_hypothesis_is_derandomized(
    tmp_path: Path,
) -> None:
    out = run_probe(tmp_path, ci=True)
    assert "derandomize True database None" in out, out[-3000:]
    assert "SKIPPED" not in out, out[-3000:]
    assert "ERROR test_probe.py::test_a_node - Failed: no RabbitMQ" in out, out[-3000:]
    assert "CI=true: a missing real component fails the run" in out, out[-3000:]
    assert out.count("FAILED ::test_chromium") == 2 and "no chromium on PATH" in out, out[-3000:]


@pytest.mark.e2e  # pytest as a subprocess
def test_locally_they_skip_with_a_reason_and_hypothesis_explores(tmp_path: Path) -> None:
    out = run_probe(tmp_path, ci=False)
    assert "derandomize False" in out and "database None" not in out, out[-3000:]
    assert "FAILED" not in out, out[-3000:]
    assert "SKIPPED" in out and "no RabbitMQ" in out and "no chromium" in out, out[-3000:]


def test_exactly_once_checks_count_after_the_worker_stopped() -> None:
    """A fixed wait "long enough for a duplicate" let a later duplicate pass unseen: each
    Celery check counts executions once the queues are drained and the worker has stopped
    (``celery_worker.run_worker_until``), so no wait of a second or more is left. A task's
    own work (a line marked ``# task body:``) is no wait of the test's."""
    waits = {
        path.name: found
        for path in sorted(TESTS.glob("test_*celery*e2e.py"))
        if (
            found := [
                line
                for line in path.read_text().splitlines()
                if re.search(r"time\.sleep\(\s*(?:[1-9]|0*\.[5-9])", line)
                and "# task body:" not in line
            ]
        )
    }
    assert not waits, waits


def test_no_test_skips_because_it_runs_as_root() -> None:
    """CI runs as root: a test skipped for root never ran there. Permission tests set root's
    privileges aside instead (tests/unprivileged.py)."""
    skipping = [
        path.name
        for path in sorted(TESTS.glob("test_*.py"))
        if re.search(r"skip\w*\([^)]*geteuid\(\)\s*==\s*0", path.read_text(), re.S)
    ]
    assert not skipping, skipping


@pytest.mark.e2e  # make and git as subprocesses
@pytest.mark.skipif(MAKE is None or shutil.which("git") is None, reason="make or git missing")
def test_minimums_if_changed_runs_test_minimums_only_when_a_landing_changed_pyproject(
    tmp_path: Path,
) -> None:
    """.ci/run: ``make test``, then ``make minimums-if-changed``, which runs
    ``make test-minimums`` only where pyproject.toml differs from the previous main (HEAD^1,
    a landing's merge's first parent). Shown with ``make -n`` in a repository of two and
    then three commits (nothing is installed or run)."""
    assert MAKE is not None
    steps = [
        line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line[:5] == "make "
    ]
    assert steps == ["make test", "make minimums-if-changed"]
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(ROOT / "Makefile", repo / "Makefile")
    (repo / "requirements").mkdir()
    (repo / "requirements" / "localstack.txt").write_text("")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "CI": ""}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}

    def commit(name: str, text: str) -> None:
        (repo / name).write_text(text)
        for args in (["add", name], ["commit", "-qm", name]):
            subprocess.run(["git", *args], cwd=repo, env=env, check=True, timeout=30)

    def make_says() -> list[str]:
        args = [MAKE, "-n", "-s", "minimums-if-changed"]
        done = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()  # -n prints each recipe; the echo's line is its own

    subprocess.run(["git", "init", "-q"], cwd=repo, env=env, check=True, timeout=30)
    commit("pyproject.toml", 'dependencies = ["click>=8.2"]\n')
    commit("pyproject.toml", 'dependencies = ["click>=8.2.1"]\n')
    changed = make_says()
    assert "pyproject.toml changed since HEAD^1: make test-minimums" in changed
    assert any("minimum_pins.py" in line for line in changed)
    assert any("-m pip install" in line and "constraints.txt" in line for line in changed)
    commit("notes.txt", "no floor changed\n")
    unchanged = make_says()
    assert "pyproject.toml unchanged since HEAD^1: test-minimums not run" in unchanged
    assert not any("minimum_pins.py" in line for line in unchanged)


def test_every_floor_pyproject_declares_is_one_test_minimums_installs() -> None:
    """``.ci/minimum_pins.py`` pins a package that several lists name at the highest of their
    floors: a lower floor beside it (the ``celery`` extra's 5.3 beside the test extra's 5.5)
    would admit releases no run of the suite tries."""
    spec = importlib.util.spec_from_file_location("minimum_pins", ROOT / ".ci" / "minimum_pins.py")
    assert spec is not None and spec.loader is not None
    minimum_pins = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(minimum_pins)
    pins = minimum_pins.floors(ROOT / "pyproject.toml")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lists = [project["dependencies"], *project["optional-dependencies"].values()]
    declared = [minimum_pins._FLOOR.match(line) for extra in lists for line in extra]
    lower = {
        (match.group(1).lower(), match.group(2))
        for match in declared
        if match is not None and match.group(2) != pins[match.group(1).lower()]
    }
    assert not lower, f"floors test-minimums never installs: {sorted(lower)}"
    assert pins["celery"] == "5.5" and pins["click"] == "8.4.2"
