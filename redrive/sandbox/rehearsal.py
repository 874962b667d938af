"""One rehearsal: a seeded sandbox with a fresh state directory (ledger, audit trail), served
until stopped, and what a person reads when it is ready."""

from __future__ import annotations

import secrets
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from redrive.broker.base import queue_name
from redrive.config import Layout
from redrive.sandbox.results import write_results
from redrive.sandbox.seeding import STORIES, SeededFamily
from redrive.sandbox.seeding import seed as seed_layout
from redrive.sandbox.server import SandboxServer, client_for, start_server

_STATE_MARKER: Final = "REDRIVE-SANDBOX-STATE"


# -- state ------------------------------------------------------------------------------------


def random_seed() -> int:
    """A fresh seed for a sandbox's tasks (task ids, arguments, enqueue times)."""
    return secrets.randbits(32)


def new_state_dir(port: int, *, root: Path | None = None, now: datetime | None = None) -> Path:
    """A fresh directory for a sandbox's ledger and audit trail, named after its port and
    start time (``redrive-sandbox-PORT-YYYYmmdd-HHMMSS-XXXXXXXX`` in ``root``, by default
    the temporary directory), private to the user, with a note saying what it is."""
    moment = now if now is not None else datetime.now(UTC)
    stamp = moment.strftime("%Y%m%d-%H%M%S")
    path = Path(tempfile.mkdtemp(prefix=f"redrive-sandbox-{port}-{stamp}-", dir=root))
    (path / _STATE_MARKER).write_text(
        f"The state of the redrive sandbox on port {port}, started {stamp} UTC: the ledger\n"
        "and audit trail of what was done to it. That sandbox removes this directory when it\n"
        "stops, unless it was started with --keep-state.\n",
        encoding="utf-8",
    )
    return path


def remove_state_dir(path: Path) -> bool:
    """Remove a directory :func:`new_state_dir` made; False (and nothing removed) when
    ``path`` is not one any more (a link, a file, no note) or cannot be removed."""
    if path.is_symlink() or not path.is_dir() or not (path / _STATE_MARKER).is_file():
        return False
    try:
        shutil.rmtree(path)
    except OSError:
        return False
    return True


# -- running it -----------------------------------------------------------------------------


def run(
    port: int,
    layout: Layout,
    *,
    per_family: int,
    host: str = "127.0.0.1",
    serial: bool = False,
    seed: int | None = None,
    keep_state: bool = False,
    state_root: Path | None = None,
    on_ready: Callable[[SandboxServer, list[SeededFamily]], None],
    stop: threading.Event,
) -> Path | None:
    """Serve a seeded sandbox until ``stop`` is set; ``on_ready`` runs once it is seeded.

    Its tasks come from ``seed`` (a fresh random one when None: new task ids at every start);
    its state directory is new (:func:`new_state_dir` in ``state_root``; the server's
    ``state_dir``), and removed when it stops unless ``keep_state``. Returns the state
    directory when it is left behind, else None.
    """
    chosen = random_seed() if seed is None else seed
    with start_server(port, host=host, serial=serial) as server:
        state_dir = new_state_dir(server.port, root=state_root)
        server.state_dir, server.seed = state_dir, chosen
        try:
            client = client_for(server)
            try:
                seeded = seed_layout(client, layout, per_family=per_family, seed=chosen)
            finally:
                client.close()
            server.result_backend = write_results(
                state_dir / "results.sqlite3", layout, per_family=per_family, seed=chosen
            )
            on_ready(server, seeded)
            # A timeout keeps the main thread responsive to signals on every platform.
            while not stop.wait(0.5):
                pass
        finally:
            kept = keep_state or not remove_state_dir(state_dir)
    return state_dir if kept else None


def seeded_lines(server: SandboxServer, seeded: Sequence[SeededFamily]) -> list[str]:
    """What a person reads when the sandbox is ready: each DLQ's stories, where the state is."""
    lines = []
    for family in seeded:
        stories = ", ".join(f"{n:,} {STORIES[s].label}" for s, n in family.by_story.items())
        lines.append(
            f"# {family.family}: {family.messages:,} in {queue_name(family.dlq_url)}"
            + (f": {stories}" if stories else "")
        )
    if server.state_dir is not None:
        lines.append(f"# ledger and audit trail of this sandbox: {server.state_dir}")
    if server.seed is not None:
        lines.append(f"# tasks drawn from --seed {server.seed}")
    if server.result_backend is not None:
        lines.append(f"# Celery result database (why they failed): {server.result_backend}")
    return lines
