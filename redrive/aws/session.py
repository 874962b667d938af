"""Where and as whom redrive calls AWS: one boto3 session, and clients configured alike."""

from __future__ import annotations

import threading
from typing import Any

import boto3
from botocore.config import Config

from redrive.aws.errors import aws_errors, one_line
from redrive.errors import AwsUnavailable


class AwsSettings:
    """Where and as whom to call AWS; ``None`` leaves the choice to boto3's usual chain
    (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_PROFILE``, ``~/.aws/config`` ...)."""

    def __init__(
        self,
        endpoint_url: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        *,
        max_attempts: int = 6,
    ) -> None:
        self.endpoint_url = endpoint_url
        self.region = region
        self.profile = profile
        self.max_attempts = max_attempts
        self._session: boto3.Session | None = None
        self._lock = threading.Lock()

    def session(self) -> boto3.Session:
        with self._lock:
            if self._session is None:
                with aws_errors("open an AWS session"):
                    self._session = boto3.Session(profile_name=self.profile)
            return self._session

    def client(
        self, service: str, *, region: str | None = None, max_attempts: int | None = None
    ) -> Any:
        """A new client: each worker thread gets its own (boto3 clients are not shared)."""
        config = Config(
            # adaptive: client-side rate limiting that backs off when AWS throttles.
            # total_max_attempts counts the first request; botocore's "max_attempts" counts
            # retries only, so max_attempts=1 would still resend an unconfirmed batch once.
            retries={
                "mode": "adaptive",
                "total_max_attempts": max_attempts or self.max_attempts,
            },
            connect_timeout=5,
            read_timeout=40,
            max_pool_connections=20,
            # SQS validates every request itself; botocore's client-side pass was about a
            # tenth of the CPU of a move (bench/move.py), and every call here is built by code.
            parameter_validation=False,
        )
        session = self.session()
        try:
            with self._lock, aws_errors(f"create the {service} client"):
                return session.client(
                    service,  # type: ignore[call-overload]
                    endpoint_url=self.endpoint_url,
                    region_name=region or self.region,
                    config=config,
                )
        except ValueError as exc:
            # botocore rejects a malformed endpoint URL (option or AWS_ENDPOINT_URL) this way.
            raise AwsUnavailable(
                f"cannot create the {service} client: {one_line(str(exc))}: check "
                "--endpoint-url / AWS_ENDPOINT_URL (e.g. http://127.0.0.1:4566)"
            ) from exc
