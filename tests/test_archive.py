from __future__ import annotations

import base64
import errno
import gzip
import json
import os
import re
import stat
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import boto3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moto import mock_aws

from redrive.archive import (
    ARCHIVE_VERSION,
    ArchiveDamaged,
    ArchiveRecord,
    Damage,
    check_archive,
    default_archive_path,
    open_writer,
    read_records,
)
from redrive.broker.sqs.calls import ARCHIVED_ATTRIBUTES, delivery_of
from redrive.errors import ArchiveError

SQS_MAX_BYTES = 262_144
HEADER_SIZE = 49  # the archive's first gzip member: empty, with redrive's field
NOW = datetime(2026, 11, 30, 12, 34, 56, 789012, tzinfo=UTC)


def big_body() -> str:
    """A body just under SQS's limit, with characters JSON and UTF-8 both care about."""
    head = 'ação ✓ 漢字 🎉 \u2028\u2029 "quoted" \\back\\ \t\r\n\x00\x7f'
    filler = SQS_MAX_BYTES - 100 - len(head.encode("utf-8"))
    body = head + "x" * filler
    assert 262_000 < len(body.encode("utf-8")) <= SQS_MAX_BYTES
    return body


def make_record(n: int, *, body: str | None = None) -> ArchiveRecord:
    message = {
        "MessageId": f"msg-{n:04d}",
        "Body": body if body is not None else f'{{"n": {n}, "txt": "olá {n} — ✓"}}',
        "Attributes": {
            "SenderId": "AIDAEXAMPLE",
            "SentTimestamp": "1796009314870",
            "ApproximateReceiveCount": str(n + 1),
            "ApproximateFirstReceiveTimestamp": "1796009314872",
            "MessageGroupId": "user-5",
        },
        "MessageAttributes": {
            "raw": {"DataType": "Binary", "BinaryValue": bytes(range(256))},
            "zipped": {"DataType": "Binary.gzip", "BinaryValue": b"\x1f\x8b\x00\xff"},
            "kind": {"DataType": "String.custom", "StringValue": "ünï €"},
            "count": {"DataType": "Number.int", "StringValue": "0042"},
            "ratio": {"DataType": "Number", "StringValue": "1.50"},
        },
    }
    return ArchiveRecord.from_message(
        delivery_of({**message, "ReceiptHandle": "-"}),
        kept=ARCHIVED_ATTRIBUTES,
        task="apps.tasks.send_email",
        task_id=f"task-{n}" if n % 2 else None,
        dlq="https://sqs.us-east-1.amazonaws.com/123456789012/onion-dlq",
        run_id="run-abc",
        archived_at=NOW + timedelta(seconds=n),
    )


def records(count: int, start: int = 0) -> list[ArchiveRecord]:
    return [make_record(n) for n in range(start, start + count)]


# ---------------------------------------------------------------------------------------
# Record encoding
# ---------------------------------------------------------------------------------------


def test_from_message_keeps_only_the_archived_attributes() -> None:
    record = make_record(1)
    assert record.attributes == {
        "SentTimestamp": "1796009314870",
        "ApproximateReceiveCount": "2",
        "ApproximateFirstReceiveTimestamp": "1796009314872",
        "MessageGroupId": "user-5",
    }


def test_binary_attributes_are_base64_under_a_b64_key() -> None:
    record = make_record(1)
    encoded = record.to_json()
    assert encoded["v"] == ARCHIVE_VERSION
    assert encoded["archived_at"] == "2026-11-30T12:34:57.789012Z"
    assert encoded["message_attributes"]["zipped"] == {
        "DataType": "Binary.gzip",
        "BinaryValue_b64": base64.b64encode(b"\x1f\x8b\x00\xff").decode(),
    }
    assert encoded["message_attributes"]["kind"] == {
        "DataType": "String.custom",
        "StringValue": "ünï €",
    }
    decoded = ArchiveRecord.from_json(json.loads(json.dumps(encoded)))
    assert decoded == record
    assert decoded.message_attributes["raw"]["BinaryValue"] == bytes(range(256))


def test_binary_list_values_round_trip() -> None:
    value = {"DataType": "Binary", "BinaryListValues": [b"\x00", b""], "StringListValues": []}
    record = ArchiveRecord(
        message_id="m",
        body="b",
        message_attributes={"list": value},
        attributes={},
        task="t",
        task_id=None,
        dlq="q",
        archived_at=NOW,
        run_id="r",
    )
    assert ArchiveRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_naive_archived_at_is_rejected() -> None:
    with pytest.raises(ValueError):
        ArchiveRecord("m", "b", {}, {}, "t", None, "q", datetime(2026, 1, 1), "r")


# A high surrogate followed by a low one, as two code points: JSON's escape of that pair is the
# escape of the one character it encodes, so no JSON line can tell them apart. SQS bodies are
# Unicode text and never hold one (hypothesis 6.100, `make test-minimums`, drew one).
def _no_surrogate_pair(text: str) -> str:
    return re.sub("[\ud800-\udbff](?=[\udc00-\udfff])", "x", text)


@settings(max_examples=150, deadline=None)
# Lone surrogates included: SQS never sends them, but the encoding must not depend on that.
@given(
    body=st.text(st.characters() | st.characters(categories=["Cs"])).map(_no_surrogate_pair),
    blob=st.binary(),
    kind=st.text(min_size=1),
)
def test_any_body_and_binary_value_round_trip(body: str, blob: bytes, kind: str) -> None:
    record = ArchiveRecord(
        message_id="m",
        body=body,
        message_attributes={"b": {"DataType": f"Binary.{kind}", "BinaryValue": blob}},
        attributes={},
        task="t",
        task_id=None,
        dlq="q",
        archived_at=NOW,
        run_id="r",
    )
    line = json.dumps(record.to_json(), ensure_ascii=True)
    assert ArchiveRecord.from_json(json.loads(line)) == record


# ---------------------------------------------------------------------------------------
# Local files
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_local_round_trip_is_byte_identical(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / "new" / "deeper" / f"archive{suffix}"
    first = [*records(3), make_record(3, body=big_body())]
    second = records(2, start=10)
    with open_writer(str(path)) as writer:
        assert writer.location == str(path)
        writer.write_batch(first)
        writer.write_batch([])
        writer.write_batch(second)

    back = list(read_records(str(path)))
    assert back == first + second
    for got, want in zip(back, first + second, strict=True):
        assert got.body.encode("utf-8") == want.body.encode("utf-8")
        assert got.message_attributes == want.message_attributes
    assert back[3].body == big_body()

    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o700

    raw = gzip.decompress(path.read_bytes()) if suffix.endswith(".gz") else path.read_bytes()
    # ensure_ascii: the archive is plain ASCII however exotic the bodies are.
    assert raw.isascii()
    assert raw.count(b"\n") == len(first) + len(second)


def test_gzip_archive_is_one_member_per_batch_and_readable_by_stdlib(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.gz"
    with open_writer(str(path)) as writer:
        writer.write_batch(records(2))
        writer.write_batch(records(3, start=2))
    data = path.read_bytes()
    members = 0
    while data:
        decompressor = zlib.decompressobj(31)
        decompressor.decompress(data)
        assert decompressor.eof
        data = decompressor.unused_data
        members += 1
    # The archive's (empty) header member, then one per batch.
    assert members == 3
    assert gzip.decompress(path.read_bytes()[:HEADER_SIZE]) == b""
    with gzip.open(path, "rt", encoding="ascii") as handle:
        assert [json.loads(line)["message_id"] for line in handle] == [
            f"msg-{n:04d}" for n in range(5)
        ]


def test_chunk_records_splits_a_local_batch_into_members(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.gz"
    with open_writer(str(path), chunk_records=2) as writer:
        writer.write_batch(records(5))
    assert path.read_bytes().count(b"\x1f\x8b\x08") == 1 + 3  # the header, then the chunks
    assert list(read_records(str(path))) == records(5)


def test_refuses_to_overwrite_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(b"earlier run")
    with pytest.raises(ArchiveError, match="already exists"):
        open_writer(str(path))
    assert path.read_bytes() == b"earlier run"


def test_directory_destination_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="is a directory"):
        open_writer(str(tmp_path))


def test_permission_denied_is_an_archive_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open
    target = str(tmp_path / "a.jsonl")

    def deny(path: Any, flags: int, mode: int = 0o777, **kwargs: Any) -> int:
        if os.fspath(path) == target:
            raise PermissionError(errno.EACCES, "Permission denied", target)
        return real_open(path, flags, mode, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    with pytest.raises(ArchiveError, match="permission denied") as caught:
        open_writer(target)
    assert target in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_every_batch_is_fsynced_before_write_batch_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    path = tmp_path / f"a{suffix}"
    synced_sizes: list[int] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced_sizes.append(os.fstat(fd).st_size)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    with open_writer(str(path)) as writer:
        for batch in (records(2), records(3, start=2)):
            synced_sizes.clear()
            writer.write_batch(batch)
            size = path.stat().st_size
            # Synced after the last byte of this batch landed: nothing of it is left in flight.
            assert synced_sizes and synced_sizes[-1] == size


def test_disk_full_rolls_back_the_partial_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.jsonl.gz"
    writer = open_writer(str(path))
    try:
        writer.write_batch(records(2))
        durable_size = path.stat().st_size
        real_write = os.write
        calls = 0

        def fill_disk(fd: int, data: Any) -> int:
            nonlocal calls
            calls += 1
            if calls == 1:
                return real_write(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", fill_disk)
        with pytest.raises(ArchiveError, match="disk full") as caught:
            writer.write_batch(records(3, start=2))
        assert str(path) in str(caught.value)
        monkeypatch.setattr(os, "write", real_write)
        assert path.stat().st_size == durable_size
        with pytest.raises(ArchiveError, match="stopped accepting"):
            writer.write_batch(records(1, start=9))
    finally:
        writer.close()
    assert list(read_records(str(path))) == records(2)


def test_close_is_idempotent_and_closed_writer_refuses(tmp_path: Path) -> None:
    writer = open_writer(str(tmp_path / "a.jsonl"))
    writer.close()
    writer.close()
    with pytest.raises(ValueError):
        writer.write_batch(records(1))


def kill(writer: Any) -> None:
    """What SIGKILL leaves of a local writer: its file as it was, never closed or sealed."""
    os.close(writer._fd)
    writer._closed = True


def write_then_append(path: Path, tail: bytes, *, closed: bool = False) -> list[ArchiveRecord]:
    """Two batches, then ``tail``: by default as a writer killed mid-batch leaves the file."""
    written = records(2) + records(2, start=2)
    writer = open_writer(str(path))
    writer.write_batch(written[:2])
    writer.write_batch(written[2:])
    if closed:
        writer.close()
    else:
        kill(writer)
    with path.open("ab") as handle:
        handle.write(tail)
    return written


def gzip_member(batch: list[ArchiveRecord]) -> bytes:
    payload = b"".join(json.dumps(r.to_json()).encode() + b"\n" for r in batch)
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    return compressor.compress(payload) + compressor.flush()


@pytest.mark.parametrize("cut", [3, 0.5, -1], ids=["header-only", "half", "no-trailer"])
def test_killed_gzip_writer_leaves_every_earlier_batch_readable(tmp_path: Path, cut: float) -> None:
    path = tmp_path / "a.jsonl.gz"
    member = gzip_member(records(3, start=4))
    end = int(len(member) * cut) if isinstance(cut, float) else cut
    written = write_then_append(path, member[:end])

    problems: list[str] = []
    assert list(read_records(str(path), on_problem=problems.append)) == written
    assert len(problems) == 1
    assert "after 4 intact records" in problems[0] and str(path) in problems[0]

    # Without a callback the damage is an error, raised after the intact records.
    seen: list[ArchiveRecord] = []
    with pytest.raises(ArchiveError, match="incomplete"):
        for record in read_records(str(path)):
            seen.append(record)
    assert seen == written


def test_killed_plain_writer_leaves_every_earlier_line_readable(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    line = json.dumps(make_record(7).to_json()).encode()
    written = write_then_append(path, line[: len(line) // 2])
    problems: list[str] = []
    assert list(read_records(str(path), on_problem=problems.append)) == written
    assert len(problems) == 1 and "incomplete record at line 5" in problems[0]
    with pytest.raises(ArchiveError, match="incomplete record"):
        list(read_records(str(path)))


def test_complete_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "hand-edited.jsonl"
    lines = [json.dumps(r.to_json()) for r in records(2)]
    path.write_text("\n".join(lines) + "\n\n", encoding="ascii")
    path.write_text(path.read_text(encoding="ascii").rstrip("\n"), encoding="ascii")
    assert list(read_records(str(path))) == records(2)


def test_corrupt_middle_line_is_damage_skipped_only_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    good = [json.dumps(r.to_json()) for r in records(2)]
    path.write_text(f'{good[0]}\n{{"v": 1, "body": 3}}\nnot json\n{good[1]}\n', encoding="ascii")
    damage: list[Damage] = []
    assert list(read_records(str(path), on_damage=damage.append)) == records(2)
    assert [(d.line, d.records_read) for d in damage] == [(2, 1), (3, 1)]
    assert "missing" in damage[0].what and str(path) == damage[0].location
    # A record missing fields is damage, not a smaller archive.
    seen: list[ArchiveRecord] = []
    with pytest.raises(ArchiveDamaged, match="line 2"):
        seen.extend(read_records(str(path), on_problem=lambda problem: None))
    assert seen == records(1)


def test_newer_format_version_always_raises(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    future = make_record(1).to_json() | {"v": ARCHIVE_VERSION + 1}
    path.write_text(json.dumps(future) + "\n", encoding="ascii")
    with pytest.raises(ArchiveError, match="upgrade redrive"):
        list(read_records(str(path), on_problem=lambda problem: None))


def test_reading_a_renamed_gzip_archive_sniffs_the_format(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.gz"
    with open_writer(str(path)) as writer:
        writer.write_batch(records(2))
    renamed = path.rename(tmp_path / "renamed.jsonl")
    assert list(read_records(str(renamed))) == records(2)


def test_missing_local_archive_is_an_archive_error(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="no archive at"):
        list(read_records(str(tmp_path / "missing.jsonl.gz")))


def test_the_name_given_to_a_processes_run_reads_its_parts_as_one_archive(
    tmp_path: Path,
) -> None:
    """Issue 22: ``purge --processes 2 --archive pp.jsonl.gz`` writes pp.p1 and pp.p2;
    ``replay pp.jsonl.gz`` said ``no archive at``. The parts read in process order, each
    checked as the file it is, the whole check covering every one."""
    from redrive.archive.storage import archive_part, archive_parts

    named = str(tmp_path / "pp.jsonl.gz")
    for number, batch in ((1, records(3)), (2, records(4, start=3)), (10, records(1, start=7))):
        with open_writer(archive_part(named, number)) as writer:
            writer.write_batch(batch)
    (tmp_path / "pp.p2x.jsonl.gz").write_bytes(b"not a part")  # not a part's name
    assert [Path(p).name for p in archive_parts(named)] == [
        "pp.p1.jsonl.gz",
        "pp.p2.jsonl.gz",
        "pp.p10.jsonl.gz",
    ]
    assert list(read_records(named)) == records(8)
    check = check_archive(named)
    assert (check.records, check.damage) == (8, None)
    # A part cut short is damage, named by its own file.
    part = tmp_path / "pp.p2.jsonl.gz"
    part.write_bytes(part.read_bytes()[:-7])
    damaged = check_archive(named).damage
    assert damaged is not None and damaged.first.location == str(part)


def test_neither_an_archive_nor_its_parts_is_one_line_naming_both(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError) as raised:
        list(read_records(str(tmp_path / "pp.jsonl.gz")))
    assert "no archive at" in str(raised.value) and "pp.p1.jsonl.gz" in str(raised.value)


def test_unsupported_scheme_is_rejected() -> None:
    with pytest.raises(ArchiveError, match="unsupported scheme"):
        open_writer("gs://bucket/prefix")
    with pytest.raises(ArchiveError, match="unsupported scheme"):
        list(read_records("https://example.com/a.jsonl"))


def test_default_archive_path() -> None:
    plus_two = datetime(2026, 11, 30, 14, 5, 6, tzinfo=timezone(timedelta(hours=2)))
    assert default_archive_path("onion", plus_two) == (
        "./redrive-archive/onion-20261130T120506Z.jsonl.gz"
    )
    assert default_archive_path("../a b", NOW).startswith("./redrive-archive/.._a_b-")
    with pytest.raises(ValueError):
        default_archive_path("onion", datetime(2026, 11, 30))


# ---------------------------------------------------------------------------------------
# S3
# ---------------------------------------------------------------------------------------


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="archive-bucket")
        yield client


def keys_under(s3: Any, prefix: str) -> list[str]:
    listing = s3.list_objects_v2(Bucket="archive-bucket", Prefix=prefix)
    return [obj["Key"] for obj in listing.get("Contents", [])]


def test_s3_round_trip_one_object_per_chunk_and_nothing_buffered(s3: Any) -> None:
    first = [*records(4), make_record(4, body=big_body())]
    with open_writer(
        "s3://archive-bucket/archives/",
        s3_client_factory=lambda: s3,
        chunk_records=2,
        run_name="r1",
    ) as writer:
        assert writer.location == "s3://archive-bucket/archives/r1/"
        writer.write_batch(first)
        # Durable on return: every record of the batch is already in an object.
        assert keys_under(s3, "archives/r1/") == [
            f"archives/r1/part-{n:06d}.jsonl.gz" for n in (1, 2, 3)
        ]
        writer.write_batch([])
        writer.write_batch(records(1, start=10))
        assert len(keys_under(s3, "archives/r1/")) == 4

    per_object = [
        list(read_records(f"s3://archive-bucket/{key}", s3_client_factory=lambda: s3))
        for key in keys_under(s3, "archives/r1/")
    ]
    # Part 0, put when the writer closed, is the run's header: it holds no record.
    assert [len(chunk) for chunk in per_object] == [0, 2, 2, 1, 1]

    back = list(read_records(writer.location, s3_client_factory=lambda: s3))
    assert back == [*first, *records(1, start=10)]
    assert back[4].body.encode("utf-8") == big_body().encode("utf-8")
    assert back[0].message_attributes["raw"]["BinaryValue"] == bytes(range(256))
    # The parent prefix (without its slash) reads the same run.
    assert list(read_records("s3://archive-bucket/archives", s3_client_factory=lambda: s3)) == back


@pytest.mark.parametrize(
    ("destination", "location"),
    [
        ("s3://archive-bucket", "s3://archive-bucket/r/"),
        ("s3://archive-bucket/", "s3://archive-bucket/r/"),
        ("s3://archive-bucket/a/b", "s3://archive-bucket/a/b/r/"),
        ("s3://archive-bucket/a/b/", "s3://archive-bucket/a/b/r/"),
    ],
)
def test_s3_prefix_forms(s3: Any, destination: str, location: str) -> None:
    with open_writer(destination, s3_client_factory=lambda: s3, run_name="r") as writer:
        writer.write_batch(records(1))
    assert writer.location == location
    assert list(read_records(location, s3_client_factory=lambda: s3)) == records(1)


def test_s3_default_run_name_is_a_timestamp(s3: Any) -> None:
    with open_writer("s3://archive-bucket/x", s3_client_factory=lambda: s3) as writer:
        run = writer.location.removeprefix("s3://archive-bucket/x/").rstrip("/")
    assert len(run) == len("20261130T123456Z-0123abcd") and run[8] == "T" and run[15] == "Z"


def test_s3_prefix_is_read_in_numeric_order_and_only_archive_objects(s3: Any) -> None:
    # Lexically part-1000000 would come before part-999999.
    for n in (10, 2, 1, 1_000_000, 999_999):
        s3.put_object(
            Bucket="archive-bucket",
            Key=f"runs/abc/part-{n:06d}.jsonl.gz",
            Body=gzip_member([make_record(n)]),
        )
    s3.put_object(Bucket="archive-bucket", Key="runs/abc/README.txt", Body=b"not an archive")
    s3.put_object(
        Bucket="archive-bucket",
        Key="runs/abcdef/part-000001.jsonl.gz",
        Body=gzip_member(records(1)),
    )
    got = read_records("s3://archive-bucket/runs/abc", s3_client_factory=lambda: s3)
    assert [r.message_id for r in got] == [
        "msg-0001",
        "msg-0002",
        "msg-0010",
        "msg-999999",
        "msg-1000000",
    ]


def test_s3_damaged_object_is_damage_and_the_next_one_read(s3: Any) -> None:
    # An S3 object is one PutObject: cut short, it was damaged, never a writer killed.
    s3.put_object(
        Bucket="archive-bucket", Key="r/part-000001.jsonl.gz", Body=gzip_member(records(1))[:-4]
    )
    s3.put_object(
        Bucket="archive-bucket", Key="r/part-000002.jsonl.gz", Body=gzip_member(records(1, 1))
    )
    damage: list[Damage] = []
    got = list(
        read_records("s3://archive-bucket/r", s3_client_factory=lambda: s3, on_damage=damage.append)
    )
    assert got == records(1, 1)
    assert [d.location for d in damage] == ["s3://archive-bucket/r/part-000001.jsonl.gz"]
    assert "written in one piece" in damage[0].what
    with pytest.raises(ArchiveDamaged, match="part-000001"):
        list(read_records("s3://archive-bucket/r", s3_client_factory=lambda: s3))


def test_s3_missing_bucket_is_an_archive_error(s3: Any) -> None:
    with pytest.raises(ArchiveError, match="does not exist") as caught:
        open_writer("s3://no-such-bucket/p", s3_client_factory=lambda: s3)
    assert "no-such-bucket" in str(caught.value)
    with pytest.raises(ArchiveError, match="does not exist"):
        list(read_records("s3://no-such-bucket/p", s3_client_factory=lambda: s3))


def test_s3_put_failure_is_an_archive_error_and_stops_the_writer(s3: Any) -> None:
    s3.create_bucket(Bucket="short-lived")
    writer = open_writer("s3://short-lived/p", s3_client_factory=lambda: s3, run_name="r")
    s3.delete_bucket(Bucket="short-lived")
    with pytest.raises(ArchiveError, match="does not exist"):
        writer.write_batch(records(1))
    with pytest.raises(ArchiveError, match="stopped accepting"):
        writer.write_batch(records(1))
    writer.close()


def test_s3_refuses_to_write_into_an_existing_run(s3: Any) -> None:
    s3.put_object(Bucket="archive-bucket", Key="p/r/part-000001.jsonl.gz", Body=b"x")
    with pytest.raises(ArchiveError, match="already has objects"):
        open_writer("s3://archive-bucket/p", s3_client_factory=lambda: s3, run_name="r")


def test_s3_empty_prefix_and_object_like_destination(s3: Any) -> None:
    with pytest.raises(ArchiveError, match="no archive objects"):
        list(read_records("s3://archive-bucket/nothing", s3_client_factory=lambda: s3))
    with pytest.raises(ArchiveError, match="names an object"):
        open_writer("s3://archive-bucket/a/out.jsonl.gz", s3_client_factory=lambda: s3)
    with pytest.raises(ArchiveError, match="no archive object at"):
        list(read_records("s3://archive-bucket/a/out.jsonl.gz", s3_client_factory=lambda: s3))


def test_lone_surrogates_survive_a_file_round_trip(tmp_path: Path) -> None:
    # SQS never sends these, but the ASCII-only encoding must not depend on that.
    record = ArchiveRecord("m", "\ud800 x \udfff", {}, {}, "t", None, "q", NOW, "r")
    path = tmp_path / "a.jsonl.gz"
    with open_writer(str(path)) as writer:
        writer.write_batch([record])
    assert list(read_records(str(path))) == [record]


@pytest.mark.parametrize("closed", [False, True], ids=["killed-writer", "closed-writer"])
def test_corrupt_gzip_data_is_damage_unlike_an_unfinished_tail(
    tmp_path: Path, closed: bool
) -> None:
    path = tmp_path / "a.jsonl.gz"
    written = write_then_append(path, b"\x1f\x8b\x08\x00garbage-not-deflate", closed=closed)
    problems: list[str] = []
    damage: list[Damage] = []
    got = list(read_records(str(path), on_problem=problems.append, on_damage=damage.append))
    assert got == written and problems == []
    assert len(damage) == 1 and damage[0].what.startswith("corrupt gzip data")
    assert (damage[0].records_read, damage[0].member) == (4, 4)


def test_a_file_in_the_way_of_the_parent_directory(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("x", encoding="ascii")
    with pytest.raises(ArchiveError, match="a file is in the way"):
        open_writer(str(tmp_path / "blocker" / "sub" / "a.jsonl.gz"))


# -- damage, told from a writer killed mid-batch ---------------------------------------------


def members_of(data: bytes) -> list[bytes]:
    """The raw gzip members of an archive, its header first."""
    found = []
    while data:
        decompressor = zlib.decompressobj(31)
        decompressor.decompress(data)
        assert decompressor.eof
        size = len(data) - len(decompressor.unused_data)
        found.append(data[:size])
        data = data[size:]
    return found


def closed_archive(path: Path, *, batches: int = 4, per_batch: int = 10) -> list[ArchiveRecord]:
    written = records(batches * per_batch)
    with open_writer(str(path)) as writer:
        for start in range(0, len(written), per_batch):
            writer.write_batch(written[start : start + per_batch])
    return written


def damage_of(path: Path) -> tuple[list[ArchiveRecord], list[Damage], list[str]]:
    damage: list[Damage] = []
    problems: list[str] = []
    got = list(read_records(str(path), on_problem=problems.append, on_damage=damage.append))
    return got, damage, problems


@pytest.mark.parametrize(
    "content",
    [b"hello, this is not an archive\n", b"\x00\x01binary junk without a newline", b"{}\n"],
    ids=["text", "binary", "json-not-a-record"],
)
def test_a_file_that_is_not_gzip_is_damage_not_an_empty_archive(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "fake.jsonl.gz"
    path.write_bytes(content)
    with pytest.raises(ArchiveDamaged) as caught:
        list(read_records(str(path), on_problem=lambda problem: None))
    report = caught.value.report
    assert (report.first.location, report.first.line, report.first.records_read) == (
        str(path),
        1,
        0,
    )
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and "damaged at line 1" in message
    if content != b"{}\n":
        assert "not gzip" in report.first.what
    check = check_archive(str(path), on_problem=lambda problem: None)
    assert check.records == 0 and check.damage is not None


@pytest.mark.parametrize(
    ("cut_in", "where"),
    [(2, "middle of a member that is not the last"), (1, "right after the first member")],
)
def test_a_truncated_copy_is_damage_with_how_many_records_were_read(
    tmp_path: Path, cut_in: int, where: str
) -> None:
    original = tmp_path / "a.jsonl.gz"
    written = closed_archive(original)
    members = members_of(original.read_bytes())
    assert len(members) == 1 + 4
    # Member 0 is the header; cut inside member ``cut_in`` + 1, or right after ``cut_in``.
    kept = b"".join(members[: cut_in + 1])
    if where.startswith("middle"):
        kept += members[cut_in + 1][: len(members[cut_in + 1]) // 2]
    copy = tmp_path / "copy.jsonl.gz"
    copy.write_bytes(kept)

    got, damage, problems = damage_of(copy)
    assert got == written[: cut_in * 10] and problems == []
    assert len(damage) == 1 and damage[0].records_read == cut_in * 10
    assert "cut short" in damage[0].what and "40 record(s)" in damage[0].what
    check = check_archive(str(copy))
    assert check.damage is not None
    assert (check.damage.readable, check.damage.expected) == (cut_in * 10, 40)
    # Not the killed-writer warning that blamed a writer stopped mid-batch.
    assert "mid-batch" not in check.damage.describe()


def test_a_truncation_inside_the_last_member_of_a_closed_archive_is_damage(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.jsonl.gz"
    written = closed_archive(path)
    path.write_bytes(path.read_bytes()[:-20])
    got, damage, problems = damage_of(path)
    assert got == written[:30] and problems == []
    assert [(d.member, d.records_read, d.records_lost) for d in damage] == [(5, 30, 10)]


@pytest.mark.parametrize("place", ["deflate data", "crc trailer", "redrive field"])
def test_one_flipped_byte_is_damage_and_the_rest_still_reads(tmp_path: Path, place: str) -> None:
    path = tmp_path / "a.jsonl.gz"
    written = closed_archive(path)
    members = members_of(path.read_bytes())
    start = sum(len(m) for m in members[:2])  # the second batch's member
    offset = {"deflate data": 60, "crc trailer": len(members[2]) - 6, "redrive field": 20}[place]
    data = bytearray(path.read_bytes())
    data[start + offset] ^= 0x10
    path.write_bytes(bytes(data))

    with pytest.raises(ArchiveDamaged, match="gzip member 3"):
        list(read_records(str(path)))
    got, damage, _ = damage_of(path)
    assert damage[0].records_read == 10 and damage[0].member == 3 and damage[0].offset == start
    if place == "redrive field":
        # The data is intact; only the field is not: its records still read.
        assert "fails its CRC" in damage[0].what and got == written
    else:
        assert "corrupt gzip data" in damage[0].what and damage[0].records_lost == 10
        assert got == written[:10] + written[20:]
    check = check_archive(str(path))
    assert check.damage is not None and check.damage.expected == 40


def test_a_missing_member_in_the_middle_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.gz"
    written = closed_archive(path)
    members = members_of(path.read_bytes())
    path.write_bytes(b"".join(members[:2] + members[3:]))
    got, damage, _ = damage_of(path)
    assert got == written[:10] + written[20:]
    assert len(damage) == 1 and "#2" in damage[0].what and "missing" in damage[0].what


def test_garbage_between_members_is_damage_and_reading_resumes_after_it(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.gz"
    written = closed_archive(path)
    members = members_of(path.read_bytes())
    # Garbage holding a false gzip magic, which must be passed over.
    junk = b"junk \x1f\x8b\x08 more junk" * 20
    path.write_bytes(b"".join(members[:2]) + junk + b"".join(members[2:]))
    got, damage, _ = damage_of(path)
    assert got == written
    assert len(damage) == 1 and "not gzip data" in damage[0].what
    assert damage[0].offset == len(members[0]) + len(members[1])


def test_a_killed_writer_stays_readable_a_warning_not_damage(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.gz"
    written = records(4)
    writer = open_writer(str(path))
    writer.write_batch(written[:2])
    writer.write_batch(written[2:])
    unfinished = gzip_member(records(3, start=4))
    kill(writer)
    with path.open("ab") as handle:
        handle.write(unfinished[: len(unfinished) // 2])
    got, damage, problems = damage_of(path)
    assert got == written and damage == []
    assert len(problems) == 1 and "stopped mid-batch" in problems[0]
    check = check_archive(str(path), on_problem=lambda problem: None)
    assert (check.records, check.damage) == (4, None)


def test_an_archive_from_before_the_header_reads_and_its_cut_tail_is_a_warning(
    tmp_path: Path,
) -> None:
    # Earlier redrive wrote bare members: no header, no numbers.
    path = tmp_path / "old.jsonl.gz"
    tail = gzip_member(records(2, start=5))
    path.write_bytes(gzip_member(records(3)) + gzip_member(records(2, start=3)) + tail[:30])
    got, damage, problems = damage_of(path)
    assert got == records(5) and damage == []
    assert len(problems) == 1 and "check it is as long as the original" in problems[0]
    assert check_archive(str(path), on_problem=lambda problem: None).damage is None


def test_the_header_is_open_while_writing_and_sealed_with_the_counts(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.gz"
    writer = open_writer(str(path), chunk_records=3)
    writer.write_batch(records(5))
    open_header = path.read_bytes()[:HEADER_SIZE]
    writer.close()
    sealed = path.read_bytes()
    assert len(members_of(sealed)[0]) == HEADER_SIZE and sealed[:HEADER_SIZE] != open_header
    # Sealing rewrites the header's field only; every byte after it is as it was.
    assert sum(a != b for a, b in zip(open_header, sealed[:HEADER_SIZE], strict=True)) <= 8
    # Readable by any gzip reader, the header included.
    assert gzip.decompress(sealed).count(b"\n") == 5
    # Concatenated archives read as two, each checked against its own header.
    both = tmp_path / "both.jsonl.gz"
    both.write_bytes(sealed + sealed)
    assert list(read_records(str(both))) == records(5) + records(5)
    both.write_bytes(sealed + sealed[:-10])
    with pytest.raises(ArchiveDamaged, match="cut short"):
        list(read_records(str(both)))


def test_a_writer_that_fails_to_roll_back_leaves_its_archive_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.jsonl.gz"
    writer: Any = open_writer(str(path))
    writer.write_batch(records(2))
    monkeypatch.setattr(writer, "_roll_back", lambda: None)
    real_write = os.write

    def half_then_full(fd: int, data: Any) -> int:
        real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(ArchiveError, match="disk full"):
        writer.write_batch(records(3, start=2))
    monkeypatch.setattr(os, "write", real_write)
    writer.close()
    # Sealed, the tail would read as damage; open, it is the unfinished batch it is.
    got, damage, problems = damage_of(path)
    assert got == records(2) and damage == [] and len(problems) == 1


def test_s3_sealed_run_missing_a_part_or_its_last_parts_is_damage(s3: Any) -> None:
    with open_writer(
        "s3://archive-bucket/p", s3_client_factory=lambda: s3, chunk_records=2, run_name="r"
    ) as writer:
        writer.write_batch(records(7))
    uri = "s3://archive-bucket/p/r/"
    assert keys_under(s3, "p/r/")[0] == "p/r/part-000000.jsonl.gz"
    assert list(read_records(uri, s3_client_factory=lambda: s3)) == records(7)

    s3.delete_object(Bucket="archive-bucket", Key="p/r/part-000004.jsonl.gz")
    damage: list[Damage] = []
    got = list(read_records(uri, s3_client_factory=lambda: s3, on_damage=damage.append))
    assert got == records(6)
    assert len(damage) == 1 and damage[0].location == uri and "cut short" in damage[0].what
    assert "7 record(s) in 4 part(s)" in damage[0].what

    s3.delete_object(Bucket="archive-bucket", Key="p/r/part-000002.jsonl.gz")
    damage.clear()
    got = list(read_records(uri, s3_client_factory=lambda: s3, on_damage=damage.append))
    assert got == records(2) + records(2, start=4)
    assert "#2" in damage[0].what and damage[0].location.endswith("part-000003.jsonl.gz")


def test_s3_run_of_a_killed_writer_reads_whole(s3: Any) -> None:
    # Killed: never closed, so no part 0; every part it put is whole.
    writer = open_writer(
        "s3://archive-bucket/p", s3_client_factory=lambda: s3, chunk_records=2, run_name="k"
    )
    writer.write_batch(records(5))
    assert "p/k/part-000000.jsonl.gz" not in keys_under(s3, "p/k/")
    check = check_archive("s3://archive-bucket/p/k", s3_client_factory=lambda: s3)
    assert (check.records, check.damage) == (5, None)


def test_s3_flipped_byte_names_the_object_and_the_rest_reads(s3: Any) -> None:
    with open_writer(
        "s3://archive-bucket/p", s3_client_factory=lambda: s3, chunk_records=3, run_name="f"
    ) as writer:
        writer.write_batch(records(9))
    key = "p/f/part-000002.jsonl.gz"
    body = bytearray(s3.get_object(Bucket="archive-bucket", Key=key)["Body"].read())
    body[-7] ^= 0x01  # in the CRC32 trailer
    s3.put_object(Bucket="archive-bucket", Key=key, Body=bytes(body))
    check = check_archive("s3://archive-bucket/p/f", s3_client_factory=lambda: s3)
    assert check.records == 6 and check.damage is not None
    first = check.damage.first
    assert first.location == f"s3://archive-bucket/{key}" and "incorrect data check" in first.what
    assert (first.records_read, first.records_lost, check.damage.expected) == (3, 3, 9)
    assert f"s3://archive-bucket/{key}" in check.damage.describe()


def test_an_archive_missing_its_start_is_damage(tmp_path: Path, s3: Any) -> None:
    path = tmp_path / "a.jsonl.gz"
    written = closed_archive(path)
    members = members_of(path.read_bytes())
    tail_only = tmp_path / "tail.jsonl.gz"
    tail_only.write_bytes(b"".join(members[3:]))  # no header, batches 1 and 2 gone
    got, damage, _ = damage_of(tail_only)
    assert got == written[20:] and len(damage) == 1 and "#1-#2" in damage[0].what

    # An unclosed S3 run (no part 0) whose first parts are gone.
    writer = open_writer(
        "s3://archive-bucket/p", s3_client_factory=lambda: s3, chunk_records=2, run_name="u"
    )
    writer.write_batch(records(6))
    s3.delete_object(Bucket="archive-bucket", Key="p/u/part-000001.jsonl.gz")
    check = check_archive("s3://archive-bucket/p/u", s3_client_factory=lambda: s3)
    assert check.records == 4 and check.damage is not None and "#1" in check.damage.first.what
    # One part read on its own is not a run: nothing is missing from it.
    single = "s3://archive-bucket/p/u/part-000003.jsonl.gz"
    assert check_archive(single, s3_client_factory=lambda: s3).damage is None


def test_a_zero_byte_gzip_archive_is_damage_not_an_empty_archive(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl.gz"
    path.write_bytes(b"")
    with pytest.raises(ArchiveDamaged) as caught:
        list(read_records(str(path), on_problem=lambda problem: None))
    assert "empty (0 bytes)" in caught.value.report.first.what
    check = check_archive(str(path), on_problem=lambda problem: None)
    assert check.records == 0 and check.damage is not None
