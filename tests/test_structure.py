"""The package's shape: every module imports alone (no cycles), and click stays in redrive.cli."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "redrive"


def _module_names() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


MODULES = _module_names()


def test_the_package_has_its_sub_packages() -> None:
    for role in ("aws", "ledger", "archive", "dlq", "operations", "reporting", "render", "cli"):
        assert f"redrive.{role}" in MODULES


@pytest.mark.e2e
def test_every_module_imports_alone_in_a_fresh_interpreter() -> None:
    # One interpreter per module would take ~70 s; a fresh interpreter that imports each module
    # after clearing redrive's modules from sys.modules finds the same cycles in one process.
    script = (
        "import importlib, sys\n"
        f"names = {MODULES!r}\n"
        "failed = []\n"
        "for name in names:\n"
        "    for loaded in [m for m in sys.modules if m.split('.')[0] == 'redrive']:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{name}: {type(exc).__name__}: {exc}')\n"
        "print('\\n'.join(failed))\n"
        "sys.exit(1 if failed else 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(PACKAGE.rglob("*.py")) if "cli" not in p.relative_to(PACKAGE).parts],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_only_the_cli_imports_click(path: Path) -> None:
    assert "click" not in _imports(path)


def test_the_core_never_prints() -> None:
    printing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in ("cli", "sandbox") or rel.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                printing.append(f"{rel}:{node.lineno}")
    assert printing == []
