"""The broker seam's rules (issue 38, items 4 and 5): above ``redrive/broker/`` nothing picks
a backend by its class, an attribute only one backend has, or its package; the one scheme
table (``redrive.broker.BACKENDS``) opens every backend, and the run's broker settings
cross to a ``--processes`` child as one opaque value. Messages are neutral at the seam
(``Header`` values): SQS's MessageAttributes shape is SQS's translation and the archive
format's, and both give back every attribute as it came."""

from __future__ import annotations

import ast
import json
import pickle
import re
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from hypothesis import given
from hypothesis import strategies as st

from redrive.archive.record import ArchiveRecord
from redrive.aws.session import AwsSettings
from redrive.broker import BACKENDS, BrokerSettings, restored_delivery
from redrive.broker.base import Header
from redrive.broker.memory import MemoryBroker, forget_store, memory_store
from redrive.broker.rabbitmq.envelope import envelope_of, marks_of, unpacked
from redrive.broker.sqs.calls import message as sqs_message
from redrive.broker.sqs.headers import attribute_of, header_of
from redrive.dlq.scan import shared_by_workers
from redrive.runs.processes import ChildRun, Wiring

PACKAGE = Path(__file__).resolve().parent.parent / "redrive"
#: Each backend's classes and the attributes only one of them has.
BACKEND_NAMES = frozenset(
    {"SqsBroker", "SqsCalls", "RabbitBroker", "MemoryBroker", "lean", "lean_send", "link"}
)
#: A backend's name, for words (``on SQS``): compared, it would choose the backend.
BACKEND_NAME_FIELDS = frozenset({"spoken_name"})
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
        if isinstance(node, ast.Compare) and any(
            isinstance(side, ast.Attribute) and side.attr in BACKEND_NAME_FIELDS
            for side in (node.left, *node.comparators)
        ):
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} compares a backend's name")
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


# -- the neutral message model ----------------------------------------------------------------

#: SQS's words for what travels beside a body: only SQS's translation and the archive's
#: format (which keeps SQS's shape, issue 38) may say them.
SQS_SHAPE = re.compile(r"\b(DataType|StringValue|BinaryValue)\b")


def test_no_sqs_attribute_shape_outside_sqs_and_the_archive() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[:2] != ("broker", "sqs")
        and path.relative_to(PACKAGE).parts[0] != "archive"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if SQS_SHAPE.search(line)
    ]
    assert found == []


ATTRIBUTE = st.one_of(
    st.builds(
        lambda label, text: {"DataType": "String" + label, "StringValue": text},
        st.sampled_from(["", ".custom", ".x-y_z"]),
        st.text(max_size=30),
    ),
    st.builds(
        lambda label, n: {"DataType": "Number" + label, "StringValue": n},
        st.sampled_from(["", ".int", ".float"]),
        st.from_regex(r"-?0*[0-9]{1,8}(\.[0-9]{1,3})?", fullmatch=True),
    ),
    st.builds(
        lambda label, raw: {"DataType": "Binary" + label, "BinaryValue": raw},
        st.sampled_from(["", ".gzip"]),
        st.binary(max_size=40),
    ),
)


@given(attribute=ATTRIBUTE)
def test_sqs_and_the_archive_translate_every_attribute_back_as_it_came(
    attribute: dict[str, Any],
) -> None:
    header = header_of(attribute)
    assert attribute_of(header) == attribute
    # The size a header counts is the one SQS counts for the attribute.
    value = attribute.get("BinaryValue", str(attribute.get("StringValue", "")).encode())
    assert header.size("n") == 1 + len(attribute["DataType"].encode()) + len(value)
    record = ArchiveRecord.from_message(
        sqs_message("m", "", "b", {}, {"n": attribute}),
        kept=(),
        task="t",
        task_id=None,
        dlq="d",
        run_id="r",
        archived_at=datetime(2026, 12, 6, tzinfo=UTC),
    )
    again = ArchiveRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert again.message_attributes == {"n": attribute} and again.headers == {"n": header}


def test_rabbitmqs_marks_are_headers_and_go_back_as_plain_amqp_headers() -> None:
    properties = {"application_headers": {"redrive-count": 2, "redrive-key": b"k", "x": 1}}
    marks = marks_of(properties)
    assert marks == {"redrive-count": Header.number("2"), "redrive-key": Header.text("k")}
    _, sent = unpacked(envelope_of(b"{}", properties), marks)
    assert sent["application_headers"] == {"redrive-count": "2", "redrive-key": "k", "x": 1}


def test_an_archived_delivery_is_rebuilt_by_the_backend_whose_facts_it_kept() -> None:
    headers = {"n": Header.number("7")}
    sqs = restored_delivery("m", "b", {"ApproximateReceiveCount": "3"}, headers)
    assert (sqs.receive_count, sqs.headers) == (3, headers)
    memory = restored_delivery("m", "b", {"receive_count": "4", "died_in": "memory:x:q"}, {})
    assert (memory.receive_count, memory.died_in) == (4, "memory:x:q")
    rabbit = restored_delivery("m", "b", {"exchange": "", "routing_key": "q"}, headers)
    assert (rabbit.receive_count, rabbit.enqueued_at, rabbit.headers) == (0, None, headers)


def test_an_archive_keeps_an_sqs_attribute_exactly_as_the_client_returned_it() -> None:
    """Archives keep their format: the fields, their order and the empty list fields a
    real SQS receive gives, as archives written before the neutral headers held them."""
    received = {
        "StringValue": "0042",
        "StringListValues": [],
        "BinaryListValues": [],
        "DataType": "Number.int",
    }
    delivery = sqs_message("m", "r", "b", {}, {"n": received})
    assert delivery.headers == {"n": Header.number("0042", "int")}
    record = ArchiveRecord.from_message(
        delivery,
        kept=(),
        task="t",
        task_id=None,
        dlq="d",
        run_id="r",
        archived_at=datetime(2026, 12, 6, tzinfo=UTC),
    )
    line = json.dumps(record.to_json())
    kept = '{"StringValue": "0042", "StringListValues": [], "BinaryListValues_b64": [], '
    assert f'"n": {kept}"DataType": "Number.int"}}' in line
    # A header made here (redrive's own marks) is written in the format's own shape.
    marks = sqs_message("m", "r", "b", {}, {}).headers | {"k": Header.text("v")}
    assert attribute_of(marks["k"]) == {"DataType": "String", "StringValue": "v"}
