"""Inspecting a DLQ: one scan that leaves it as it was (:mod:`~redrive.inspection.scan`), its
messages counted into groups by task or ``--group-by`` (:mod:`~redrive.inspection.groups`),
and when each group's messages were enqueued (:mod:`~redrive.inspection.timeline`).

Below both :mod:`redrive.operations` (a ``--processes`` inspect scans in its children and
merges their groups; archive inspect groups a replay's records) and :mod:`redrive.reporting`
(inspect, report, alerts): neither imports the other for these."""
