"""Who runs a command: the local user and host, and the AWS principal behind the calls."""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Callable
from typing import Any


def local_identity() -> dict[str, str]:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    return {"user": user, "host": socket.gethostname()}


def caller_identity(sts_client_factory: Callable[[], Any]) -> dict[str, str]:
    """The AWS principal (STS GetCallerIdentity), best effort: an audit record without it
    is better than a run refused for it (the sandbox, for one, has no real identity)."""
    try:
        response = sts_client_factory().get_caller_identity()
    except Exception as exc:  # any failure: record why, do not stop the run
        return {"aws_error": type(exc).__name__}
    return {
        "aws_arn": str(response.get("Arn", "")),
        "aws_account": str(response.get("Account", "")),
        "aws_user_id": str(response.get("UserId", "")),
    }
