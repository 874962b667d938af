"""Where and as whom redrive calls AWS: one botocore session, and clients configured alike.

botocore's own session, not boto3's: redrive uses clients only (no resources, no S3 transfer
manager), and boto3's import alone (s3transfer's with it) was a tenth of a second of every
command's start. Sessions share botocore's data loader: it caches the service models and the
endpoint data it reads, which a fresh loader parses again (~30 ms a file) for each session a
process opens (the sandbox's, ``--processes``' parent, an embedding program, the tests)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from redrive.aws.errors import aws_errors, one_line
from redrive.errors import AwsUnavailable

if TYPE_CHECKING:
    import botocore.loaders
    import botocore.session

# botocore's session and client modules are imported on first use, not with redrive's CLI:
# they are a quarter of its start (~0.1 s), which a run on RabbitMQ never needs.


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
        self._session: botocore.session.Session | None = None
        self._lock = threading.Lock()

    def session(self) -> botocore.session.Session:
        with self._lock:
            if self._session is None:
                with aws_errors("open an AWS session"):
                    import botocore.session

                    session = botocore.session.Session(profile=self.profile)
                    session.register_component("data_loader", shared_loader(session))
                    self._session = session
            return self._session

    def client(
        self, service: str, *, region: str | None = None, max_attempts: int | None = None
    ) -> Any:
        """A new client: each worker thread gets its own (boto3 clients are not shared)."""
        from botocore.config import Config

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
                return session.create_client(
                    service,
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


_LOADERS: dict[Any, botocore.loaders.Loader] = {}
_LOADERS_LOCK = threading.Lock()


def shared_loader(session: botocore.session.Session) -> botocore.loaders.Loader:
    """The process's loader for the session's data path (``AWS_DATA_PATH``), as botocore
    would create it for the session (tests/conftest.py gives it to every session a test
    process opens: moto's and boto3's open one per test)."""
    import botocore.loaders

    data_path = session.get_config_variable("data_path")
    with _LOADERS_LOCK:
        loader = _LOADERS.get(data_path)
        if loader is None:
            loader = _LOADERS[data_path] = botocore.loaders.create_loader(data_path)
        return loader
