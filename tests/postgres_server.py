"""A private PostgreSQL server for the tests (Debian's ``postgresql`` package), one per run.

``initdb`` into a fresh folder and ``pg_ctl start`` on a free loopback port, its socket in
that folder (never /var/run), so nothing touches a cluster the machine may run on 5432.
As root both run as the ``postgres`` user (``initdb`` refuses root), in a folder chowned to
it directly under the temp dir (pytest's own temp folders are root's, mode 0700). About 1 s.

Shared as the RabbitMQ node is (tests/rabbitmq_shared.py): under xdist the first worker to
ask starts it under the run's shared folder while the others wait on a file lock, and
writes where it is (``postgres.json``); the controller stops it by PID once every worker is
done. Tests never see each other on it: each takes a schema of its own (tests/conftest.py).

``fsync=off``: the tests prove redrive's commits and their order, not the disk's; a crash of
the machine mid-test costs only the test server. ``synchronous_commit`` stays ``on`` (the
ledger refuses ``off``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

INFO = "postgres.json"
FAILED = "postgres-failed.txt"
START_TIMEOUT = 60


def bin_dir() -> Path | None:
    """The newest installed server's bin folder (Debian: /usr/lib/postgresql/VERSION/bin)."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return found[-1].parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_server_user(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@dataclass(frozen=True)
class PostgresServer:
    """A running server: where it listens, its folder, and its postmaster's PID."""

    port: int
    base: Path
    pid: int

    def url(self, database: str = "postgres", *, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return _not_zombie(self.pid)

    def log_tail(self) -> str:
        try:
            return (self.base / "log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"


def _not_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start(
    bin_path: Path,
    *,
    fsync: bool = False,
    listen: str = "127.0.0.1",
    netns: str | None = None,
    settings: tuple[str, ...] = (),
    trusted: str | None = None,
) -> PostgresServer:
    """initdb and start a server in a new folder; PostgresServer once it accepts work.
    ``fsync``: commits wait for the disk, as in production (the bench's); the tests' do not.
    ``netns``: the server runs in that network namespace, listening on ``listen`` (the
    partition tests' ledger host), and lets in any user from the ``trusted`` network."""
    base = Path(tempfile.mkdtemp(prefix="redrive-pg-"))
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        os.chown(base, entry.pw_uid, entry.pw_gid)
    port = 5432 if netns else _free_port()
    data, log = str(base / "data"), str(base / "log")
    options = f"-p {port} -k {base} -c listen_addresses={listen} -c max_connections=200"
    if not fsync:
        options += " -c fsync=off -c full_page_writes=off"
    options += "".join(f" -c {s}" for s in settings)
    initdb = [str(bin_path / "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-sync"]
    pg_ctl = [str(bin_path / "pg_ctl"), "-D", data, "-l", log, "-w", "-t", str(START_TIMEOUT)]
    try:
        _run(_as_server_user([*initdb, "--no-instructions", "-E", "UTF8"]))
        if trusted is not None:
            with open(base / "data" / "pg_hba.conf", "a") as hba:
                hba.write(f"host all all {trusted} trust\n")
        inside = ["ip", "netns", "exec", netns] if netns else []
        _run([*inside, *_as_server_user([*pg_ctl, "-o", options, "start"])])
    except subprocess.CalledProcessError as exc:
        log_text = (
            (base / "log").read_text(errors="replace")[-1500:] if (base / "log").exists() else ""
        )
        shutil.rmtree(base, ignore_errors=True)
        raise RuntimeError(
            f"PostgreSQL did not start: {exc.stderr.decode(errors='replace')[-1500:]} {log_text}"
        ) from None
    pid = int((base / "data" / "postmaster.pid").read_text().split()[0])
    return PostgresServer(port=port, base=base, pid=pid)


def _run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=START_TIMEOUT)


def stop(server: PostgresServer, timeout: float = 30.0) -> bool:
    """Stop by PID (SIGINT: PostgreSQL's fast shutdown; SIGKILL after ``timeout``) and
    remove its folder. False if it was already gone."""
    was_alive = server.alive()
    with contextlib.suppress(ProcessLookupError):
        os.kill(server.pid, signal.SIGINT)
        deadline = time.monotonic() + timeout
        while server.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if server.alive():
            os.kill(server.pid, signal.SIGKILL)
    shutil.rmtree(server.base, ignore_errors=True)
    return was_alive


def attach(shared: Path, bin_path: Path) -> PostgresServer:
    """The run's server under ``shared``, started by whichever worker asks first."""
    shared.mkdir(parents=True, exist_ok=True)
    with (shared / "postgres.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (shared / FAILED).exists():
            raise RuntimeError((shared / FAILED).read_text())
        if not (shared / INFO).exists():
            try:
                server = start(bin_path)
            except RuntimeError as exc:
                (shared / FAILED).write_text(str(exc))
                raise
            info = {"port": server.port, "base": str(server.base), "pid": server.pid}
            (shared / INFO).write_text(json.dumps(info))
        return read(shared)


def read(shared: Path) -> PostgresServer:
    info = json.loads((shared / INFO).read_text())
    return PostgresServer(port=info["port"], base=Path(info["base"]), pid=info["pid"])


def stop_shared(shared: Path) -> bool:
    """The controller's stop at the run's end (True: nothing started, or it was alive)."""
    if not (shared / INFO).exists():
        return True
    return stop(read(shared))
