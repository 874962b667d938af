"""Idempotency keys: what identifies one *task run*, so each reaches its target once.

A key names one publish of a Celery task, at one retry, on one generation:

    celery:<task id>:r<retries>:g<generation>:<task name digest>:<publish>

Copies of one publish (SQS duplicates, a copy an unconfirmed send left behind, an archive
replayed twice) share a key; a second publish of the same task id does not, because
kombu's virtual transports (SQS among them) stamp every publish with a fresh
``properties.delivery_tag`` (``publish`` is ``t`` + its digest; ``b`` + a digest of the body
for the rare producer that sends none). A task that came back to the DLQ after a redrive gets
a new key (its redrive count, the *generation*, is part of it). A message that is not a
Celery task is identified by its broker's message id, under the broker's own namespace
(``Capabilities.key_namespace``: a ledger's older keys name SQS messages that way).

Same key does not yet mean same task run: :func:`copy_verdict` is the rule that tells a copy
of one message from a second invocation that happens to share its key (see "Copies and
second publishes" in docs/safety.md).
"""

from __future__ import annotations

import hashlib
import re
from enum import StrEnum

from redrive.messages import TaskInfo

MAX_KEY_LENGTH = 128
# A FIFO deduplication id allows alphanumerics and punctuation; keys double as one.
_SAFE = re.compile(r"^[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]+$")
# When a broker enqueued a message is its clock, a ledger's times are the operator's: allow for
# skew.
CLOCK_SLACK = 300.0


def _digest(text: str, size: int) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=size).hexdigest()


def publish_of(info: TaskInfo, body: str) -> str:
    """What tells one publish of a task from another: kombu's delivery tag, else the body."""
    if info.delivery_tag:
        return "t" + _digest(info.delivery_tag, 8)
    return "b" + _digest(body, 8)


def key_for(
    info: TaskInfo,
    *,
    message_id: str,
    generation: int,
    body: str,
    namespace: str,
    by_message: bool = False,
) -> str:
    """The key of one message. ``by_message`` adds its MessageId: for a second invocation
    that shares the key of a task already sent (see :func:`copy_verdict`)."""
    if info.task_id:
        # The task name's digest guards against producers that reuse one id for two tasks.
        key = (
            f"celery:{info.task_id}:r{info.retries or 0}:g{generation}:"
            f"{_digest(info.task, 4)}:{publish_of(info, body)}"
        )
        if by_message:
            key += ":m" + _digest(message_id, 8)
    else:
        key = f"{namespace}:{message_id}:g{generation}"
    return _bounded(key)


def legacy_key_for(info: TaskInfo, *, message_id: str, generation: int, namespace: str) -> str:
    """The key redrive used before keys named the publish (ledgers of schema 1 and 2)."""
    if info.task_id:
        key = f"celery:{info.task_id}:r{info.retries or 0}:g{generation}:{_digest(info.task, 4)}"
    else:
        key = f"{namespace}:{message_id}:g{generation}"
    return _bounded(key)


_CELERY_KEY = re.compile(
    r"^celery:(?P<task_id>.+):r-?\d+:g\d+:[0-9a-f]{8}(?::[tb][0-9a-f]{16}(?::m[0-9a-f]{16})?)?$"
)


def task_id_of_key(key: str) -> str | None:
    """The Celery task id a key names (:func:`key_for`, :func:`legacy_key_for`); None for a
    message that is not a task, or a key hashed because it was too long to keep."""
    match = _CELERY_KEY.match(key)
    return match.group("task_id") if match else None


def _bounded(key: str) -> str:
    if len(key) > MAX_KEY_LENGTH or not _SAFE.match(key):
        return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return key


class Verdict(StrEnum):
    SAME_MESSAGE = "same-message"
    """The very SQS message already handled (a repeated delivery, or one not deleted yet)."""
    COPY = "copy"
    """Another copy of the same publish: delete it once the first copy's send is confirmed."""
    SECOND_PUBLISH = "second-publish"
    """A new invocation that shares the key: it is moved under a key of its own."""
    AMBIGUOUS = "ambiguous"
    """Nothing tells a copy from a second publish: held, with a reason."""


def copy_verdict(
    *,
    same_message: bool,
    tagged: bool,
    enqueued_at: float | None,
    first_sent_at: float | None,
) -> Verdict:
    """A message whose key is already taken (by a task sent, or by an earlier message of this
    run): is it a copy of that message or another invocation?

    ``tagged``: the key names the publish by kombu's delivery tag (not just the body);
    ``enqueued_at``: when the broker enqueued the message; ``first_sent_at``: when the
    ledger recorded the send of the key's first copy (None when it is not sent yet).
    """
    if same_message:
        return Verdict.SAME_MESSAGE
    if (
        enqueued_at is not None
        and first_sent_at is not None
        and enqueued_at > first_sent_at + CLOCK_SLACK
    ):
        # Every copy of a publish exists from the moment it was published, except redrive's
        # own, which carry the next generation (or, unstamped, the MessageId the ledger
        # kept): a message enqueued after its key was sent is somebody sending it again.
        return Verdict.SECOND_PUBLISH
    if tagged:
        return Verdict.COPY
    # The same bytes without a delivery tag: a duplicate, or a producer publishing the same
    # task twice. Deleting could lose a task, moving could double one.
    return Verdict.AMBIGUOUS
