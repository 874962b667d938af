"""One rehearsal on RabbitMQ (``redrive sandbox --broker rabbitmq``): a private node in a
folder of its own, the layout's queues with their DLX, DLQs filled by the broker's own
dead-lettering, a fresh state directory, served until stopped; then the node is stopped by
PID and its folder removed."""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from redrive.config import Layout
from redrive.sandbox.rabbitmq_layout import QueueType, RabbitFamily, fill_layout, rabbit_families
from redrive.sandbox.rabbitmq_node import ChrootRabbitMQNode, RabbitMQNode, require_server
from redrive.sandbox.rehearsal import new_state_dir, random_seed, remove_state_dir

#: A Debian root with rabbitmq-server installed (``make rabbitmq4`` builds one with 4.0.5):
#: the sandbox's node runs in it by chroot, as root, instead of the machine's own server.
#: How the suite runs the sandbox on RabbitMQ 4.0 (docs/support.md).
SANDBOX_ROOT_ENV: Final = "REDRIVE_SANDBOX_RABBITMQ_ROOT"
BROKER_ENV = "REDRIVE_BROKER"
API_ENV = "REDRIVE_RABBITMQ_API"


@dataclass
class RabbitSandbox:
    """A running RabbitMQ sandbox: its node, its families and how many each DLQ holds."""

    node: RabbitMQNode
    state_dir: Path
    seed: int
    families: list[RabbitFamily] = field(default_factory=list)
    depths: dict[str, int] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        """The environment a shell needs for redrive to use the sandbox."""
        return {
            BROKER_ENV: self.node.amqp_url,
            API_ENV: self.node.api_url,
            "REDRIVE_STATE_DIR": str(self.state_dir),
        }

    def export_lines(self) -> list[str]:
        lines = [f"export {name}={shlex.quote(value)}" for name, value in self.env().items()]
        # A ledger named outright would beat the state directory's: the user's real one.
        return [*lines, "unset REDRIVE_LEDGER"]

    def seeded_lines(self) -> list[str]:
        """What a person reads when it is ready: each DLQ's depth, the node, the state."""
        lines = [
            f"# {family.name}: {self.depths.get(family.name, 0):,} in {family.dlq} "
            f"(dead-lettered from {family.queue} through {family.dlx}, reason rejected)"
            for family in self.families
        ]
        lines.append(
            f"# RabbitMQ node {self.node.node_name} (PID {self.node.pid}), "
            f"management UI {self.node.api_url} (guest/guest), data in {self.node.base}"
        )
        lines.append(f"# ledger and audit trail of this sandbox: {self.state_dir}")
        lines.append(f"# tasks drawn from --seed {self.seed}")
        return lines


def run_rabbitmq(
    layout: Layout,
    *,
    per_family: int,
    seed: int | None = None,
    keep_state: bool = False,
    queue_type: QueueType = "classic",
    root: Path | None = None,
    on_ready: Callable[[RabbitSandbox], None],
    stop: threading.Event,
) -> Path | None:
    """Serve a filled RabbitMQ sandbox until ``stop`` is set; ``on_ready`` runs once it is
    filled. The node lives in a fresh folder (in ``root``, by default the temporary
    directory) removed when it stops, as is the state directory unless ``keep_state``.
    Returns the state directory when it is left behind, else None. Raises
    :class:`~redrive.errors.RabbitMQNotInstalled` before anything starts when the server is
    missing."""
    chroot = os.environ.get(SANDBOX_ROOT_ENV)
    if chroot:
        ChrootRabbitMQNode(Path(chroot)).require()
    else:
        require_server()
    chosen = random_seed() if seed is None else seed
    families = rabbit_families(layout, queue_type=queue_type)
    base = Path(tempfile.mkdtemp(prefix="redrive-sandbox-rabbitmq-", dir=root))
    node = ChrootRabbitMQNode(Path(chroot)) if chroot else RabbitMQNode(base / "node")
    state_dir: Path | None = None
    try:
        with node:
            node.start()
            state_dir = new_state_dir(node.ports.amqp, root=root)
            sandbox = RabbitSandbox(node, state_dir, chosen, families)
            sandbox.depths = fill_layout(node.amqp_url, families, per_family, seed=chosen)
            on_ready(sandbox)
            # A timeout keeps the main thread responsive to signals on every platform.
            while not stop.wait(0.5):
                pass
    finally:
        if isinstance(node, ChrootRabbitMQNode):
            node.remove()  # its folder is in the root
        shutil.rmtree(base, ignore_errors=True)
        kept = state_dir is not None and (keep_state or not remove_state_dir(state_dir))
    return state_dir if kept else None
