"""Which broker a command talks to, and its version (issue 39): what ``status``, ``check``,
the audit trail and their ``--json`` name, so that a report says what it was read from.

RabbitMQ says its version through the management API (``/api/overview``); SQS has none to
give, so it is named by its endpoint. redrive is tested on RabbitMQ 3.10 and 4.0 (Debian's
3.10.8 and 4.0.5): another version gets one warning line naming the tested ones, because
the rules a DLQ tool leans on changed between them (x-death's count, quorum queues' default
delivery limit) and may change again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

#: Brokers named without a version (every other kind is RabbitMQ's, with its version).
_NAMES: Final = {"sqs": "SQS", "memory": "the in-memory broker"}
TESTED_RABBITMQ: Final = ("3.10", "4.0")
"""The RabbitMQ release lines the suite runs against (tests/test_rabbitmq_versions.py)."""


@dataclass(frozen=True, slots=True)
class BrokerServer:
    """The broker a command read: ``kind`` (``rabbitmq`` or ``sqs``), its version where the
    broker says it (None: SQS, or RabbitMQ's API did not say), and where it is (printable:
    a URL's password masked)."""

    kind: str
    version: str | None
    endpoint: str

    @property
    def name(self) -> str:
        """``RabbitMQ 4.0.5``, ``RabbitMQ (version not known)``, ``SQS``."""
        if self.kind in _NAMES:
            return _NAMES[self.kind]
        return f"RabbitMQ {self.version}" if self.version else "RabbitMQ (version not known)"

    @property
    def tested(self) -> bool | None:
        """Whether the suite runs on this release line (None: SQS, or no version known)."""
        if self.kind != "rabbitmq" or not self.version:
            return None
        return release_line(self.version) in TESTED_RABBITMQ

    def line(self) -> str:
        """One line for a text output: ``broker: RabbitMQ 4.0.5 at http://...``."""
        return f"broker: {self.name} at {self.endpoint}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "version": self.version,
            "endpoint": self.endpoint,
            "tested": self.tested,
        }


def release_line(version: str) -> str:
    """``4.0.5`` -> ``4.0``; ``4.1.0-rc.2`` -> ``4.1``."""
    return ".".join(version.split("-", 1)[0].split(".")[:2])


def untested_warning(server: BrokerServer) -> str | None:
    """The one warning line for a RabbitMQ outside the tested release lines (None: tested,
    SQS, or no version known)."""
    if server.tested is not False:
        return None
    tested = " and ".join(TESTED_RABBITMQ)
    return (
        f"{server.name} is not a version redrive is tested on (RabbitMQ {tested}): its "
        "dead-lettering and delivery limits may differ from what redrive expects; check a "
        "dry run before --execute"
    )


def server_of(broker: object) -> BrokerServer | None:
    """The broker's :class:`BrokerServer` (None: a broker that cannot say)."""
    describe = getattr(broker, "server", None)
    if not callable(describe):
        return None
    found = describe()
    return found if isinstance(found, BrokerServer) else None
