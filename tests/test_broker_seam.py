"""The broker seam's rules (issue 38, items 4 and 5): above ``redrive/broker/`` nothing picks
a backend by its class, an attribute only one backend has, or its package; the one scheme
table (``redrive.broker.BACKENDS``) opens every backend, and the run's broker settings
cross to a ``--processes`` child as one opaque value."""

from __future__ import annotations

import ast
import pickle
import threading
import uuid
from pathlib import Path
from typing import Any, cast

from redrive.aws.session import AwsSettings
from redrive.broker import BACKENDS, BrokerSettings
from redrive.broker.memory import MemoryBroker, forget_store, memory_store
from redrive.dlq.scan import shared_by_workers
from redrive.operations.processes import ChildRun, Wiring

PACKAGE = Path(__file__).resolve().parent.parent / "redrive"
#: Each backend's classes and the attributes only one of them has.
BACKEND_NAMES = frozenset(
    {"SqsBroker", "SqsCalls", "RabbitBroker", "MemoryBroker", "lean", "lean_send", "link"}
)
BACKEND_PACKAGES = ("redrive.broker.sqs", "redrive.broker.rabbitmq", "redrive.broker.memory")


def _above_the_seam() -> list[Path]:
    """redrive's modules outside the broker package (the SQS sandbox seeds moto's SQS: it
    is SQS's by what it is for)."""
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in ("broker", "sandbox")
    ]


def _choices(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
            "isinstance",
            "getattr",
            "hasattr",
        ):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            names |= {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)}
            if names & BACKEND_NAMES:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(BACKEND_PACKAGES):
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} imports {node.module}")
    return found


def test_no_backend_is_chosen_by_class_attribute_or_package_above_the_seam() -> None:
    assert [c for path in _above_the_seam() for c in _choices(path)] == []


def test_each_backend_is_one_row_of_the_scheme_table() -> None:
    schemes = [scheme for row in BACKENDS for scheme in row.schemes]
    assert len(schemes) == len(set(schemes))
    assert {row.name for row in BACKENDS} == {"sqs", "rabbitmq", "memory"}
    for row in BACKENDS:
        assert callable(row.opener())


def test_the_broker_settings_cross_to_a_child_as_one_value() -> None:
    name = f"seam-{uuid.uuid4().hex[:8]}"
    store = memory_store(name)
    try:
        wiring = Wiring.of(AwsSettings(), broker=BrokerSettings(url=f"memory://{name}"))
        crossed = pickle.loads(pickle.dumps(wiring))
        child = ChildRun(
            wiring=crossed, shares=cast(Any, None), stop=threading.Event(), observer=cast(Any, None)
        )
        opened = child.broker()
        # In one process (a test's): the same store; its capabilities say workers share it.
        assert isinstance(opened, MemoryBroker) and opened.store is store
        assert shared_by_workers(opened) and child.broker() is opened
    finally:
        forget_store(name)
