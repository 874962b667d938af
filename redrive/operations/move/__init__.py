"""Move: send dead-lettered messages back, each task once, and delete a DLQ copy only after
its send is confirmed.

Per batch of received messages (every step is a point a crash may hit; see the tests):

1. **receive** a batch with a short lease (the visibility timeout);
2. decide per message: not selected, expired, poison, no target, not a Celery task,
   duplicate (a copy of a task sent) or a second publish of its task id (see
   :func:`redrive.keys.copy_verdict`), in doubt...;
3. **claim** the keys to send in the ledger (durable before anything is sent);
4. **send** them (SendMessageBatch, one batch per target, the 256 KiB limit respected);
5. **record** the confirmed ones as SENT, release the claims of the failed ones;
6. **delete** the DLQ copies of what was sent (and of duplicates of what was sent before);
7. record the deleted keys as DONE.

A crash between 3 and 5 leaves keys CLAIMED by a dead run: *in doubt*, reported by the next
run and resolved only by the operator (``--in-doubt resend|skip``). A crash anywhere else is
harmless: the next run finds SENT keys and only deletes, or finds nothing and starts over.

The package, by role: :mod:`.options` (what configures a run), :mod:`.result` (what it
found and did, and the tally that counts it), :mod:`.candidate` (a message on its way, a
decided batch), :mod:`.decide` with :mod:`.routing`, :mod:`.copies` and :mod:`.owners` (each
message's fate: step 2), :mod:`.execute` with :mod:`.send` (steps 3 to 7), :mod:`.stages` (a
worker's two stages) and :mod:`.engine` (the run's life, wiring the parts).
"""

from redrive.operations.move.engine import REPAIR_STEPS, STEPS, MoveEngine
from redrive.operations.move.options import (
    AMBIGUOUS_POLICIES,
    DEFAULT_LEASE,
    DEFAULT_MAX_REDRIVES,
    IN_DOUBT_POLICIES,
    AmbiguousPolicy,
    InDoubtPolicy,
    MessageSource,
    MoveOptions,
)
from redrive.operations.move.repair_step import (
    RepairOptions,
    RepairReport,
    continued_archive,
)
from redrive.operations.move.result import (
    ClaimOutcome,
    DeleteOutcome,
    MoveResult,
    MoveTally,
    SendOutcome,
    TaskCounts,
)
from redrive.operations.move.stages import OVERLAP_MIN_WAIT, OVERLAP_SAMPLE, overlap_pays
from redrive.operations.verdict import (  # the skip reasons, for callers
    AMBIGUOUS,
    BUSY,
    EXPIRED,
    IN_DOUBT,
    LEASE_LIVE,
    NO_TARGET,
    NOT_CELERY,
    POISON,
    RESOLVED_SKIP,
)
from redrive.runs.listed import MAX_LISTED, Listed, listed_json

__all__ = [
    "AMBIGUOUS",
    "AMBIGUOUS_POLICIES",
    "BUSY",
    "DEFAULT_LEASE",
    "DEFAULT_MAX_REDRIVES",
    "EXPIRED",
    "IN_DOUBT",
    "IN_DOUBT_POLICIES",
    "LEASE_LIVE",
    "MAX_LISTED",
    "NOT_CELERY",
    "NO_TARGET",
    "OVERLAP_MIN_WAIT",
    "OVERLAP_SAMPLE",
    "POISON",
    "REPAIR_STEPS",
    "RESOLVED_SKIP",
    "STEPS",
    "AmbiguousPolicy",
    "ClaimOutcome",
    "DeleteOutcome",
    "InDoubtPolicy",
    "Listed",
    "MessageSource",
    "MoveEngine",
    "MoveOptions",
    "MoveResult",
    "MoveTally",
    "RepairOptions",
    "RepairReport",
    "SendOutcome",
    "TaskCounts",
    "continued_archive",
    "listed_json",
    "overlap_pays",
]
