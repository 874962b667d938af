"""Shared fixtures: fake credentials, an in-process SQS (moto) with a queue family, and a
moto server on 127.0.0.1 for end-to-end tests that run ``redrive`` as a subprocess.

Unit and end-to-end tests are apart by a mark, not by folders: ``@pytest.mark.e2e`` (or a
module's ``pytestmark``) on every test that starts another process (``redrive`` or python
as a subprocess, a moto server, a Celery worker, a bench script); the rest run in this
process (moto's ``mock_aws``, the sandbox's server thread) and ``make unit`` (``pytest -m
"not e2e"``) runs only them. A mark, because most modules test one concept both ways
(test_move.py's crash tests beside its two-operator test on a moto server): folders would
split a concept's tests across two trees. Tests using a fixture that starts a moto server
process are marked here (``pytest_collection_modifyitems``), so none can be missed.
"""

from __future__ import annotations

import compileall
import functools
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn

import boto3
import botocore.session
import postgres_server as postgres_server_module
import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, settings
from localstack_server import LocalStackServer, start_localstack
from moto import mock_aws
from postgres_server import PostgresServer
from rabbitmq_shared import (
    RABBITMQ4_ROOT,
    attach,
    require_rabbitmq4,
    stop_shared,
    trixie_node,
)

from redrive.aws.session import shared_loader
from redrive.cli import cli as redrive_group
from redrive.runs.observer import RunObserver
from redrive.sandbox.rabbitmq_node import (
    RABBITMQ_SERVER,
    ChrootRabbitMQNode,
    RabbitMQNode,
    Vhost,
    server_installed,
)

FIXTURES = Path(__file__).parent / "fixtures"
#: The workerinput key naming the folder of the run's shared RabbitMQ node.
SHARED_RABBITMQ = "redrive_shared_rabbitmq"
#: The workerinput key naming the folder of the run's shared PostgreSQL server.
SHARED_POSTGRES = "redrive_shared_postgres"


def _shared_data_loader(self: botocore.session.Session) -> None:
    self._components.lazy_register_component("data_loader", lambda: shared_loader(self))


# Every botocore session a test process opens (moto's, boto3's default one that moto resets
# for each test, the tests' own) reads botocore's models through the one loader redrive's
# sessions share (redrive/aws/session.py), instead of parsing them again per session: that
# was a third of the in-process tests' CPU.
botocore.session.Session._register_data_loader = _shared_data_loader  # type: ignore[method-assign]


def _remember_moto_names() -> None:
    """moto turns every parameter name of every request it serves from CamelCase into
    snake_case again, character by character (~70 calls a request: a tenth of the in-process
    tests' CPU). The function is pure: remember its answers, in every moto module that has
    imported it and for those that will."""
    import moto.core.utils

    original = moto.core.utils.camelcase_to_underscores
    remembered = functools.lru_cache(maxsize=65536)(original)
    for name, module in list(sys.modules.items()):
        if (
            name.startswith("moto")
            and getattr(module, "camelcase_to_underscores", None) is original
        ):
            module.camelcase_to_underscores = remembered  # type: ignore[attr-defined]


_remember_moto_names()
REGION = "us-east-1"

#: CI services set CI=true. There a real component the suite needs (RabbitMQ, Chromium) must
#: be there: a missing one fails its tests, where locally they skip and say why.
IN_CI: Final = os.environ.get("CI", "").strip().lower() == "true"

# The suite runs 4 xdist workers on 2 cores beside moto servers: how fast Hypothesis makes
# inputs says nothing about redrive there, so its timing checks are off (examples stay).
settings.register_profile("redrive", suppress_health_check=[HealthCheck.too_slow], deadline=None)
# In CI the examples are the same on every run (a landing never fails by a draw, and a fresh
# clone has no example database to replay); locally each run explores new ones.
settings.register_profile(
    "redrive-ci", settings.get_profile("redrive"), derandomize=True, database=None
)
settings.load_profile("redrive-ci" if IN_CI else "redrive")


def missing_component(reason: str, *, ci: bool = IN_CI) -> NoReturn:
    """A real component a test needs is not installed: skip with ``reason`` locally, fail
    under CI, where a skip would pass the run without the tests that need it."""
    if ci:
        pytest.fail(f"{reason} (CI=true: a missing real component fails the run)", pytrace=False)
    pytest.skip(reason)


def skip_unless_installed(installed: bool, reason: str) -> pytest.MarkDecorator:
    """``skipif`` for a missing real component, except under CI: there the test runs, and
    fails on what is missing."""
    return pytest.mark.skipif(not installed and not IN_CI, reason=reason)


# Fixtures that start a moto server process (here and in test modules): a test using one is
# end-to-end, whether or not it says so.
_SERVER_FIXTURES = frozenset(
    {
        *("moto_server", "server", "serial_server", "serial_moto", "localstack_endpoint"),
        *("rabbitmq_node", "rabbitmq_vhost", "rabbitmq3_node", "rabbitmq4_node"),
        "rabbitmq4_vhost",
        *("postgres_server", "postgres_schema", "postgres_url"),
    }
)


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile redrive, the tests and the bench scripts once, in the controller, before
    any test starts a process. Where PYTHONDONTWRITEBYTECODE is set (it is on this project's
    machines and CI), no process writes ``__pycache__``, so each ``redrive`` subprocess
    compiled all of redrive from source again: 0.4 s of CPU of the 0.95 s a ``redrive
    --help`` took, over the suite's ~450 subprocesses. Python still reads what is written
    here (compileall writes whatever the variable says), and checks it against the source's
    mtime, so an edited file is compiled afresh as before."""
    if hasattr(config, "workerinput"):
        return
    root = Path(__file__).parent.parent
    for folder in ("redrive", "tests", "bench"):
        compileall.compile_dir(root / folder, quiet=1, workers=1)
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_SharedNodeOfTheRun(), "redrive-shared-rabbitmq")
        if (config.getoption("numprocesses", None) or 0) and not config.getoption("collectonly"):
            rewrite_tests_ahead(root / "tests")


def rewrite_tests_ahead(tests: Path) -> None:
    """Have pytest's rewritten test modules cached before the xdist workers collect. pytest
    rewrites each test module's asserts on import and caches the result in ``__pycache__``
    only where bytecode may be written, which PYTHONDONTWRITEBYTECODE forbids here: each of
    ``make suite``'s four workers rewrote all of them again, ~10 s of CPU a worker (of its
    ~14.5 s collection). So two collect-only runs, each over half the modules and allowed to
    write, cache them first (both cores at once) and the workers read what they wrote; an
    edited module is rewritten afresh (the cache is checked against its source)."""
    tag = f"{sys.implementation.cache_tag}-pytest-{pytest.__version__}"
    modules = sorted(tests.glob("test_*.py"))
    stale = [m for m in [tests / "conftest.py", *modules] if not _rewrite_cached(m, tag)]
    if not stale:
        return
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    runs = [
        subprocess.Popen(
            [*cmd, *map(str, half)],
            cwd=tests.parent,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for half in (modules[0::2], modules[1::2])
    ]
    for run in runs:
        # Any failure here is the workers' to report, as they collect again.
        run.wait()


def _rewrite_cached(module: Path, tag: str) -> bool:
    cached = module.parent / "__pycache__" / f"{module.stem}.{tag}.pyc"
    return cached.exists() and cached.stat().st_mtime >= module.stat().st_mtime


class _SharedNodeOfTheRun:
    """The controller's part in one RabbitMQ node for every xdist worker
    (tests/rabbitmq_shared.py): it names the folder the workers share, and stops the node
    once they are all done. Registered only under xdist (its hook is xdist's)."""

    def __init__(self) -> None:
        self.shared = Path(tempfile.mkdtemp(prefix="redrive-tests-rabbitmq-"))
        # The PostgreSQL server's (tests/postgres_server.py), shared the same way.
        self.shared_postgres = Path(tempfile.mkdtemp(prefix="redrive-tests-postgres-"))

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[SHARED_RABBITMQ] = str(self.shared)
        node.workerinput[SHARED_POSTGRES] = str(self.shared_postgres)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        for version, shared in (("3.10", self.shared), ("4.0", self.shared / "4.0")):
            if not stop_shared(shared):
                # Too late to fail a test: the run's summary is printed; say it where it shows.
                sys.stderr.write(f"the shared RabbitMQ {version} node had exited early\n")
        shutil.rmtree(self.shared, ignore_errors=True)
        if not postgres_server_module.stop_shared(self.shared_postgres):
            sys.stderr.write("the shared PostgreSQL server had exited before the run's end\n")
        shutil.rmtree(self.shared_postgres, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)
    # End-to-end tests first, then the rest in their order: with `make suite`'s small chunks
    # (--maxschedchunk) xdist hands tests out nearly as a queue, so the long ones (a runbook
    # rehearsed twice takes minutes) start early and the short ones fill the end. In
    # collection order, the last worker ran a rehearsal for 100 s after the others had
    # finished, one of two cores idle.
    items.sort(key=lambda item: item.get_closest_marker("e2e") is None)


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake credentials and a private state dir, so no test reaches AWS or the user's files."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "CELERY_", "REDRIVE_")):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config-absent"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials-absent"))
    monkeypatch.setenv("REDRIVE_STATE_DIR", str(tmp_path / "state"))
    # Tables fit COLUMNS when it is set (pytest-xdist's workers set it to 80): a test that
    # wants a width sets it itself.
    monkeypatch.delenv("COLUMNS", raising=False)


@dataclass
class Family:
    """A source queue and its DLQ, as the built-in layout's ``checkout`` family."""

    client: Any
    queue_url: str
    dlq_url: str
    dlq_arn: str

    def send_to_dlq(
        self, body: str, attributes: dict[str, Any] | None = None, **kwargs: Any
    ) -> str:
        response = self.client.send_message(
            QueueUrl=self.dlq_url,
            MessageBody=body,
            MessageAttributes=attributes or {},
            **kwargs,
        )
        return str(response["MessageId"])

    def depth(self, url: str | None = None) -> tuple[int, int]:
        attrs = self.client.get_queue_attributes(
            QueueUrl=url or self.dlq_url,
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
            ],
        )["Attributes"]
        return (
            int(attrs["ApproximateNumberOfMessages"]),
            int(attrs["ApproximateNumberOfMessagesNotVisible"]),
        )

    def drain(self, url: str) -> list[dict[str, Any]]:
        """Every message of a queue (deleting them), for assertions."""
        out: list[dict[str, Any]] = []
        while True:
            response = self.client.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=10,
                MessageAttributeNames=["All"],
                MessageSystemAttributeNames=["All"],
                VisibilityTimeout=30,
            )
            messages = response.get("Messages", [])
            if not messages:
                return out
            for message in messages:
                out.append(message)
                self.client.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


def make_family(client: Any, queue: str = "onion-checkout", *, max_receive: int = 5) -> Family:
    fifo = queue.endswith(".fifo")
    base = queue.removesuffix(".fifo")
    dlq_name = f"{base}-dlq.fifo" if fifo else f"{base}-dlq"
    dlq_attrs = {"MessageRetentionPeriod": str(14 * 86400)}
    if fifo:
        dlq_attrs["FifoQueue"] = "true"
    dlq_url = client.create_queue(QueueName=dlq_name, Attributes=dlq_attrs)["QueueUrl"]
    dlq_arn = client.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    attrs = {
        "RedrivePolicy": json.dumps(
            {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": max_receive}
        )
    }
    if fifo:
        attrs["FifoQueue"] = "true"
    queue_url = client.create_queue(QueueName=queue, Attributes=attrs)["QueueUrl"]
    return Family(client, queue_url, dlq_url, dlq_arn)


# One lock for every in-process moto SQS call that reads and changes messages.
_MOTO_SQS_LOCK = threading.RLock()
_MOTO_SQS_CALLS = (
    "send_message",
    "send_message_batch",
    "receive_message",
    "delete_message",
    "delete_message_batch",
    "change_message_visibility",
    "change_message_visibility_batch",
    "purge_queue",
)


@pytest.fixture(autouse=True)
def atomic_moto_sqs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each SQS call is atomic on a queue; in-process moto's are not, and tests run several
    worker threads on it. Seen in this suite: two concurrent ReceiveMessage calls handed one
    message to both receivers within its visibility timeout (both receives' answers held
    it, with receive counts 1 and 2), and a DeleteMessage rebuilding the queue's message
    list from a snapshot can bring back messages another thread deleted meanwhile. Serialised
    here, as test_ledger_dynamodb.py does for DynamoDB's conditional PutItem. (Real SQS may
    still deliver a message twice, rarely: tests that mean it inject that themselves.)"""
    from moto.sqs.models import SQSBackend

    for name in _MOTO_SQS_CALLS:
        original = getattr(SQSBackend, name)

        def atomic(*args: Any, __original: Any = original, **kwargs: Any) -> Any:
            with _MOTO_SQS_LOCK:
                return __original(*args, **kwargs)

        monkeypatch.setattr(SQSBackend, name, atomic)


class Redelivery:
    """SQS's at-least-once delivery, made to happen: the first message a run deletes comes
    once more, in the next receive that hands out anything. Give ``sqs()`` as the factory."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.lock = threading.Lock()
        self.received: dict[str, Any] = {}
        self.deleted: Any = None
        self.delivered_again = 0

    def sqs(self) -> Any:
        from redrive.broker.sqs import SqsBroker

        redelivery = self

        class Redelivering(SqsBroker):
            def receive(self, url: str, **kwargs: Any) -> list[Any]:
                got: list[Any] = super().receive(url, **kwargs)
                with redelivery.lock:
                    redelivery.received.update((m.tag, m) for m in got)
                    if got and redelivery.deleted is not None and not redelivery.delivered_again:
                        redelivery.delivered_again += 1
                        got.append(redelivery.deleted)
                return got

            def delete_batch(self, url: str, handles: Any) -> Any:
                result = super().delete_batch(url, handles)
                with redelivery.lock:
                    if redelivery.deleted is None and result.ok:
                        handle = handles[sorted(result.ok)[0]]
                        redelivery.deleted = redelivery.received[handle]
                return result

        return Redelivering(self.client)


class ParkOneWorker(RunObserver[Any]):
    """Records each progress report's counts (``counts`` reads them from a result). The
    first worker to reach ``park`` (a step, or ``"plan"``: its first planned message) waits
    there until another worker reports progress: a moment, reached without timing, when one
    worker's batch is matched and not yet done while another reports."""

    def __init__(self, park: str, counts: Callable[[Any], tuple[int, ...]]) -> None:
        self.park = park
        self.counts = counts
        self.reports: list[tuple[int, ...]] = []
        self.parked: threading.Thread | None = None
        self.heard_while_parked = threading.Event()
        self._lock = threading.Lock()

    def _arrive(self) -> None:
        with self._lock:
            if self.parked is not None:
                return
            self.parked = threading.current_thread()
        assert self.heard_while_parked.wait(60), "no other worker reported progress"

    def on_step(self, step: str) -> None:
        if step == self.park:
            self._arrive()

    def on_plan(self, item: Any) -> None:
        if self.park == "plan":
            self._arrive()

    def on_progress(self, result: Any) -> None:
        with self._lock:
            self.reports.append(self.counts(result))
            if self.parked is not None and self.parked is not threading.current_thread():
                self.heard_while_parked.set()


@pytest.fixture
def sqs_client(aws_env: None) -> Iterator[Any]:
    with mock_aws():
        yield boto3.client("sqs", region_name=REGION)


class SqsClock:
    """In-process SQS's clock (moto's visibility timeouts, delays and retention), wound by
    hand: a lease runs out when the test says so, however slow the machine. Pass it as the
    ``clock`` of the redrive objects that date holds (``SqsBroker``, ``DlqScan``) so that both
    sides keep the same time.

    Every reading is a microsecond after the last, because moto shows a released message
    (visibility 0) only once its clock has moved past the release. A long poll on an empty
    queue would never end on it: unit tests poll short (``no_long_polling``)."""

    def __init__(self) -> None:
        self.now = time.time()
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.now += 1e-6
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


@pytest.fixture
def sqs_clock(sqs_client: Any, monkeypatch: pytest.MonkeyPatch) -> SqsClock:
    """The in-process SQS on a :class:`SqsClock` from now on."""
    from moto.sqs import models

    clock = SqsClock()
    real_unix_time = models.unix_time

    def unix_time(dt: Any = None) -> float:
        return clock() if dt is None else real_unix_time(dt)

    monkeypatch.setattr(models, "unix_time", unix_time)
    monkeypatch.setattr(models, "unix_time_millis", lambda dt=None: unix_time(dt) * 1000.0)
    return clock


def wait_until(
    condition: Callable[[], object], what: str, *, timeout: float = 60.0, every: float = 0.01
) -> None:
    """Wait for ``condition``: the bound is for a hang, not a pace (a loaded machine may be
    a hundred times slower than this one's usual 10 ms)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(every)


@pytest.fixture
def family(sqs_client: Any) -> Family:
    """The built-in ``checkout`` family: onion-checkout and its DLQ onion-checkout-dlq."""
    return make_family(sqs_client)


@pytest.fixture
def all_families(sqs_client: Any) -> dict[str, Family]:
    return {
        "checkout": make_family(sqs_client, "onion-checkout"),
        "default": make_family(sqs_client, "onion"),
        "progress": make_family(sqs_client, "onion-progress"),
    }


@pytest.fixture
def samples() -> list[dict[str, Any]]:
    lines = (FIXTURES / "celery-5.7-sqs-samples.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


# -- a real moto server on 127.0.0.1, for end-to-end tests ---------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class MotoServer:
    endpoint_url: str
    process: subprocess.Popen[bytes]
    log: Path

    def client(self, service: str = "sqs") -> Any:
        return boto3.client(service, endpoint_url=self.endpoint_url, region_name=REGION)

    def reset(self) -> None:
        import urllib.request

        urllib.request.urlopen(
            urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST"),
            timeout=10,
        ).close()

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT")}
        env["AWS_ENDPOINT_URL"] = self.endpoint_url
        return env


def start_moto_server(log: Path, *, serial: bool = False) -> MotoServer:
    """moto's server in its own process; ``serial`` serves one request at a time (moto's
    threaded server can hand one message to two concurrent receivers)."""
    port = free_port()
    cmd = [sys.executable, "-m", "redrive.sandbox", "--bare", "--port", str(port)]
    if serial:
        cmd.append("--serial")
    handle = log.open("wb")
    process = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT)
    handle.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return MotoServer(url, process, log)
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"moto server exited: {log.read_text()[-2000:]}") from None
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("moto server did not start within 120 s")


def load_fast_sqs() -> Any:
    """bench/fast_sqs.py as a module (bench/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(
        "fast_sqs", FIXTURES.parent.parent / "bench" / "fast_sqs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, signed by itself, in ``directory`` (the TLS
    tests' servers on loopback)."""
    import ipaddress
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = start_moto_server(tmp_path_factory.mktemp("moto") / "server.log")
    yield server
    server.process.terminate()
    server.process.wait(10)


@pytest.fixture
def server(moto_server: MotoServer) -> MotoServer:
    """The session's moto server, emptied for this test."""
    moto_server.reset()
    return moto_server


@pytest.fixture(scope="session")
def localstack_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStackServer]:
    """LocalStack's SQS on 127.0.0.1 (tests/localstack_server.py), one per session: under
    xdist one per worker, each on its own free port and in its own temp dir (HOME
    included). Fails, never skips, when LocalStack is not installed (``make localstack``).
    Queues outlive a test: name them per test, or empty it with ``reset_sqs``."""
    server = start_localstack(tmp_path_factory.mktemp("localstack"))
    yield server
    crashed = server.process.poll()
    server.stop()
    assert crashed is None, (
        f"LocalStack exited ({crashed}) during the session:\n{server.log_tail()}"
    )


@pytest.fixture(scope="session")
def rabbitmq3_node(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[RabbitMQNode]:
    """A private RabbitMQ node on free loopback ports (redrive/sandbox/rabbitmq_node.py), one
    per run: under xdist every worker attaches to one node (tests/rabbitmq_shared.py), which
    the first to ask starts and the controller stops by PID at the run's end; without xdist
    this process starts it when a test first asks and stops it at the session's end. Tests
    share it: each takes a vhost of its own (``rabbitmq_vhost``), and none changes a
    node-wide setting. Skips when Debian's rabbitmq-server is not installed (``make test``
    installs it when it runs as root with apt-get); fails instead under CI=true."""
    if not server_installed():
        missing_component(
            f"no RabbitMQ ({RABBITMQ_SERVER} is missing): apt-get install rabbitmq-server"
        )
    workerinput = getattr(request.config, "workerinput", {})
    if SHARED_RABBITMQ in workerinput:
        shared = attach(Path(workerinput[SHARED_RABBITMQ]))
        yield shared
        assert shared.alive(), f"RabbitMQ exited during the run: {shared.log_tail()}"
        return
    node = RabbitMQNode(tmp_path_factory.mktemp("rabbitmq")).start()
    yield node
    assert node.process is not None
    crashed = node.process.poll()
    node.stop()
    assert crashed is None, f"RabbitMQ exited ({crashed}) during the session: {node.log_tail()}"


@pytest.fixture(scope="session")
def rabbitmq4_node(request: pytest.FixtureRequest) -> Iterator[RabbitMQNode]:
    """A private RabbitMQ 4.0.5 node (Debian 13's package, Erlang 27), run from the root
    ``make rabbitmq4`` builds once outside the clone (tests/rabbitmq_shared.py,
    RABBITMQ4_ROOT), shared by the xdist workers as the 3.10 node is. Where that root is
    missing it skips with the reason, and fails under ``CI=true``: CI must test 4.0."""
    require_rabbitmq4()
    workerinput = getattr(request.config, "workerinput", {})
    if SHARED_RABBITMQ in workerinput:
        shared = attach(Path(workerinput[SHARED_RABBITMQ]) / "4.0", trixie_node)
        yield shared
        assert shared.alive(), f"RabbitMQ 4.0 exited during the run: {shared.log_tail()}"
        return
    node = ChrootRabbitMQNode(RABBITMQ4_ROOT)
    try:
        node.start()
        yield node
        assert node.process is not None
        crashed = node.process.poll()
        assert crashed is None, f"RabbitMQ 4.0 exited ({crashed}): {node.log_tail()}"
    finally:
        node.stop()
        node.remove()


#: The RabbitMQ versions of the suite, and the fixture of each one's node.
RABBITMQ_NODES = {"3.10": "rabbitmq3_node", "4.0": "rabbitmq4_node"}

#: On every tested RabbitMQ version: ``@on_both_rabbitmq`` on a test (or in a module's
#: pytestmark) that uses ``rabbitmq_node`` or ``rabbitmq_vhost``; ``rabbitmq_version`` says
#: which one a test runs on. Without it, a test runs on 3.10.
on_both_rabbitmq = pytest.mark.parametrize(
    "rabbitmq_node", list(RABBITMQ_NODES), indirect=True, ids=["rmq3.10", "rmq4.0"]
)
on_rabbitmq4 = pytest.mark.parametrize("rabbitmq_node", ["4.0"], indirect=True, ids=["rmq4.0"])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module's ``RABBITMQ_VERSIONS`` (e.g. ``("4.0",)``: the command and rendering tests,
    on the version users run) puts each of its tests that uses ``rabbitmq_node`` or
    ``rabbitmq_vhost`` on those nodes, as ``@on_rabbitmq4`` would, where the test does not
    say its versions itself; the tests that use neither are left as they are."""
    versions = getattr(metafunc.module, "RABBITMQ_VERSIONS", None)
    if versions is None or "rabbitmq_node" not in metafunc.fixturenames:
        return
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0]
        if "rabbitmq_node" in (names.split(",") if isinstance(names, str) else names):
            return
    ids = [f"rmq{version}" for version in versions]
    metafunc.parametrize("rabbitmq_node", list(versions), indirect=True, ids=ids)


@pytest.fixture(scope="session")
def rabbitmq_node(request: pytest.FixtureRequest) -> RabbitMQNode:
    """The node of the version a test is parametrized with (3.10 when it is not)."""
    node: RabbitMQNode = request.getfixturevalue(RABBITMQ_NODES[getattr(request, "param", "3.10")])
    return node


@pytest.fixture
def rabbitmq_version(rabbitmq_node: RabbitMQNode, request: pytest.FixtureRequest) -> str:
    """``"3.10"`` or ``"4.0"``: the version the test's node runs (its parameter, checked
    against what the node's management API says)."""
    callspec = getattr(request.node, "callspec", None)
    version: str = callspec.params.get("rabbitmq_node", "3.10") if callspec else "3.10"
    said = rabbitmq_node.server_version()
    assert said.startswith(f"{version}."), (version, said)
    return version


@pytest.fixture(scope="session")
def postgres_server(request: pytest.FixtureRequest) -> Iterator[PostgresServer]:
    """A private PostgreSQL server on a free loopback port (tests/postgres_server.py), one
    per run: under xdist every worker attaches to the one the first to ask starts (the
    controller stops it by PID at the run's end); without xdist this process starts and
    stops it. Tests share it: each takes a schema of its own (``postgres_url``). Skips
    when Debian's postgresql is not installed (``make test`` installs it as root with
    apt-get), but fails under CI=true: there it must run."""
    bin_path = postgres_server_module.bin_dir()
    if bin_path is None:
        reason = "no PostgreSQL (/usr/lib/postgresql/*/bin/initdb): apt-get install postgresql"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    workerinput = getattr(request.config, "workerinput", {})
    if SHARED_POSTGRES in workerinput:
        shared = postgres_server_module.attach(Path(workerinput[SHARED_POSTGRES]), bin_path)
        yield shared
        assert shared.alive(), f"PostgreSQL exited during the run: {shared.log_tail()}"
        return
    server = postgres_server_module.start(bin_path)
    yield server
    alive = server.alive()
    postgres_server_module.stop(server)
    assert alive, "PostgreSQL exited during the session"


def new_schema(server: PostgresServer, name: str, *settings: str) -> str:
    """A new, empty schema ``name`` in the server's ``postgres`` database: the URL of a
    session that works in it (libpq's ``options``: its search_path, and ``settings`` such
    as ``synchronous_commit=off``). A schema, not a database: 0.5 ms against CREATE
    DATABASE's 80 ms or more."""
    import psycopg

    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{name}"')
    return schema_url(server, name, *settings)


def schema_url(server: PostgresServer, name: str, *settings: str) -> str:
    options = " ".join(f"-c{s}" for s in (f"search_path={name}", *settings))
    # %20 between settings: libpq decodes percent escapes, never "+" (urlencode's space).
    query = urllib.parse.urlencode({"options": options}, quote_via=urllib.parse.quote)
    return f"{server.url()}?{query}"


def drop_schema(server: PostgresServer, name: str) -> None:
    import psycopg

    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def postgres_schema(postgres_server: PostgresServer) -> Iterator[str]:
    """A schema of this test's own on the run's server (dropped afterwards), no ledger in
    it yet: its name (``postgres_url`` is the URL of a session in it)."""
    name = f"t_{os.getpid()}_{os.urandom(6).hex()}"
    new_schema(postgres_server, name)
    yield name
    drop_schema(postgres_server, name)


@pytest.fixture
def postgres_url(postgres_server: PostgresServer, postgres_schema: str) -> str:
    """The URL of a session in this test's own schema (user postgres, no password: the
    server trusts loopback)."""
    return schema_url(postgres_server, postgres_schema)


@pytest.fixture
def rabbitmq_vhost(rabbitmq_node: RabbitMQNode, request: pytest.FixtureRequest) -> Iterator[Vhost]:
    """A fresh vhost on the session's node for this test (deleted afterwards, with every
    queue, exchange and message on it): tests never see each other's queues."""
    name = f"t-{request.node.name[:60]}-{os.urandom(4).hex()}"
    vhost = rabbitmq_node.create_vhost(name)
    yield vhost
    rabbitmq_node.delete_vhost(name)


@pytest.fixture
def rabbitmq4_vhost(
    rabbitmq4_node: RabbitMQNode, request: pytest.FixtureRequest
) -> Iterator[Vhost]:
    """``rabbitmq_vhost`` on the 4.0 node, for a fixture that picks its broker itself
    (tests/test_broker_contract.py's backends)."""
    name = f"t4-{request.node.name[:60]}-{os.urandom(4).hex()}"
    vhost = rabbitmq4_node.create_vhost(name)
    yield vhost
    rabbitmq4_node.delete_vhost(name)


@pytest.fixture(autouse=True)
def ctrl_c_as_a_terminal_delivers_it() -> Iterator[None]:
    """Each test starts with Python's own SIGINT handler, and so does every process it
    starts (a disposition of SIG_IGN is inherited across exec, and Python then keeps
    ignoring Ctrl-C). Under load, a test worker once ran a real-Ctrl-C test with SIGINT
    ignored: the ledger's wait was never interrupted and a prompt in a child ignored ten
    SIGINTs. Whatever left it so, no test may depend on what an earlier one left behind."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def no_long_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process moto really waits out WaitTimeSeconds on an empty queue; unit tests
    need not (its short poll sees every message). End-to-end tests keep the real wait."""
    from redrive.dlq import scan

    monkeypatch.setattr(scan, "RECEIVE_WAIT_SECONDS", 0)


# -- the CLI, through click's runner ----------------------------------------------------------


class Cli:
    """redrive's click group run in-process by click's CliRunner (the ``cli`` fixture): every
    CLI test invokes the command this one way, as ``redrive`` (the usage lines say so)."""

    def __call__(
        self,
        *args: str,
        input: str | None = None,
        env: Mapping[str, str | None] | None = None,
        catch_exceptions: bool = True,
        charset: str = "utf-8",
    ) -> Result:
        """``charset``: the encoding of the runner's stdout (a terminal's, or ascii)."""
        return CliRunner(charset=charset).invoke(
            redrive_group,
            list(args),
            input=input,
            env=env,
            prog_name="redrive",
            catch_exceptions=catch_exceptions,
        )

    def raising(self, *args: str, input: str | None = None) -> Result:
        """Run a command letting an unexpected exception out as itself, with its traceback."""
        return self(*args, input=input, catch_exceptions=False)

    def ok(
        self,
        *args: str,
        input: str | None = None,
        env: Mapping[str, str | None] | None = None,
        code: int = 0,
    ) -> Result:
        """Run a command that must end with ``code`` (0: success), without a traceback."""
        result = self(*args, input=input, env=env)
        assert result.exit_code == code, (result.output, result.exception)
        assert "Traceback" not in result.output
        return result


@pytest.fixture
def cli() -> Cli:
    return Cli()


def as_json(result: Result) -> Any:
    return json.loads(result.stdout)


# -- SQS adapters as the CLI makes them -----------------------------------------------------------


@pytest.fixture
def sqs_for(sqs_client: Any) -> Callable[[str | None], Any]:
    """What the CLI does: one client per call, through AwsSettings (inside mock_aws)."""
    from redrive.aws.session import AwsSettings
    from redrive.broker.sqs import open_sqs

    settings = AwsSettings(region=REGION)
    return lambda region: open_sqs(settings, region=region)


def unreachable() -> Callable[[str | None], Any]:
    """SQS on a closed port of 127.0.0.1: every call fails to connect, at once."""
    from botocore.config import Config

    from redrive.broker.sqs import SqsBroker

    url = f"http://127.0.0.1:{free_port()}"
    config = Config(retries={"mode": "standard", "max_attempts": 1}, connect_timeout=1)
    return lambda region: SqsBroker(
        boto3.client("sqs", endpoint_url=url, region_name=REGION, config=config)
    )
