"""redrive: drain Amazon SQS dead-letter queues full of Celery tasks, safely."""

from __future__ import annotations

__version__ = "0.1.0"
