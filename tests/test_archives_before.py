"""Archives written by earlier releases read, check and replay today.

``fixtures/archives-before/`` holds archives an earlier redrive wrote itself (a real executed
``purge --archive`` of that release; ``make_archive.py`` and the README beside them say how and
at which commit), each with what was in the DLQ: bare gzip members from before the header
(914eae5), a plain ``.jsonl`` of that release, and a header without ``redrive_receives``
(e19b61e). Today's reader must read each record as it was archived, find no damage in them,
and replay must send each message back byte-identical, attributes included, once.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli, Family

from redrive import attributes
from redrive.archive import check_archive, read_records

FIXTURES = Path(__file__).parent / "fixtures" / "archives-before"
ARCHIVES = ("914eae5-bare-members.jsonl.gz", "914eae5-plain.jsonl", "e19b61e-header.jsonl.gz")
OURS = (attributes.COUNT, attributes.KEY, attributes.SOURCE_DLQ)


def sent(name: str) -> dict[str, dict[str, Any]]:
    """MessageId -> the body and message attributes that release's DLQ held (binary values
    as bytes, as boto3 returns them)."""
    messages = json.loads((FIXTURES / f"{name}.messages.json").read_text(encoding="utf-8"))
    return {
        m["message_id"]: {
            "body": m["body"],
            "message_attributes": {
                key: {k: base64.b64decode(v) if k == "BinaryValue" else v for k, v in value.items()}
                for key, value in m["message_attributes"].items()
            },
        }
        for m in messages
    }


def test_every_fixture_was_written_by_the_release_its_readme_names() -> None:
    readme = (FIXTURES / "README.md").read_text(encoding="utf-8")
    for name in ARCHIVES:
        assert f"`{name}`" in readme and name.split("-", 1)[0] in readme, name
    # Bare members then, a header (redrive's gzip FEXTRA field) from e19b61e on.
    assert (FIXTURES / ARCHIVES[0]).read_bytes()[3] & 0x04 == 0
    assert (FIXTURES / ARCHIVES[2]).read_bytes()[3] & 0x04 == 0x04


@pytest.mark.parametrize("name", ARCHIVES)
def test_an_earlier_releases_archive_reads_as_archived_with_no_damage(name: str) -> None:
    path = str(FIXTURES / name)
    problems: list[str] = []
    records = list(read_records(path, on_problem=problems.append))
    assert problems == []
    expected = sent(name)
    assert [r.message_id for r in records] == list(expected)
    for record in records:
        assert record.body == expected[record.message_id]["body"]
        assert record.message_attributes == expected[record.message_id]["message_attributes"]
        assert record.redrive_receives is None  # not known then: never made up
        assert record.attributes["ApproximateReceiveCount"] == "1"
        assert record.dlq.endswith("/onion-checkout-dlq")
    assert [r.task_id for r in records] == ["task-before-protocol-2", "task-before-p1", None]
    check = check_archive(path, on_problem=problems.append)
    assert (check.records, check.damage, problems) == (3, None, [])


@pytest.mark.parametrize("name", ARCHIVES)
def test_an_earlier_releases_archive_replays_byte_identical_and_once(
    name: str, family: Family, cli: Cli, tmp_path: Path
) -> None:
    path = str(shutil.copy(FIXTURES / name, tmp_path / name))
    args = ("replay", path, "--to", "onion-checkout", "--include-unknown", "--json")
    inspected = json.loads(cli.raising("inspect", path, "--json").stdout)
    assert inspected["total"] == 3

    first = json.loads(cli.raising(*args, "--execute", "--yes").stdout)
    assert (first["matched"], first["replayed"], first["failed"], first["in_doubt"]) == (3, 3, 0, 0)
    expected = sent(name)
    arrived = family.drain(family.queue_url)
    assert sorted(m["Body"] for m in arrived) == sorted(m["body"] for m in expected.values())
    by_body = {m["body"]: m["message_attributes"] for m in expected.values()}
    for message in arrived:
        got = message.get("MessageAttributes", {})
        assert {k: v for k, v in got.items() if k not in OURS} == by_body[message["Body"]]

    again = json.loads(cli.raising(*args, "--execute", "--yes").stdout)
    assert (again["replayed"], again["already_sent"]) == (0, 3)
    assert family.drain(family.queue_url) == []


def test_a_cut_last_batch_of_a_headerless_archive_is_the_killed_writers_warning(
    tmp_path: Path,
) -> None:
    """Before the header, a killed purge left its last batch's member cut short: the batches
    before it read, the cut one is a warning, not damage."""
    whole = (FIXTURES / ARCHIVES[0]).read_bytes()
    path = tmp_path / "killed.jsonl.gz"
    path.write_bytes(whole + whole[: len(whole) // 2])
    problems: list[str] = []
    records = list(read_records(str(path), on_problem=problems.append))
    assert [r.message_id for r in records] == list(sent(ARCHIVES[0]))
    assert len(problems) == 1 and "check it is as long as the original" in problems[0]
    assert check_archive(str(path), on_problem=problems.append).damage is None
