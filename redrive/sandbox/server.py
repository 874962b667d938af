"""moto's server on loopback, with or without the sandbox's extensions, and the
environment and clients that point at it."""

from __future__ import annotations

import contextlib
import ipaddress
import shlex
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import boto3
import botocore.session
from botocore.config import Config

# moto.server re-exports these without __all__; this is where they live.
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

import redrive.sandbox.moto_sqs as moto_sqs

ACCESS_KEY_ID: Final = "sandbox"


SECRET_ACCESS_KEY: Final = "sandbox"


REGION: Final = "us-east-1"


# -- the server ------------------------------------------------------------------------------


@dataclass
class SandboxServer:
    """A running moto server; stop it (or use it as a context manager) to free the port."""

    endpoint_url: str
    host: str
    port: int
    serial: bool = False
    extended: bool = False
    """Served with the sandbox's extensions of moto (:mod:`redrive.sandbox.moto_sqs`)."""
    state_dir: Path | None = None
    """The fresh state directory of a seeded sandbox (``REDRIVE_STATE_DIR`` of its exports)."""
    seed: int | None = None
    """What the seeded tasks were drawn from (``--seed`` draws the same again)."""
    result_backend: str | None = None
    """Its Celery result database (``REDRIVE_RESULT_BACKEND`` of its exports), if any."""
    _server: BaseWSGIServer | None = field(default=None, repr=False, compare=False)
    _thread: threading.Thread | None = field(default=None, repr=False, compare=False)
    _cleanup: contextlib.ExitStack | None = field(default=None, repr=False, compare=False)

    def stop(self) -> None:
        """Stop serving and close the listening socket; calling it again does nothing."""
        server, thread, cleanup = self._server, self._thread, self._cleanup
        self._server = self._thread = self._cleanup = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(10)
        _served.pop(self.endpoint_url, None)
        if cleanup is not None:
            cleanup.close()

    def __enter__(self) -> SandboxServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# Endpoint URL -> the server of this process that serves it (seed() works on its backend).
_served: dict[str, SandboxServer] = {}


def server_at(endpoint_url: str) -> SandboxServer | None:
    """The server of this process that serves ``endpoint_url``, if any."""
    return _served.get(endpoint_url)


def start_server(
    port: int = 0,
    *,
    host: str = "127.0.0.1",
    serial: bool = False,
    log_requests: bool = False,
    extended: bool = True,
) -> SandboxServer:
    """moto's SQS (and every other moto service) on ``host:port``, served by a daemon thread.

    ``port`` 0 picks a free port. ``serial`` handles one request at a time: moto 5.2's
    threaded server is not safe for concurrent ReceiveMessage calls on one queue (HTTP 500
    "Set changed size during iteration", or one message handed to two receivers). In serial
    mode a long poll (WaitTimeSeconds) on an empty queue holds up every other client for
    that long. ``extended`` installs the sandbox's extensions of moto in this process
    (:mod:`redrive.sandbox.moto_sqs`) until the server stops; without them it is stock moto.
    Raises ValueError for a host that is not loopback and OSError when the port is taken.
    """
    cleanup = contextlib.ExitStack()
    try:
        if extended:
            cleanup.enter_context(moto_sqs.extended())
        server = _start(port, host=host, serial=serial, log_requests=log_requests)
    except BaseException:
        cleanup.close()
        raise
    server.extended = extended
    server._cleanup = cleanup
    _served[server.endpoint_url] = server
    return server


def _start(port: int, *, host: str, serial: bool, log_requests: bool) -> SandboxServer:
    address = _loopback_address(host)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    # Bind here rather than in werkzeug: make_server prints to stderr and calls sys.exit(1)
    # when the port is taken, which would end the caller's process.
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((address, port))
        listener.listen(128)
        server = make_server(
            address,
            port,
            DomainDispatcherApplication(create_backend_app),
            threaded=not serial,
            request_handler=_request_handler(log_requests=log_requests),
            fd=listener.fileno(),  # werkzeug duplicates it
        )
    finally:
        listener.close()
    bound_port = int(server.port)
    shown = f"[{address}]" if family == socket.AF_INET6 else address
    thread = threading.Thread(
        target=server.serve_forever,
        # stop() waits up to one poll interval for the loop to notice.
        kwargs={"poll_interval": 0.1},
        name=f"redrive-sandbox-{bound_port}",
        daemon=True,
    )
    thread.start()
    return SandboxServer(
        endpoint_url=f"http://{shown}:{bound_port}",
        host=address,
        port=bound_port,
        serial=serial,
        _server=server,
        _thread=thread,
    )


def _loopback_address(host: str) -> str:
    """The address to bind for ``host``; ValueError unless it is a loopback address."""
    name = host.strip().lower().rstrip(".")
    if name == "localhost":
        # Not the name: werkzeug would bind IPv4 while clients may try ::1 first.
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        address = None
    if address is None or not address.is_loopback:
        raise ValueError(
            f"the sandbox only listens on loopback (127.0.0.1, localhost or ::1), not {host!r}: "
            "it has no authentication and holds whatever you send it"
        )
    return str(address)


def _request_handler(*, log_requests: bool) -> type[WSGIRequestHandler]:
    # A class per server: werkzeug writes protocol_version onto the handler class it is given.
    class Handler(MotoRequestHandler):
        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            # One line per request drowns the sandbox's own output; errors still log.
            if log_requests:
                super().log_request(code, size)

    return Handler


def sandbox_env(server: SandboxServer) -> dict[str, str]:
    """The environment a shell needs for redrive (or the AWS CLI) to use the sandbox.

    With the server's state directory, when it has one: the ledger and audit trail of what
    is done to the sandbox stay there.
    """
    env = {
        "AWS_ENDPOINT_URL": server.endpoint_url,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
        "AWS_DEFAULT_REGION": REGION,
    }
    if server.state_dir is not None:
        env["REDRIVE_STATE_DIR"] = str(server.state_dir)
    if server.result_backend is not None:
        env["REDRIVE_RESULT_BACKEND"] = server.result_backend
    return env


def export_lines(server: SandboxServer) -> list[str]:
    """Shell lines that point a terminal at the sandbox."""
    lines = [f"export {name}={shlex.quote(value)}" for name, value in sandbox_env(server).items()]
    if server.state_dir is not None:
        # A ledger named outright would beat the state directory's: the user's real one.
        lines.append("unset REDRIVE_LEDGER")
    # The exported keys beat a profile's, but a profile this machine lacks still makes
    # boto3 fail before any call reaches the sandbox.
    return [*lines, "unset AWS_PROFILE"]


def client_for(server: SandboxServer, service: str = "sqs", *, region: str = REGION) -> Any:
    """A boto3 client for the sandbox with its fake credentials; close it when done."""
    return sandbox_session(region).client(
        service,  # type: ignore[call-overload]
        endpoint_url=server.endpoint_url,
        config=Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5),
    )


def sandbox_session(region: str) -> boto3.session.Session:
    # No profile at all: the user's AWS_PROFILE may name one this machine lacks, and the
    # sandbox must not read their config or credentials anyway.
    core = botocore.session.Session(session_vars={"profile": (None, None, None, None)})
    return boto3.session.Session(
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET_ACCESS_KEY,
        region_name=region,
        botocore_session=core,
    )
