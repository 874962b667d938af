"""A local SQS (moto's server on loopback) with the layout's queues and DLQs full of Celery tasks.

A newcomer tries every redrive command against it without an AWS account; tests and
runbooks rehearse on it. Each DLQ holds what SQS leaves there: messages sent to the source
queue and received ``maxReceiveCount`` times (their ApproximateReceiveCount carries on in the
DLQ), enqueued at times that tell the stories the runbooks diagnose (a deploy blip, an
outage, a poison task; see :data:`STORIES`). The server runs moto with the sandbox's
extensions (:mod:`redrive.sandbox.moto_sqs`: no depth-proportional costs, message move tasks).

Modules: :mod:`~redrive.sandbox.server` (moto on loopback, its environment and clients),
:mod:`~redrive.sandbox.seeding` (queues and sample DLQs), :mod:`~redrive.sandbox.rehearsal`
(a seeded sandbox with a state directory, served until stopped),
:mod:`~redrive.sandbox.encoder` (Celery message bodies), :mod:`~redrive.sandbox.moto_sqs`
and :mod:`~redrive.sandbox.move_tasks` (the extensions of moto).

Every start seeds fresh task ids (a random seed unless one is given) and gets a fresh state
directory for the ledger and audit trail, which the printed ``export`` lines name
(``REDRIVE_STATE_DIR``): a rehearsal never meets an earlier rehearsal's ledger, and never
lands in the user's real one.

moto keeps its state in module globals, so every server started in one process (and any
``mock_aws`` in that process) shares the same queues.

``python -m redrive.sandbox --bare --port N [--serial]`` runs an empty server of stock moto
(no extensions) until SIGTERM or SIGINT (the test suite runs it as a subprocess); without
``--bare`` it seeds a layout and prints the ``export`` lines, like ``redrive sandbox``.
"""

from __future__ import annotations

from redrive.sandbox.rehearsal import (
    new_state_dir,
    random_seed,
    remove_state_dir,
    run,
    seeded_lines,
)
from redrive.sandbox.seeding import (
    MAX_MESSAGES,
    STORIES,
    SampleMessage,
    SeededFamily,
    Story,
    create_layout,
    dead_letter,
    sample_dlq,
    sample_messages,
    seed,
)
from redrive.sandbox.server import (
    ACCESS_KEY_ID,
    REGION,
    SECRET_ACCESS_KEY,
    SandboxServer,
    client_for,
    export_lines,
    sandbox_env,
    server_at,
    start_server,
)

__all__ = [
    "ACCESS_KEY_ID",
    "MAX_MESSAGES",
    "REGION",
    "SECRET_ACCESS_KEY",
    "STORIES",
    "SampleMessage",
    "SandboxServer",
    "SeededFamily",
    "Story",
    "client_for",
    "create_layout",
    "dead_letter",
    "export_lines",
    "new_state_dir",
    "random_seed",
    "remove_state_dir",
    "run",
    "sample_dlq",
    "sample_messages",
    "sandbox_env",
    "seed",
    "seeded_lines",
    "server_at",
    "start_server",
]
