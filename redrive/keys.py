"""Idempotency keys: what identifies one *task run*, so each reaches its target once.

Two copies of one Celery task (same task id, same retry number) share a key; a task that
came back to the DLQ after a redrive gets a new key (its redrive count, the *generation*,
is part of it). A message that is not a Celery task is identified by its SQS MessageId.
"""

from __future__ import annotations

import hashlib
import re

from redrive.messages import TaskInfo

MAX_KEY_LENGTH = 128
# MessageDeduplicationId allows alphanumerics and punctuation; keys double as one.
_SAFE = re.compile(r"^[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]+$")


def key_for(info: TaskInfo, *, message_id: str, generation: int) -> str:
    if info.task_id:
        # The task name's digest guards against producers that reuse one id for two tasks.
        name = hashlib.blake2b(info.task.encode("utf-8", "surrogatepass"), digest_size=4)
        key = f"celery:{info.task_id}:r{info.retries or 0}:g{generation}:{name.hexdigest()}"
    else:
        key = f"sqs:{message_id}:g{generation}"
    if len(key) > MAX_KEY_LENGTH or not _SAFE.match(key):
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
        key = f"sha256:{digest}"
    return key
