"""Purge and archive: the DLQ's selected messages copied to an archive (durable first) and,
for purge, deleted; an unfiltered purge without an archive is the broker's purge of the
whole queue.

The package, by role: :mod:`.engine` (the options, the result and the run: receive,
archive, delete), :mod:`.processes` (what each process of ``--processes`` runs: an archive
part of its own) and :mod:`.entry` (the run here, or spread over processes). The
coordinator (:mod:`redrive.operations.coordinator`) is how a front end runs it.
"""

from redrive.operations.purge.engine import (
    S3_BUFFER,
    PurgeFate,
    PurgeOptions,
    PurgeResult,
    decide_purge,
    purge_dlq,
    purge_whole_queue,
    run_purge,
)

__all__ = [
    "S3_BUFFER",
    "PurgeFate",
    "PurgeOptions",
    "PurgeResult",
    "decide_purge",
    "purge_dlq",
    "purge_whole_queue",
    "run_purge",
]
