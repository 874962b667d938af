"""What bench/inspect.py and bench/move.py share: the queues, realistic Celery task
arguments, the contenders' environment, and small helpers.

Imported as ``bench.common``: the scripts put the repository root on ``sys.path`` (not
bench/ itself, where inspect.py would shadow the standard library's ``inspect``).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
from collections.abc import Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
HOST = "127.0.0.1"
REGION = "us-east-1"
QUEUE = "onion-checkout"
DLQ = "onion-checkout-dlq"
FAMILY = "checkout"
MAX_RECEIVE_COUNT = 5
DLQ_RETENTION = 14 * 86_400

#: Celery tasks of the seeded DLQs, with their weights (percent).
TASKS = (
    ("apps.webhooks.tasks.save_checkout_ibft", 30),
    ("apps.payments.tasks.capture_payment", 25),
    ("apps.payments.tasks.refund", 15),
    ("apps.notifications.tasks.send_receipt", 15),
    ("apps.orders.tasks.sync_order_status", 15),
)
NAMES = ("Ana", "Bilal", "Zoë", "Kenji", "Amara", "Lucía", "Omar", "Priya")


def arguments(task: str, rng: random.Random) -> tuple[list[Any], dict[str, Any]]:
    ident = rng.randint(1_000, 9_999_999)
    short = task.rsplit(".", 1)[-1]
    if short == "save_checkout_ibft":
        return [ident], {
            "payload": {
                "reference": f"IBFT-{rng.getrandbits(40):010X}",
                "amount": f"{rng.randint(100, 250_000)}.00",
                "currency": "PKR",
                "sender": {"name": rng.choice(NAMES), "iban": f"PK{rng.getrandbits(64):020d}"},
                "callback": {"status": rng.choice(("SUCCESS", "PENDING", "FAILED")), "code": "00"},
            }
        }
    if short == "capture_payment":
        return [ident], {
            "amount_cents": rng.randint(100, 500_000),
            "currency": "USD",
            "idempotency_key": f"{rng.getrandbits(128):032x}",
        }
    if short == "refund":
        return [ident], {"reason": rng.choice(("customer_request", "duplicate", "fraud"))}
    if short == "send_receipt":
        name = rng.choice(NAMES)
        return [f"{name.lower()}@example.com", ident], {"context": {"name": name, "lines": 3}}
    return [ident, rng.choice(("paid", "shipped", "cancelled"))], {"attempt": rng.randint(1, 5)}


def child_env(endpoint: str, state_dir: str, wait: int) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "CELERY_", "REDRIVE_", "PYTHON", "HTTP_PROXY", "HTTPS_PROXY"))
        and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")
    }
    env.update(
        {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_CONFIG_FILE": os.path.join(state_dir, "aws-config-absent"),
            "AWS_SHARED_CREDENTIALS_FILE": os.path.join(state_dir, "aws-credentials-absent"),
            "REDRIVE_STATE_DIR": os.path.join(state_dir, "redrive-state"),
            "REDRIVE_RECEIVE_WAIT": str(wait),
            "NO_PROXY": "127.0.0.1,localhost",
        }
    )
    return env


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_sizes(text: str) -> list[int]:
    sizes = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    if not sizes or any(n < 1 for n in sizes):
        raise argparse.ArgumentTypeError("sizes are positive integers, comma separated")
    return sizes
