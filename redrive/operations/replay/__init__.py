"""Replay: an archive's selected messages sent to a queue, byte-identical, each task once
(the offline inspect of an archive is :mod:`redrive.inspection.archive`).

The package, by role: :mod:`.engine` (the archive as the move engine's message source, the
check of the whole archive first, the result), :mod:`.processes` (each process of
``--processes`` replays its share, split by task id) and :mod:`.entry` (the replay here, or
spread over processes). The coordinator (:mod:`redrive.operations.coordinator`) is how a
front end runs it.
"""

from redrive.operations.replay.engine import ReplayResult, replay_archive

__all__ = ["ReplayResult", "replay_archive"]
