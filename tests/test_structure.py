"""The package's shape: no import cycles (every module imports alone, and none imports another
that imports it back, even inside a function), the layers (operations and celery below
reporting, render and the CLI), and click stays in redrive.cli."""

from __future__ import annotations

import ast
import itertools
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

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
    for role in (
        "aws",
        "ledger",
        "archive",
        "dlq",
        "inspection",
        "operations",
        "reporting",
        "render",
        "cli",
    ):
        assert f"redrive.{role}" in MODULES


#: How long one module's import may take before the test calls it a hang: a bound on each
#: import (well under a second each), not on all of them, which a loaded machine stretches.
IMPORT_HANG = 120.0


def _lines(stream: IO[str], out: queue.Queue[str]) -> None:
    for line in stream:
        out.put(line)
    out.put("")  # the end


@pytest.mark.e2e
def test_every_module_imports_alone_in_a_fresh_interpreter() -> None:
    # One interpreter per module would take ~70 s; a fresh interpreter that imports each module
    # after clearing redrive's modules from sys.modules finds the same cycles in one process.
    # It names each module once imported: the hang bound runs from the last one.
    script = (
        "import importlib, sys\n"
        f"names = {MODULES!r}\n"
        "for name in names:\n"
        "    for loaded in [m for m in sys.modules if m.split('.')[0] == 'redrive']:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        print(f'failed {name}: {type(exc).__name__}: {exc}', flush=True)\n"
        "    else:\n"
        "        print(f'imported {name}', flush=True)\n"
    )
    command = [sys.executable, "-c", script]
    lines: queue.Queue[str] = queue.Queue()
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as child:
        assert child.stdout is not None
        threading.Thread(target=_lines, args=(child.stdout, lines), daemon=True).start()
        said: list[str] = []
        while not said or said[-1] != "":
            try:
                said.append(lines.get(timeout=IMPORT_HANG))
            except queue.Empty:
                child.kill()
                last = said[-1].strip() if said else "nothing imported yet"
                pytest.fail(f"no import done in {IMPORT_HANG:.0f} s after: {last}")
        child.wait()
    imported = [line.split()[1] for line in said if line.startswith("imported ")]
    assert imported == MODULES, "".join(line for line in said if not line.startswith("imported "))
    assert child.returncode == 0, "".join(said)


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


#: The console's framework and server (the ``redrive[web]`` extra): the core works without it.
WEB_PACKAGES = {"starlette", "uvicorn", "jinja2", "multipart", "fastapi"}


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).parts[0] != "web"],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_only_the_console_imports_a_web_framework(path: Path) -> None:
    # The CLI's `redrive web` imports uvicorn inside the command, where the extra is needed.
    allowed = {"uvicorn"} if path.relative_to(PACKAGE).parts == ("cli", "web.py") else set()
    assert not (_imports(path) & WEB_PACKAGES) - allowed


# The AWS SDK (and its type stubs) stays behind the adapters; the sandbox is moto's SQS.
AWS_SDK_PACKAGES = (("aws",), ("broker", "sqs"), ("sandbox",))


def _is_aws_sdk(name: str) -> bool:
    return name in ("boto3", "botocore") or name.startswith("mypy_boto3")


@pytest.mark.parametrize(
    "path",
    [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if not any(p.relative_to(PACKAGE).parts[: len(pkg)] == pkg for pkg in AWS_SDK_PACKAGES)
    ],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_only_the_aws_adapters_import_the_aws_sdk(path: Path) -> None:
    assert sorted(filter(_is_aws_sdk, _imports(path))) == []


def _module_of(path: Path, package: Path) -> tuple[str, bool]:
    """The dotted name of the module at ``path``, and whether it is a package's __init__."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _import_graph(package: Path) -> dict[str, dict[str, int]]:
    """Module -> the package's modules it imports -> the line of the first such import.

    Read from the source (nothing is imported). Every import statement counts, wherever it
    is: at the top, inside a function, under ``if TYPE_CHECKING:`` (a cycle deferred into a
    function is a cycle all the same, only hidden until that function runs), relative ones
    resolved. An imported name stands for the longest module it names (``from redrive.a
    import b`` is ``redrive.a.b`` when that is a module, else ``redrive.a``). A package's
    __init__, which Python runs before any of its submodules, is not an edge of theirs: a
    package imports its submodules, so counting it would make each a cycle with its package."""
    paths = {_module_of(p, package)[0]: p for p in sorted(package.rglob("*.py"))}

    def module(name: str) -> str | None:
        parts = name.split(".")
        while parts and ".".join(parts) not in paths:
            parts.pop()
        return ".".join(parts) if parts else None

    graph: dict[str, dict[str, int]] = {}
    for name, path in paths.items():
        is_package = _module_of(path, package)[1]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    # Level 1 is the package the module is in (for an __init__: its own).
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    here = here[: len(here) - (node.level - 1)]
                    base = ".".join([*here, *([node.module] if node.module else [])])
                # ``from P import m`` runs P first, whatever m is: a package's __init__ that
                # imports the module back is a cycle, as any other.
                imported = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in filter(None, map(module, imported)):
                if target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


GRAPH = _import_graph(PACKAGE)


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm): each
    holds at least one cycle, and every module on a cycle is in one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def _one_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, as the path of its imports."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        module = queue.pop(0)
        for other in sorted(graph[module]):
            if other == start:
                return [*paths[module], start]
            if other in members and other not in paths:
                paths[other] = [*paths[module], other]
                queue.append(other)
    raise AssertionError(f"{component} is not strongly connected")


def _cycle_texts(graph: dict[str, dict[str, int]]) -> list[str]:
    """One line per component on a cycle: a cycle through it, each import with its line, and
    the component's other members when the cycle shown does not pass them all."""
    texts = []
    for component in _cycles(graph):
        cycle = _one_cycle(graph, component)
        steps = [f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle)]
        text = " -> ".join([*steps, cycle[-1]])
        if len(component) > len(cycle) - 1:
            text += f"  [also in this tangle: {', '.join(sorted(set(component) - set(cycle)))}]"
        texts.append(text)
    return texts


def test_the_import_graph_counts_deferred_type_checking_and_relative_imports(
    tmp_path: Path,
) -> None:
    # The check's own check, on a package written for it: each cycle below hides one side of
    # its import where a fresh interpreter importing each module alone would never see it.
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "ring").mkdir()
    files = {
        "__init__.py": "from pkg import a\n",
        "a.py": "def later() -> None:\n    from pkg.sub import b\n",
        "sub/__init__.py": "",
        "sub/b.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from ..a import later\n"
            "from . import c\n"
        ),
        "sub/c.py": "import pkg.sub.d\n",
        "sub/d.py": "from pkg.sub import c as again\n",
        # ``from P import m`` runs P's __init__, which imports the module back.
        "ring/__init__.py": "from pkg.ring.x import f\n",
        "ring/x.py": "from pkg.ring import y\nf = 1\n",
        "ring/y.py": "",
    }
    for name, text in files.items():
        (package / name).write_text(text)
    graph = _import_graph(package)
    assert graph == {
        "pkg": {"pkg.a": 1},
        "pkg.a": {"pkg.sub": 2, "pkg.sub.b": 2},
        "pkg.sub": {},
        "pkg.sub.b": {"pkg.a": 3, "pkg.sub": 4, "pkg.sub.c": 4},
        "pkg.sub.c": {"pkg.sub.d": 1},
        "pkg.sub.d": {"pkg.sub": 1, "pkg.sub.c": 1},
        "pkg.ring": {"pkg.ring.x": 1},
        "pkg.ring.x": {"pkg.ring": 1, "pkg.ring.y": 1},
        "pkg.ring.y": {},
    }
    assert _cycle_texts(graph) == [
        "pkg.a (line 2) -> pkg.sub.b (line 3) -> pkg.a",
        "pkg.ring (line 1) -> pkg.ring.x (line 1) -> pkg.ring",
        "pkg.sub.c (line 1) -> pkg.sub.d (line 1) -> pkg.sub.c",
    ]


def test_no_module_imports_one_that_imports_it_back() -> None:
    cycles = _cycle_texts(GRAPH)
    for cycle in cycles:
        print("import cycle:", cycle)
    assert cycles == [], "import cycles:\n" + "\n".join(cycles)


def _imports_from(package: str, *above: str) -> list[str]:
    return [
        f"{module} imports {target} (line {line})"
        for module, edges in sorted(GRAPH.items())
        if module == package or module.startswith(package + ".")
        for target, line in sorted(edges.items())
        if any(target == a or target.startswith(a + ".") for a in above)
    ]


LAYERS_ABOVE = ("redrive.reporting", "redrive.render", "redrive.cli")


@pytest.mark.parametrize("package", ["redrive.operations", "redrive.celery"])
def test_operations_and_celery_import_nothing_from_the_layers_above(package: str) -> None:
    # Reporting, rendering and the CLI use operations and celery; the other way round, a
    # change to a view could break a move (and the imports would be a cycle in waiting).
    assert _imports_from(package, *LAYERS_ABOVE) == []


def test_inspection_imports_nothing_from_the_operations() -> None:
    # The coordinator (in operations) runs an inspect: inspection importing operations back
    # would be an arrow up. What both need (the --processes supervisor, a run's observer,
    # the live runs, the archive's records as deliveries) is below them, in runs and archive.
    assert _imports_from("redrive.inspection", "redrive.operations") == []


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


def _part(module: str) -> str:
    """The part of redrive a module belongs to: its sub-package or top-level module (the SQS
    backend, ``broker.sqs``, is a part of its own)."""
    parts = module.split(".")[1:] or ["redrive"]
    if parts[:2] == ["broker", "sqs"]:
        return "broker.sqs"
    if parts[:2] == ["broker", "rabbitmq"]:
        return "broker.rabbitmq"
    if parts[:2] == ["operations", "coordinator"]:
        return "operations.coordinator"
    return parts[0]


#: Which part of redrive may import which. The core speaks the broker seam (``broker``, its
#: ``base``); only the CLI (which opens brokers), the sandbox (a local SQS) and SQS's own
#: rendering of its native move tasks reach ``broker.sqs``. A new crossing fails here: add
#: it only if the layering still holds (docs/architecture.md).
ALLOWED_IMPORTS: dict[str, set[str]] = {
    "__main__": {"cli"},
    "redrive": set(),
    "errors": set(),
    "durations": set(),
    "shell": set(),
    "rate": set(),
    "state_dir": set(),
    "signals": set(),
    "messages": set(),
    "allocator": set(),
    "webhook": {"errors"},
    "config": {"durations", "errors"},
    "keys": {"messages"},
    "aws": {"errors"},
    "broker": {"aws", "broker.rabbitmq", "broker.sqs", "config", "durations", "errors"},
    "broker.sqs": {"aws", "broker", "config", "durations", "errors"},
    "broker.rabbitmq": {"attributes", "broker", "config", "errors"},
    "attributes": {"broker"},
    "message_record": {"broker", "durations", "messages"},
    "where": {"broker", "errors", "message_record", "messages", "shell"},
    "selection": {"broker", "messages", "where"},
    "ledger": {"aws", "errors", "state_dir"},
    "archive": {"aws", "broker", "errors"},
    "dlq": {"allocator", "broker", "errors", "state_dir"},
    "celery": {"broker", "config", "errors", "messages"},
    "operations": {
        *("allocator", "archive", "attributes", "aws", "broker", "celery", "dlq", "durations"),
        *("errors", "keys", "ledger", "messages", "rate", "repair", "runs", "selection"),
        "signals",
    },
    # What every run shares, below the operations and inspect: a run's life in the ledger,
    # its observer, the --processes supervisor and what its processes share, live runs.
    "runs": {
        *("allocator", "archive", "aws", "broker", "dlq", "errors", "keys", "ledger"),
        *("selection", "signals"),
    },
    # Inspect's own package: its scan, and its processes on the runs' supervisor. Below the
    # operations (the coordinator runs an inspect): it imports nothing of theirs.
    "inspection": {
        *("archive", "attributes", "broker", "celery", "dlq", "durations", "errors"),
        *("message_record", "messages", "runs", "selection", "where"),
    },
    # What every front end calls: one run's life, whatever the operation.
    "operations.coordinator": {
        *("archive", "aws", "broker", "celery", "dlq", "errors", "inspection", "ledger"),
        *("operations", "runs"),
    },
    # Edits of a task and its re-encoding: pure, below the operations that will send it.
    "repair": {"errors", "messages", "shell"},
    "reporting": {
        *("archive", "aws", "broker", "celery", "config", "dlq", "durations", "errors"),
        *("inspection", "keys", "ledger", "messages", "operations", "runs"),
    },
    "render": {
        *("archive", "broker", "broker.sqs", "celery", "durations", "inspection", "ledger"),
        *("operations", "reporting", "runs", "selection", "shell"),
    },
    "sandbox": {"broker", "broker.rabbitmq", "broker.sqs", "config", "errors", "messages"},
    "cli": {"*"},
    # The console (redrive web): beside the CLI over the same core, never importing the CLI.
    "web": {
        *("archive", "aws", "broker", "celery", "config", "dlq", "durations", "errors"),
        *("inspection", "ledger", "message_record", "messages", "operations", "redrive"),
        *("render", "reporting", "runs", "selection", "where"),
        # The actions: runs through the coordinator, a repair's edits, the plans' folder.
        *("operations.coordinator", "repair", "state_dir"),
    },
}


def test_each_part_imports_only_the_parts_the_table_allows() -> None:
    crossings = sorted(
        f"{module} imports {target} (line {line})"
        for module, edges in GRAPH.items()
        for target, line in edges.items()
        # redrive's own __init__ (its version) runs before any module: every one may name it.
        if _part(target) not in (_part(module), "redrive")
        and "*" not in ALLOWED_IMPORTS.get(_part(module), set())
        and _part(target) not in ALLOWED_IMPORTS.get(_part(module), set())
    )
    assert crossings == [], "imports the table does not allow:\n" + "\n".join(crossings)


def test_the_table_names_every_part() -> None:
    assert {_part(m) for m in GRAPH} <= set(ALLOWED_IMPORTS)


#: The front ends: each parses what it is asked, asks for a confirmation where someone can
#: answer, runs the operation through the coordinator and renders its result.
FRONT_ENDS = ("cli", "web")
#: Below the coordinator's API: the operations' engines, entries and child jobs.
BELOW_THE_COORDINATOR = ("operations", "inspection", "runs")
#: A front end's imports from below that are neither types nor the coordinator's, and why.
FRONT_END_EXCEPTIONS = {
    ("redrive.cli.audit", "redrive.operations.resolve"): "`ledger in-doubt` resolves in the "
    "ledger, no operation's run: not a coordinator request yet",
    ("redrive.web.reads", "redrive.operations.resolve"): "the operations page's in-doubt "
    "list and its resolutions, as `ledger in-doubt`'s: not a coordinator request yet",
    ("redrive.web.reads", "redrive.runs.lifecycle"): "`run_is_live` reads a run record "
    "(no run, no write): the operations page tells live runs from finished ones",
}


def _front_end_crossings() -> list[str]:
    """What a front end imports from below the coordinator that is not a type, a constant
    or the coordinator's own API: a function there (an engine, an entry, a child job, a
    run's life in the ledger) would be a second coordinator in the front end."""
    import importlib
    import inspect as pyinspect

    crossings = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module, _ = _module_of(path, PACKAGE)
        if _part(module) not in FRONT_ENDS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            source = node.module
            if _part(source) not in BELOW_THE_COORDINATOR or (module, source) in (
                FRONT_END_EXCEPTIONS
            ):
                continue
            imported = importlib.import_module(source)
            for alias in node.names:
                value = getattr(imported, alias.name)
                if pyinspect.isfunction(value) or pyinspect.ismethod(value):
                    crossings.append(f"{module} imports {source}.{alias.name} (line {node.lineno})")
    return crossings


def test_no_front_end_imports_below_the_coordinator_but_types() -> None:
    assert _front_end_crossings() == []


def _long_functions() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > 60:
                    where = path.relative_to(PACKAGE.parent)
                    found.append(f"{where}:{node.lineno} {node.name}: {lines} lines")
    return found


def test_no_function_is_over_60_lines() -> None:
    # From its def to its last line (decorators apart): a longer one does several things.
    assert _long_functions() == []
