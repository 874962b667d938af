"""Inspecting a DLQ: one scan that leaves it as it was (:mod:`~redrive.inspection.scan`), its
messages counted into groups by task or ``--group-by`` (:mod:`~redrive.inspection.groups`),
and when each group's messages were enqueued (:mod:`~redrive.inspection.timeline`).

Below both :mod:`redrive.operations` (whose coordinator runs an inspect) and
:mod:`redrive.reporting` (inspect, report, alerts); a ``--processes`` inspect runs on the
supervisor of :mod:`redrive.runs`, below them all, and an archive inspect reads its records
as a replay does (:mod:`redrive.archive`)."""
