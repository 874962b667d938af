"""A private RabbitMQ node on loopback: Debian's rabbitmq-server in folders of its own.

One :class:`RabbitMQNode` owns one node's life: free loopback ports, its config, its data
and logs under a base folder, a unique node name, its own epmd, and the processes (each in a
process group of its own, stopped by PID). The sandbox (``redrive sandbox --broker
rabbitmq``) and the test suite run it; nothing here touches a system-wide RabbitMQ.

Why each choice (measured on Debian's 3.10.8, Erlang 25):

- ``/usr/lib/rabbitmq/bin/rabbitmq-server``, not ``/usr/sbin/rabbitmq-server``: Debian's
  wrapper switches to the ``rabbitmq`` user and drops the caller's environment, so none of
  the ``RABBITMQ_*`` settings below would reach the node.
- Every folder and file is named by the environment (``RABBITMQ_FEATURE_FLAGS_FILE``
  included: without it the node fails with ``failed_to_create_feature_flags_file_directory``),
  and ``RABBITMQ_CONF_ENV_FILE`` points at a file that does not exist, so that the machine's
  ``/etc/rabbitmq`` says nothing about this node.
- Its own epmd (Erlang's port mapper), on loopback and a free port: the one ``erl`` would
  start by itself listens on every interface at 4369, is shared by every node of the
  machine, and daemonizes out of our reach, outliving the node.
- Ready when ``GET /api/overview`` answers: ``rabbitmqctl await_startup`` right after the
  start and ``rabbitmq-diagnostics ping`` answer before the broker accepts anything.
- SIGTERM to the script's process group stops the node cleanly (the script traps it and
  stops the VM; the VM itself takes SIGTERM as a graceful stop too), in about 6 s.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from redrive.errors import RabbitMQNodeError, RabbitMQNotInstalled

RABBITMQ_SERVER: Final = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
"""The server script itself (not Debian's /usr/sbin wrapper: it drops the environment)."""

EPMD: Final = Path("/usr/bin/epmd")

INSTALL_HINT: Final = "apt-get install rabbitmq-server"

ENABLED_PLUGINS: Final = "[rabbitmq_management,rabbitmq_shovel,rabbitmq_shovel_management].\n"

USER: Final = "guest"
PASSWORD: Final = "guest"
"""The node's default user, which RabbitMQ lets in from loopback only."""

START_TIMEOUT: Final = 240.0
"""A bound for a hang, not a pace: 10–20 s here on 2 busy cores."""

STOP_TIMEOUT: Final = 60.0

PORT_ATTEMPTS: Final = 3
"""Starts with freshly picked ports when one was taken meanwhile (eaddrinuse)."""


def server_installed(server: Path | None = None) -> bool:
    """Whether the server script is there (``server``: :data:`RABBITMQ_SERVER`)."""
    server = server or RABBITMQ_SERVER
    return server.is_file() and os.access(server, os.X_OK)


def require_server(server: Path | None = None) -> None:
    """Raise :class:`RabbitMQNotInstalled` (one line saying how to install it) when missing."""
    server = server or RABBITMQ_SERVER
    if not server_installed(server):
        raise RabbitMQNotInstalled(
            f"RabbitMQ is not installed ({server} is missing): {INSTALL_HINT}"
        )
    if not EPMD.is_file():
        raise RabbitMQNotInstalled(f"Erlang's epmd is missing ({EPMD}): {INSTALL_HINT}")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (another process may still take it before us)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class NodePorts:
    amqp: int
    dist: int
    """Erlang distribution (rabbitmqctl and other nodes talk to the node on it)."""
    management: int
    epmd: int

    @classmethod
    def pick(cls) -> NodePorts:
        ports: set[int] = set()
        while len(ports) < 4:
            ports.add(free_port())
        amqp, dist, management, epmd = sorted(ports)
        return cls(amqp=amqp, dist=dist, management=management, epmd=epmd)


def vhost_amqp_url(amqp_url: str, vhost: str) -> str:
    """``amqp_url`` on another vhost, written as kombu reads it (``/`` is ``//``)."""
    parts = urllib.parse.urlsplit(amqp_url)
    path = "/" if vhost == "/" else urllib.parse.quote(vhost, safe="")
    return f"{parts.scheme}://{parts.netloc}/{path}"


@dataclass(frozen=True)
class Vhost:
    """A vhost of a node, with the URLs that reach it."""

    vhost: str
    amqp_url: str
    """The AMQP URL on this vhost (``amqp://guest:guest@127.0.0.1:PORT/VHOST``)."""
    api_url: str
    """The node's management API (``http://127.0.0.1:MPORT``; credentials: guest)."""


class RabbitMQNode:
    """A private node under ``base`` (created if missing): ``start()`` it (or use
    :func:`start_node`), read ``amqp_url`` and ``api_url``, ``stop()`` it (idempotent; also
    as a context manager)."""

    def __init__(self, base: Path, *, server: Path | None = None) -> None:
        self.base = base
        self.server = server or RABBITMQ_SERVER
        self.ports = NodePorts.pick()
        self.node_name = f"redrive-{os.getpid()}-{secrets.token_hex(4)}@localhost"
        self.process: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None

    # -- addresses ---------------------------------------------------------------------------

    @property
    def amqp_url(self) -> str:
        """The default vhost (``/``), as Celery and kombu write it."""
        return f"amqp://{USER}:{PASSWORD}@127.0.0.1:{self.ports.amqp}//"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.management}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def log_file(self) -> Path:
        return self.base / "log" / f"{self.node_name}.log"

    @property
    def output_file(self) -> Path:
        return self.base / "server.out"

    def seen(self, path: Path) -> Path:
        """``path`` (on this machine) as the node sees it: the same here; inside its root
        for :class:`ChrootRabbitMQNode`."""
        return path

    def base_env(self) -> dict[str, str]:
        """What the node inherits besides its own settings: this process's environment."""
        return {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}

    def command(self, argv: list[str]) -> list[str]:
        """How to run ``argv`` (paths as the node sees them) in the node's world."""
        return argv

    def env(self) -> dict[str, str]:
        """The environment the node runs in (also what rabbitmqctl needs to reach it)."""
        base = self.seen(self.base)
        env = self.base_env()
        env.update(
            HOME=str(base / "home"),
            RABBITMQ_NODENAME=self.node_name,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.ports.amqp),
            RABBITMQ_DIST_PORT=str(self.ports.dist),
            RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
            RABBITMQ_LOG_BASE=str(base / "log"),
            RABBITMQ_CONFIG_FILE=str(base / "rabbitmq"),  # the script adds ".conf"
            RABBITMQ_ADVANCED_CONFIG_FILE=str(base / "advanced.config"),
            RABBITMQ_CONF_ENV_FILE=str(base / "rabbitmq-env.conf"),  # absent on purpose
            RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
            RABBITMQ_FEATURE_FLAGS_FILE=str(base / "feature_flags"),
            RABBITMQ_PID_FILE=str(base / "rabbitmq.pid"),
            # Erlang distribution on loopback only, through this node's own epmd.
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            ERL_EPMD_ADDRESS="127.0.0.1",
            ERL_EPMD_PORT=str(self.ports.epmd),
        )
        return env

    # -- life ----------------------------------------------------------------------------

    def start(self, *, timeout: float = START_TIMEOUT) -> RabbitMQNode:
        """Start the node and return once its management API answers and its AMQP port
        takes connections; on failure (the server exits, or no answer within ``timeout``)
        stop what was started and raise :class:`RabbitMQNodeError` with the log's tail.
        A port another process took between its pick and the node's bind (loopback ports
        are picked free, then given up: any outgoing connection of this busy machine may
        take one meanwhile) is picked again, a few times."""
        self.require()
        if self.process is not None:
            return self
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                return self._start_once(timeout)
            except RabbitMQNodeError as error:
                if attempt == PORT_ATTEMPTS or not _port_taken(str(error)):
                    raise
                self.ports = NodePorts.pick()
                for folder in ("mnesia", "log"):
                    shutil.rmtree(self.base / folder, ignore_errors=True)
                self.output_file.unlink(missing_ok=True)
        raise AssertionError("unreachable")  # pragma: no cover

    def _start_once(self, timeout: float) -> RabbitMQNode:
        self._write_files()
        try:
            self.epmd = self._start_epmd(timeout)
            with self.output_file.open("ab") as out:
                self.process = subprocess.Popen(
                    self.command([str(self.seen(self.server))]),
                    env=self.env(),
                    cwd=self.base,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    process_group=0,
                )
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _write_files(self) -> None:
        for folder in ("home", "mnesia", "log"):
            (self.base / folder).mkdir(parents=True, exist_ok=True)
        (self.base / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.ports.amqp}\n"
            "management.tcp.ip = 127.0.0.1\n"
            f"management.tcp.port = {self.ports.management}\n"
            "log.file.level = info\n"
            "log.console = false\n"
        )
        (self.base / "enabled_plugins").write_text(ENABLED_PLUGINS)

    def _start_epmd(self, timeout: float) -> subprocess.Popen[bytes]:
        with (self.base / "epmd.out").open("ab") as out:
            epmd = subprocess.Popen(
                self.command([str(EPMD), "-port", str(self.ports.epmd), "-address", "127.0.0.1"]),
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                process_group=0,
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.ports.epmd), timeout=1):
                    return epmd
            except OSError:
                if epmd.poll() is not None or time.monotonic() > deadline:
                    epmd.kill()
                    epmd.wait()
                    tail = (self.base / "epmd.out").read_text(errors="replace")[-500:]
                    raise RabbitMQNodeError(f"epmd did not start: {tail.strip()}") from None
                time.sleep(0.05)

    def require(self) -> None:
        """Raise :class:`RabbitMQNotInstalled` when the server is missing."""
        require_server(self.server)

    def _wait_ready(self, timeout: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        # The AMQP listener starts after the management API's (3.10 answered its API, then
        # died of a taken AMQP port): ready is both.
        while not (self.api_answers() and _accepts(self.ports.amqp)):
            code = self.process.poll()
            if code is not None:
                raise RabbitMQNodeError(
                    f"rabbitmq-server exited ({code}) before its API answered: " + self.log_tail()
                )
            if time.monotonic() > deadline:
                raise RabbitMQNodeError(
                    f"rabbitmq-server's API did not answer within {timeout:.0f} s: "
                    + self.log_tail()
                )
            time.sleep(0.2)

    def server_version(self) -> str:
        """The version the node says it runs (its management API's ``rabbitmq_version``)."""
        overview = management_request(self.api_url, "GET", "/api/overview", timeout=30)
        return str(overview["rabbitmq_version"])

    def api_answers(self) -> bool:
        try:
            management_request(self.api_url, "GET", "/api/overview", timeout=5)
        except (OSError, RabbitMQNodeError):
            return False
        return True

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the server's output and of its log (for a failure's message)."""
        parts = []
        for path in (self.output_file, self.log_file):
            if path.is_file():
                text = path.read_text(errors="replace")[-chars:].strip()
                parts.append(f"[{path.name}] {text}")
        return " | ".join(parts) or "(no output)"

    def stop(self, *, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM to the node's process group, wait, then SIGKILL; then its epmd. By PID
        only; calling it again does nothing."""
        process, self.process = self.process, None
        if process is not None:
            _stop_group(process, timeout)
        epmd, self.epmd = self.epmd, None
        if epmd is not None:
            _stop_group(epmd, timeout)

    def create_vhost(self, vhost: str) -> Vhost:
        """A new vhost on this node, where guest may do everything."""
        create_vhost(self.api_url, vhost)
        return Vhost(vhost, vhost_amqp_url(self.amqp_url, vhost), self.api_url)

    def delete_vhost(self, vhost: str) -> None:
        delete_vhost(self.api_url, vhost)

    def __enter__(self) -> RabbitMQNode:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class ChrootRabbitMQNode(RabbitMQNode):
    """A private node of the rabbitmq-server installed in another Debian's root (the
    suite's RabbitMQ 4.0 node: Debian 13's package, in the root ``.ci/rabbitmq4_root.sh``
    builds), run as that root's ``rabbitmq`` user by ``chroot --userspec``. Needs root.

    Its folders are under ``ROOT/tmp`` (the node sees nothing else of this machine) and owned
    by the root's ``rabbitmq`` user; its epmd is the root's. The network is this machine's,
    so everything still listens on 127.0.0.1 only. ``/proc`` (which Erlang reads) is mounted
    in the root while the node runs, and unmounted by :meth:`stop`.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        base = root / "tmp" / f"redrive-node-{os.getpid()}-{secrets.token_hex(4)}"
        super().__init__(base, server=root / str(RABBITMQ_SERVER).lstrip("/"))
        self.mounted_proc: Path | None = None

    def seen(self, path: Path) -> Path:
        return Path("/") / path.relative_to(self.root)

    def base_env(self) -> dict[str, str]:
        return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}

    def command(self, argv: list[str]) -> list[str]:
        pairs = [f"{name}={value}" for name, value in self.env().items()]
        return [
            "chroot", "--userspec=rabbitmq:rabbitmq", str(self.root),
            "/usr/bin/env", "-i", *pairs, *argv,
        ]  # fmt: skip

    def require(self) -> None:
        super().require()
        if os.geteuid() != 0:
            raise RabbitMQNotInstalled(f"a node in {self.root} needs root (chroot)")

    def _write_files(self) -> None:
        super()._write_files()
        uid, gid = root_user(self.root, "rabbitmq")
        for path in [self.base, *self.base.rglob("*")]:
            os.chown(path, uid, gid)
        # A mount of its own, even where another node of the root has one: mounts of proc
        # stack and are all alike, so each node's stop takes one away and the root's /proc
        # is gone once the last node has stopped, whichever stops first.
        proc = self.root / "proc"
        subprocess.run(["mount", "-t", "proc", "proc", str(proc)], check=True)
        self.mounted_proc = proc

    def rabbitmqctl(self, *args: str, timeout: float = STOP_TIMEOUT) -> str:
        """``rabbitmqctl ARGS`` against this node, from inside its root; its output."""
        ctl = str(RABBITMQ_SERVER.with_name("rabbitmqctl"))
        done = subprocess.run(
            self.command([ctl, "-n", self.node_name, *args]),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return done.stdout + done.stderr

    def stop(self, *, timeout: float = STOP_TIMEOUT) -> None:
        """``rabbitmqctl stop`` first (a clean stop); then the process groups as any node's
        (by PID), ``/proc`` unmounted if this node mounted it, and its folder removed."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                self.rabbitmqctl("stop", timeout=timeout)
        super().stop(timeout=timeout)
        proc, self.mounted_proc = self.mounted_proc, None
        if proc is not None:
            unmount(proc)

    def remove(self) -> None:
        """Delete the node's folder (its data and logs): only once it is stopped."""
        shutil.rmtree(self.base, ignore_errors=True)


def root_user(root: Path, name: str) -> tuple[int, int]:
    """The uid and gid of ``name`` in ``root``'s /etc/passwd (not this machine's)."""
    for line in (root / "etc" / "passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == name:
            return int(fields[2]), int(fields[3])
    raise RabbitMQNotInstalled(f"no {name} user in {root}/etc/passwd")


def unmount(path: Path) -> None:
    """Unmount ``path``'s topmost mount (lazily if it is busy: a process still inside lets
    it go later)."""
    if os.path.ismount(path):
        done = subprocess.run(["umount", str(path)], capture_output=True, check=False)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def start_node(base: Path, *, timeout: float = START_TIMEOUT) -> RabbitMQNode:
    """A private node under ``base``, started and ready."""
    return RabbitMQNode(base).start(timeout=timeout)


def _port_taken(failure: str) -> bool:
    return "eaddrinuse" in failure.lower() or "address already in use" in failure.lower()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return True
    except OSError:
        return False


def _stop_group(process: subprocess.Popen[bytes], timeout: float) -> None:
    """Stop a process started with ``process_group=0`` and whatever else is in its group."""
    group = process.pid  # its own group, so the group id is its PID
    _signal_group(group, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        _signal_group(group, signal.SIGKILL)
        process.wait()
    # The leader is gone; a child it left (the VM, erl_child_setup) must not outlive it.
    deadline = time.monotonic() + timeout
    while _group_alive(group) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal_group(group, signal.SIGKILL)


def _signal_group(group: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signum)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


# -- the management API (stdlib only) ----------------------------------------------------------


def management_request(
    api_url: str,
    method: str,
    path: str,
    body: Any = None,
    *,
    user: str = USER,
    password: str = PASSWORD,
    timeout: float = 30,
) -> Any:
    """One call of the management API; the decoded JSON answer (None when empty). A refused
    call raises :class:`RabbitMQNodeError` with the status and the API's reason."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{api_url.rstrip('/')}{path}", data=data, method=method)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as error:
        reason = error.read().decode(errors="replace")[:300]
        raise RabbitMQNodeError(f"{method} {path}: HTTP {error.code} {reason}") from None
    return json.loads(raw) if raw.strip() else None


def _vhost_path(vhost: str) -> str:
    return urllib.parse.quote(vhost, safe="")


def create_vhost(api_url: str, vhost: str, *, user: str = USER, password: str = PASSWORD) -> None:
    """Create ``vhost`` and give ``user`` every permission on it."""
    name = _vhost_path(vhost)
    management_request(api_url, "PUT", f"/api/vhosts/{name}", {}, user=user, password=password)
    management_request(
        api_url,
        "PUT",
        f"/api/permissions/{name}/{urllib.parse.quote(user, safe='')}",
        {"configure": ".*", "write": ".*", "read": ".*"},
        user=user,
        password=password,
    )


def delete_vhost(api_url: str, vhost: str, *, user: str = USER, password: str = PASSWORD) -> None:
    """Delete ``vhost`` and everything on it; a vhost already gone is no error."""
    try:
        management_request(
            api_url, "DELETE", f"/api/vhosts/{_vhost_path(vhost)}", user=user, password=password
        )
    except RabbitMQNodeError as error:
        if "HTTP 404" not in str(error):
            raise
