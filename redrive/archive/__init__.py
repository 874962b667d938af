"""Archives of drained messages: JSON Lines on local disk or in S3, read back for replay.

Format (version 1)
------------------
One JSON object per line, UTF-8 (in practice pure ASCII, see below), ``\\n``-terminated::

    {"v": 1, "message_id": ..., "task": ..., "task_id": ... | null, "dlq": <queue URL>,
     "run_id": ..., "archived_at": "2026-11-30T12:00:00.000000Z",
     "attributes": {<the broker's own facts it archives (SQS: ARCHIVED_ATTRIBUTES)>},
     "message_attributes": {<MessageAttributes exactly as the AWS client returned them>},
     "body": <the exact SQS Body string>}

* Lines are written with ``ensure_ascii=True``: every non-ASCII character is a ``\\uXXXX``
  escape, so the file has no encoding ambiguity and any Python string (even one SQS would
  never send) survives byte-for-byte.
* Binary message attributes: the AWS client hands back ``bytes`` under ``BinaryValue``
  (and ``BinaryListValues``), which JSON cannot hold.  They are stored under the key with a
  ``_b64`` suffix as standard base64 (RFC 4648, with padding)::

      {"DataType": "Binary.gzip", "BinaryValue_b64": "AP8="}      <- b"\\x00\\xff"
      {"DataType": "Binary", "BinaryListValues_b64": ["AA==", ""]}

  Every other key (``DataType`` with its custom suffix, ``StringValue``,
  ``StringListValues``) is stored unchanged, so the decoded dict equals what the AWS client
  returned.
* Readers ignore fields they do not know (later v1 writers may add some) and refuse
  records with a newer ``v``.

Files and objects
-----------------
* A name ending in ``.gz`` is gzip: each ``write_batch`` appends its own gzip member (at
  most ``chunk_records`` records each).  Concatenated members are one valid gzip stream, so
  ``gzip -dc`` / ``zcat`` read the whole file, and a writer killed mid-batch leaves every
  earlier member intact.
* The first member of a gzip file is its header: empty, with redrive's field (below) saying
  "open" while the writer runs; ``close`` rewrites it in place (same size) as "closed" with
  the number of records and batch members written.  A writer that did not close (killed)
  leaves it open.
* S3 destinations are prefixes: each ``write_batch`` puts one object per ``chunk_records``
  records under ``{prefix}/{run_name}/part-{n:06d}.jsonl.gz`` and returns only after every
  put succeeded.  Nothing is buffered across calls (a batch must be durable when the call
  returns), so callers writing to S3 should pass batches of hundreds of messages rather than
  SQS's 10, or the run leaves one small object per receive.  ``close`` puts
  ``part-000000.jsonl.gz``: the run's closed header, listed first though written last (so a
  copy of the run cut short still has it).  It is the only object that holds no record.

Redrive's gzip field
--------------------
Every member redrive writes carries an RFC 1952 extra field (FEXTRA), subfield ``RD``, that
every gzip reader skips.  Its data is big-endian, ending in a CRC32 of the bytes before it:

* header: ``"H"``, version 1, closed (0/1), records (u64), batch members (u64), CRC32;
* batch member: ``"M"``, version 1, number (u64, 1 for the writer's first), records (u32),
  CRC32.  S3 part N holds member N.

What a reader can tell (:class:`ArchiveReader`)
-----------------------------------------------
A writer killed mid-batch leaves at most one unfinished member (or line) at the end of a
local file, after complete ones, under an open header (or none, before headers existed):
a warning, since that batch was never acknowledged and its messages never deleted.  Anything
else is damage: not gzip nor records, a member failing its CRC or length check, bytes between
members, a member missing (numbers jump), a line that is not a record, an S3 object cut short
(each is one PutObject), and a file or run ending before what its closed header counts.  A
copy cut short inside the last member of a file whose writer never closed cannot be told from
the kill itself; once closed, every cut is damage.

Durability contract: when ``write_batch`` returns, its records survive a crash (local: data
written and ``fsync``-ed; S3: ``PutObject`` succeeded).  The archive may therefore hold
records whose messages were never deleted (the run stopped between archiving and deleting),
never the reverse.
"""

from __future__ import annotations

from redrive.archive.reader import (
    ArchiveCheck,
    ArchiveDamaged,
    ArchiveReader,
    Damage,
    DamageReport,
    check_archive,
    read_records,
)
from redrive.archive.record import ARCHIVE_VERSION, ArchiveRecord, as_message
from redrive.archive.storage import archive_label
from redrive.archive.writer import (
    ArchiveWriter,
    LocalArchiveWriter,
    S3ArchiveWriter,
    default_archive_path,
    open_writer,
)

__all__ = [
    "ARCHIVE_VERSION",
    "ArchiveCheck",
    "ArchiveDamaged",
    "ArchiveReader",
    "ArchiveRecord",
    "ArchiveWriter",
    "Damage",
    "DamageReport",
    "LocalArchiveWriter",
    "S3ArchiveWriter",
    "archive_label",
    "as_message",
    "check_archive",
    "default_archive_path",
    "open_writer",
    "read_records",
]
