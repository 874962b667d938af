"""The lean SQS path answers as botocore does (issue 25): differential tests.

Every per-message operation is called both ways, botocore's client method and
:meth:`LeanTransport.call` on a transport built from that same client, against the same
server (moto's server, bench/fast_sqs.py, LocalStack), and the two outcomes must be equal:
the parsed answer (less what differs per call: request ids, receipt handles, message ids,
receive counts) or the exception (its class, its ``response["Error"]``, its status, and the
one line redrive words from it).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import socket
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import botocore.auth
import botocore.credentials
import botocore.exceptions
import botocore.session
import pytest
from botocore.config import Config
from botocore.retries import standard
from conftest import free_port, load_fast_sqs, self_signed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from localstack_server import LocalStackServer

from redrive.aws.answers import ForeignAnswer, check_answers
from redrive.aws.errors import aws_error
from redrive.aws.session import AwsSettings
from redrive.broker.base import SendEntry
from redrive.broker.sqs import SqsBroker
from redrive.broker.sqs.lean import LeanTransport, lean_calls
from redrive.errors import AwsUnavailable, SendInDoubt, UsageProblem

BENCH = Path(__file__).resolve().parent.parent / "bench"
SERVERS = [
    "moto",
    "fast",
    pytest.param("localstack", marks=pytest.mark.e2e),
]
METHODS = {
    "ReceiveMessage": "receive_message",
    "SendMessageBatch": "send_message_batch",
    "DeleteMessageBatch": "delete_message_batch",
    "ChangeMessageVisibilityBatch": "change_message_visibility_batch",
}
# What differs from one call to the next whoever makes it.
_PER_CALL = frozenset({"ReceiptHandle", "MessageId", "SequenceNumber"})
_PER_RECEIVE = frozenset({"ApproximateReceiveCount", "ApproximateFirstReceiveTimestamp"})


@pytest.fixture(scope="module")
def fast_endpoint() -> Iterator[str]:
    server = load_fast_sqs().start()
    yield str(server.endpoint_url)
    server.shutdown()
    server.server_close()


@pytest.fixture(params=SERVERS)
def endpoint(request: pytest.FixtureRequest, aws_env: None) -> str:
    if request.param == "moto":
        return str(request.getfixturevalue("server").endpoint_url)
    if request.param == "fast":
        return str(request.getfixturevalue("fast_endpoint"))
    server: LocalStackServer = request.getfixturevalue("localstack_endpoint")
    return server.endpoint_url


class Both:
    """One botocore client as redrive configures it (answers checked) and a lean transport
    built from it."""

    def __init__(self, endpoint_url: str, **config: Any) -> None:
        self.client = client_of(endpoint_url, **config)
        self.lean = LeanTransport(self.client)

    def queue(self, *, fifo: bool = False) -> str:
        name = f"lean-{uuid.uuid4().hex[:12]}" + (".fifo" if fifo else "")
        attributes = {"FifoQueue": "true"} if fifo else {}
        return str(self.client.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"])

    def botocore(self, operation: str, params: dict[str, Any]) -> Any:
        return outcome(operation, lambda: getattr(self.client, METHODS[operation])(**params))

    def lean_call(self, operation: str, params: dict[str, Any]) -> Any:
        return outcome(operation, lambda: self.lean.call(operation, params))

    def equal(self, operation: str, params: dict[str, Any]) -> Any:
        """Both outcomes of a call that changes nothing (an error, a refused entry)."""
        theirs, ours = self.botocore(operation, params), self.lean_call(operation, params)
        assert ours == theirs
        return ours

    def fill(self, url: str, entries: list[dict[str, Any]]) -> None:
        for start in range(0, len(entries), 10):
            answer = self.client.send_message_batch(QueueUrl=url, Entries=entries[start:][:10])
            assert not answer.get("Failed"), answer

    def receives_equal(self, url: str, count: int) -> list[Any]:
        """Receive every message both ways (hidden for 0 s, so both see them all)."""
        params = {
            "QueueUrl": url,
            "MaxNumberOfMessages": 10,
            "VisibilityTimeout": 0,
            "WaitTimeSeconds": 0,
            "MessageSystemAttributeNames": ["All"],
            "MessageAttributeNames": ["All"],
        }
        theirs = self._all(lambda: self.botocore("ReceiveMessage", params), count)
        ours = self._all(lambda: self.lean_call("ReceiveMessage", params), count)
        assert ours == theirs
        return ours

    @staticmethod
    def _all(receive: Callable[[], Any], count: int) -> list[Any]:
        seen: dict[str, Any] = {}
        for _ in range(50):  # a bound for a hang: a short poll may see part of a queue
            kind, answer = receive()
            assert kind == "ok", answer
            for message in answer.get("Messages", []):
                group = message.get("Attributes", {}).get("MessageGroupId", "")
                seen[f"{message['Body']}{message.get('MessageAttributes')!r}{group}"] = message
            if len(seen) >= count:
                break
        assert len(seen) == count
        return [seen[key] for key in sorted(seen)]


def client_of(endpoint_url: str, **config: Any) -> Any:
    if config:
        import boto3

        client = boto3.client(
            "sqs",
            endpoint_url=endpoint_url,
            region_name="us-east-1",
            config=Config(parameter_validation=False, **config),
        )
    else:
        client = AwsSettings(endpoint_url=endpoint_url, region="us-east-1").client("sqs")
    check_answers(client)
    return client


def outcome(operation: str, call: Callable[[], Any]) -> Any:
    """A call's outcome, less what differs per call."""
    try:
        answer = call()
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        response = getattr(exc, "response", None) or {}
        return (
            type(exc),
            response.get("Error"),
            response.get("ResponseMetadata", {}).get("HTTPStatusCode"),
            str(aws_error(exc, operation, resource="q")),
        )
    return "ok", _stable(answer)


def _stable(value: Any) -> Any:
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "ResponseMetadata":
                out[key] = {"HTTPStatusCode": item["HTTPStatusCode"]}
            elif key in _PER_CALL:
                out[key] = bool(item)
            elif key == "Attributes" and isinstance(item, dict):
                out[key] = {k: (v if k not in _PER_RECEIVE else bool(v)) for k, v in item.items()}
            else:
                out[key] = _stable(item)
        return out
    if isinstance(value, list):
        return [_stable(item) for item in value]
    return value


def entry(i: int, body: str, attributes: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"Id": str(i), "MessageBody": body}
    if attributes:
        out["MessageAttributes"] = attributes
    return out


ATTRIBUTES: dict[str, Any] = {
    "s": {"DataType": "String", "StringValue": "ünï €"},
    "n": {"DataType": "Number", "StringValue": "-12.5e3"},
    "b": {"DataType": "Binary", "BinaryValue": bytes(range(256))},
    "custom": {"DataType": "String.celery-task", "StringValue": "tasks.add"},
    "count": {"DataType": "Number.int", "StringValue": "7"},
    "blob": {"DataType": "Binary.gzip", "BinaryValue": b"\x1f\x8b\x00"},
}


# -- success, attribute types, unicode, large bodies, FIFO --------------------------------------


def test_sends_and_receives_of_every_attribute_type_are_equal(endpoint: str) -> None:
    both = Both(endpoint)
    url = both.queue()
    entries = [
        entry(0, '{"task": "ünïcode € 😀"}', ATTRIBUTES),
        entry(1, "x" * 1000),
        entry(2, "\t\n\r plain"),
    ]
    kinds = [both.botocore("SendMessageBatch", {"QueueUrl": url, "Entries": entries})]
    kinds.append(both.lean_call("SendMessageBatch", {"QueueUrl": url, "Entries": entries}))
    assert kinds[0] == kinds[1] and kinds[0][0] == "ok"
    messages = both.receives_equal(url, 3)
    assert {
        bytes(m.get("MessageAttributes", {}).get("b", {}).get("BinaryValue", b"")) for m in messages
    } >= {bytes(range(256))}


@pytest.mark.parametrize("limit", [262_144, 1_048_576], ids=["256KiB", "1MiB"])
def test_the_largest_body_goes_and_comes_back_equal(endpoint: str, limit: int) -> None:
    both = Both(endpoint)
    url = both.queue()
    both.client.set_queue_attributes(QueueUrl=url, Attributes={"MaximumMessageSize": str(limit)})
    unit = "é" * 1000 + "a" * 48  # 2,048 bytes of UTF-8
    body = unit * (limit // 2048)
    assert len(body.encode()) == limit
    params = {"QueueUrl": url, "Entries": [entry(0, body)]}
    sent = both.botocore("SendMessageBatch", params)
    assert sent == both.lean_call("SendMessageBatch", params)
    if sent[0] != "ok" or sent[1].get("Failed"):  # a server without 1 MiB messages: alike
        return
    (message,) = both.receives_equal(url, 1)  # the two copies are alike: seen as one
    assert message["Body"] == body


def test_fifo_fields_are_equal(request: pytest.FixtureRequest, endpoint: str) -> None:
    if "[fast]" in request.node.name:
        pytest.skip("bench/fast_sqs.py serves a .fifo queue as a standard one (its docstring)")
    both = Both(endpoint)
    answers, received = [], []
    # One message a queue: what a FIFO group hands out next is then the same for both.
    for call in (both.botocore, both.lean_call):
        url = both.queue(fifo=True)
        sent = {**entry(0, "fifo"), "MessageGroupId": "g", "MessageDeduplicationId": "d"}
        answers.append(call("SendMessageBatch", {"QueueUrl": url, "Entries": [sent]}))
        received += both.receives_equal(url, 1)
    assert answers[0] == answers[1] and answers[0][0] == "ok"
    assert answers[0][1]["Successful"][0]["SequenceNumber"] is True
    attributes = received[0]["Attributes"]
    assert attributes["MessageGroupId"] == "g" and attributes["MessageDeduplicationId"] == "d"
    assert attributes["SequenceNumber"]


# -- batches: per-entry failures, deletes and visibility ----------------------------------------


def _handles(both: Both, url: str, count: int) -> list[str]:
    both.fill(url, [entry(i, f"m{i}") for i in range(count)])
    handles: dict[str, str] = {}
    for _ in range(50):
        answer = both.client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60
        )
        handles.update({m["Body"]: m["ReceiptHandle"] for m in answer.get("Messages", [])})
        if len(handles) == count:
            break
    return [handles[f"m{i}"] for i in range(count)]


@pytest.mark.parametrize("operation", ["DeleteMessageBatch", "ChangeMessageVisibilityBatch"])
def test_batches_with_good_and_bad_handles_are_equal(endpoint: str, operation: str) -> None:
    both = Both(endpoint)
    url = both.queue()
    mine, theirs = _handles(both, url, 4)[:2], _handles(both, url, 4)[2:]

    def params(handles: list[str]) -> dict[str, Any]:
        rows: list[dict[str, Any]] = [
            {"Id": "good", "ReceiptHandle": handles[0]},
            {"Id": "invalid", "ReceiptHandle": "not-a-receipt-handle"},
        ]
        if operation == "ChangeMessageVisibilityBatch":
            for row in rows:
                row["VisibilityTimeout"] = 30
        return {"QueueUrl": url, "Entries": rows}

    ours = both.lean_call(operation, params(mine))
    assert ours == both.botocore(operation, params(theirs))
    assert ours[0] == "ok" and [item["Id"] for item in ours[1]["Successful"]] == ["good"]
    (failed,) = ours[1]["Failed"]
    assert failed["Id"] == "invalid" and failed["Code"] == "ReceiptHandleIsInvalid"


def test_a_stale_handle_is_answered_alike(endpoint: str) -> None:
    both = Both(endpoint)
    url = both.queue()
    both.fill(url, [entry(0, "stale")])
    first = both.client.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"][0]
    both.receives_equal(url, 1)  # received again since: the first handle is stale
    rows = [{"Id": "0", "ReceiptHandle": first["ReceiptHandle"], "VisibilityTimeout": 5}]
    both.equal("ChangeMessageVisibilityBatch", {"QueueUrl": url, "Entries": rows})


# -- whole-request errors -------------------------------------------------------------------


_ONE_ENTRY: dict[str, list[dict[str, Any]]] = {
    "SendMessageBatch": [entry(0, "b")],
    "DeleteMessageBatch": [{"Id": "0", "ReceiptHandle": "h"}],
    "ChangeMessageVisibilityBatch": [{"Id": "0", "ReceiptHandle": "h", "VisibilityTimeout": 1}],
}


@pytest.mark.parametrize("operation", list(METHODS))
def test_a_missing_queue_is_the_same_error(endpoint: str, operation: str) -> None:
    both = Both(endpoint)
    url = both.queue().rsplit("/", 1)[0] + "/no-such-queue-" + uuid.uuid4().hex[:6]
    params: dict[str, Any] = {"QueueUrl": url}
    if operation in _ONE_ENTRY:
        params["Entries"] = _ONE_ENTRY[operation]
    kind = both.equal(operation, params)
    assert kind[0] != "ok" and issubclass(kind[0], botocore.exceptions.ClientError)


@pytest.mark.parametrize(
    "operation, params",
    [
        ("ReceiveMessage", {"MaxNumberOfMessages": 11}),
        ("ReceiveMessage", {"VisibilityTimeout": -1}),
        ("SendMessageBatch", {"Entries": []}),
        ("SendMessageBatch", {"Entries": [entry(0, "a"), entry(0, "b")]}),
        ("SendMessageBatch", {"Entries": [entry(i, "a") for i in range(11)]}),
        ("DeleteMessageBatch", {"Entries": []}),
        ("ChangeMessageVisibilityBatch", {"Entries": []}),
    ],
    ids=[
        "max-11",
        "visibility--1",
        "send-empty",
        "send-same-ids",
        "send-11",
        "delete-empty",
        "visibility-empty",
    ],
)
def test_a_refused_request_is_the_same_error(
    endpoint: str, operation: str, params: dict[str, Any]
) -> None:
    both = Both(endpoint)
    url = both.queue()
    kind = both.equal(operation, {"QueueUrl": url, **params})
    # What every server refuses (the others differ among servers, and each agrees both ways).
    if operation != "ChangeMessageVisibilityBatch" and "VisibilityTimeout" not in params:
        assert kind[0] != "ok" and issubclass(kind[0], botocore.exceptions.ClientError)


# -- a property: random bodies and attributes ---------------------------------------------------

_SQS_TEXT = st.text(
    alphabet=st.characters(
        codec="utf-8", blacklist_categories=("Cs",), blacklist_characters="\x00\ufffe\uffff"
    ).filter(lambda c: c in "\t\n\r" or ord(c) >= 0x20),
    min_size=1,
    max_size=300,
)
_ATTRIBUTE = st.one_of(
    st.builds(
        lambda suffix, text: {"DataType": "String" + suffix, "StringValue": text},
        st.sampled_from(["", ".json", ".x-y_z"]),
        _SQS_TEXT,
    ),
    st.builds(
        lambda suffix, n: {"DataType": "Number" + suffix, "StringValue": str(n)},
        st.sampled_from(["", ".int"]),
        st.integers(-(10**20), 10**20),
    ),
    st.builds(
        lambda suffix, raw: {"DataType": "Binary" + suffix, "BinaryValue": raw},
        st.sampled_from(["", ".pickle"]),
        st.binary(min_size=1, max_size=200),
    ),
)
_ATTRIBUTES = st.dictionaries(
    st.from_regex(r"[a-zA-Z0-9_-]{1,20}", fullmatch=True).filter(
        lambda n: not n.lower().startswith(("aws", "amazon"))
    ),
    _ATTRIBUTE,
    max_size=4,
)


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_SQS_TEXT, attributes=_ATTRIBUTES)
def test_random_bodies_and_attributes_come_back_equal(
    fast_endpoint: str, body: str, attributes: dict[str, Any]
) -> None:
    both = Both(fast_endpoint)
    url = both.queue()
    params = {"QueueUrl": url, "Entries": [entry(0, body, attributes)]}
    sent = [both.botocore("SendMessageBatch", params), both.lean_call("SendMessageBatch", params)]
    assert sent[0] == sent[1] and sent[0][0] == "ok"
    for message in both.receives_equal(url, 1) * 2:
        assert message["Body"] == body
        got = {
            k: {f: v[f] for f in ("DataType", "StringValue", "BinaryValue") if f in v}
            for k, v in message.get("MessageAttributes", {}).items()
        }
        assert got == attributes


# -- the signature, the credentials ------------------------------------------------------------


def _frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    moment = datetime.datetime(2026, 5, 4, 3, 2, 1, tzinfo=datetime.UTC)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: moment)


@pytest.mark.parametrize("token", [None, "a-session-token"])
def test_the_request_and_signature_are_botocores_own(
    fast_endpoint: str, monkeypatch: pytest.MonkeyPatch, token: str | None
) -> None:
    if token:
        monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    _frozen(monkeypatch)
    both = Both(fast_endpoint)
    url = both.queue()
    sent: list[Any] = []
    both.client.meta.events.register("before-send.sqs", lambda request, **_: sent.append(request))
    cases = {
        "SendMessageBatch": {"QueueUrl": url, "Entries": [entry(0, "ü € 😀", ATTRIBUTES)]},
        "ReceiveMessage": {
            "QueueUrl": url,
            "MaxNumberOfMessages": 10,
            "VisibilityTimeout": 0,
            "MessageAttributeNames": ["All"],
        },
        "DeleteMessageBatch": {"QueueUrl": url, "Entries": [{"Id": "0", "ReceiptHandle": "h"}]},
        "ChangeMessageVisibilityBatch": {
            "QueueUrl": url,
            "Entries": [{"Id": "0", "ReceiptHandle": "h", "VisibilityTimeout": 3}],
        },
    }
    for operation, params in cases.items():
        sent.clear()
        with contextlib.suppress(botocore.exceptions.ClientError):
            getattr(both.client, METHODS[operation])(**params)
        (theirs,) = sent
        body = both.lean.request_body(operation, params)
        ours = both.lean.signed_request(operation, body)
        assert body == theirs.body
        assert ours.url == theirs.url
        for name in (
            "Authorization",
            "X-Amz-Date",
            "X-Amz-Target",
            "Content-Type",
            "X-Amz-Security-Token",
            "x-amzn-query-mode",
        ):
            expected = theirs.headers.get(name)
            expected = expected.decode() if isinstance(expected, bytes) else expected
            assert ours.headers.get(name) == expected, name
        assert ("X-Amz-Security-Token" in ours.headers) == bool(token)


def test_refreshed_credentials_sign_the_next_request(fast_endpoint: str) -> None:
    keys = iter(["AKIDFIRST", "AKIDSECOND"])

    def refresh() -> dict[str, str]:
        expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
        return {
            "access_key": next(keys),
            "secret_key": "s",
            "token": "t",
            "expiry_time": expiry.isoformat(),
        }

    credentials = botocore.credentials.RefreshableCredentials.create_from_metadata(
        metadata=refresh(), refresh_using=refresh, method="test"
    )
    session = botocore.session.Session()
    session._credentials = credentials
    client = session.create_client("sqs", region_name="us-east-1", endpoint_url=fast_endpoint)
    lean = LeanTransport(client)
    url = client.create_queue(QueueName="refreshing")["QueueUrl"]
    signed: list[str] = []
    client.meta.events.register(
        "before-send.sqs", lambda request, **_: signed.append(request.headers["Authorization"])
    )
    params = {"QueueUrl": url, "WaitTimeSeconds": 0}
    lean.call("ReceiveMessage", params)
    # Due within botocore's mandatory refresh window: the next request refreshes first.
    credentials._expiry_time = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=30)
    lean.call("ReceiveMessage", params)
    assert "Credential=AKIDFIRST/" in signed[0] and "Credential=AKIDSECOND/" in signed[1]


# -- connections that fail: the same exceptions, the same in-doubt rules -----------------------


@contextlib.contextmanager
def _silent_server(*, reset: bool = False) -> Iterator[str]:
    """A loopback server that reads a request and never answers (or resets it)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(65536)
            if reset:
                conn.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
                conn.close()
            else:
                held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()
        for conn in held:
            conn.close()


def _both_fail(endpoint_url: str, operation: str, params: dict[str, Any]) -> Any:
    both = Both(
        endpoint_url, retries={"total_max_attempts": 1}, read_timeout=0.5, connect_timeout=2
    )
    return both.equal(operation, params)


def test_a_refused_connection_is_botocores_error(aws_env: None) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    kind = _both_fail(url, "ReceiveMessage", {"QueueUrl": f"{url}/1/q"})
    assert kind[0] is botocore.exceptions.EndpointConnectionError


@pytest.mark.parametrize("reset", [False, True], ids=["read-timeout", "reset"])
def test_no_answer_after_the_request_is_botocores_error(aws_env: None, reset: bool) -> None:
    with _silent_server(reset=reset) as url:
        kind = _both_fail(
            url, "SendMessageBatch", {"QueueUrl": f"{url}/1/q", "Entries": [entry(0, "x")]}
        )
    expected = (
        botocore.exceptions.ConnectionClosedError if reset else botocore.exceptions.ReadTimeoutError
    )
    assert kind[0] is expected


def test_a_lost_answer_leaves_a_lean_send_in_doubt_and_a_refused_one_retried(aws_env: None) -> None:
    with _silent_server() as url:
        client = client_of(url, retries={"total_max_attempts": 1}, read_timeout=0.5)
        calls = SqsBroker(client, lean=LeanTransport(client), lean_send=LeanTransport(client))
        with pytest.raises(SendInDoubt):
            calls.send_batch(f"{url}/1/q", [SendEntry(id="0", body="x", headers={})])
    refused = f"http://127.0.0.1:{free_port()}"
    client = client_of(refused, retries={"total_max_attempts": 1})
    lean = LeanTransport(client)
    calls = SqsBroker(client, lean=lean, lean_send=lean, send_attempts=2)
    tried: list[Any] = []
    client.meta.events.register("before-send.sqs", lambda request, **_: tried.append(request))
    with pytest.raises(AwsUnavailable):
        calls.send_batch(f"{refused}/1/q", [SendEntry(id="0", body="x", headers={})])
    assert len(tried) == 2  # SqsCalls' own retry: provably never sent


def test_lean_calls_builds_a_broker_on_both_paths(server: Any) -> None:
    broker = lean_calls(AwsSettings(endpoint_url=server.endpoint_url, region="us-east-1"))
    assert broker.lean is not None and broker.lean_send is not None
    url = broker.client.create_queue(QueueName="built")["QueueUrl"]
    assert broker.send_batch(url, [SendEntry(id="0", body="é", headers={})]).ok
    (got,) = broker.receive(url, hold=30, wait_seconds=0)
    assert got.body == "é"
    assert broker.delete_batch(url, {"0": got.tag}).ok == {"0": ""}


# -- retries: the client's own handler, and never a resent batch ------------------------------


@contextlib.contextmanager
def _failing_server(
    status: int,
    body: bytes,
    headers: dict[str, str],
    *,
    date: str | None = None,
    requests: list[dict[str, str]] | None = None,
) -> Iterator[list[str]]:
    """A loopback server that answers every request with one error; yields its URL, then
    the X-Amz-Target of each request it gets (``requests``: their headers too). ``date``:
    its Date header, instead of its own clock's."""
    import http.server

    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            seen.append(self.headers.get("X-Amz-Target", ""))
            if requests is not None:
                requests.append(dict(self.headers.items()))
            self.send_response(status)
            for name, value in {"Content-Type": "application/x-amz-json-1.0", **headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def date_time_string(self, timestamp: float | None = None) -> str:
            return date or super().date_time_string(timestamp)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    seen.insert(0, f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize(
    "status, body, headers",
    [
        (500, b'{"__type": "com.amazonaws.sqs#InternalError", "message": "boom"}', {}),
        (503, b"<html><title>Service Unavailable</title></html>", {"Content-Type": "text/html"}),
        (
            400,
            b'{"__type": "com.amazonaws.sqs#RequestThrottled", "message": "slow down"}',
            {"x-amzn-query-error": "RequestThrottled;Sender"},
        ),
    ],
    ids=["500", "503-page", "throttled"],
)
def test_retries_are_botocores_and_a_batch_is_never_resent(
    aws_env: None,
    monkeypatch: pytest.MonkeyPatch,
    status: int,
    body: bytes,
    headers: dict[str, str],
) -> None:
    import time

    delays: list[float] = []
    monkeypatch.setattr(time, "sleep", delays.append)  # the backoff's delays, not waited
    with _failing_server(status, body, headers) as seen:
        url = seen.pop(0)
        both = Both(url, retries={"mode": "standard", "total_max_attempts": 3})
        receive = {"QueueUrl": f"{url}/1/q", "WaitTimeSeconds": 0}
        both.equal("ReceiveMessage", receive)
        assert seen == ["AmazonSQS.ReceiveMessage"] * 6  # 3 attempts each way
        assert len(delays) == 4
        seen.clear()
        send = {"QueueUrl": f"{url}/1/q", "Entries": [entry(0, "x")]}
        kind = both.lean_call("SendMessageBatch", send)
        assert seen == ["AmazonSQS.SendMessageBatch"]  # however many the client would try
        assert kind[0] != "ok" and issubclass(kind[0], botocore.exceptions.ClientError)


# -- clock skew: botocore corrects none; a retry's ttl from the server's Date, alike -----------


@pytest.mark.parametrize(
    "server_date, code",
    [
        ("Mon, 04 May 2026 03:07:01 GMT", "InternalError"),  # 5 min ahead: retried (500)
        ("Mon, 04 May 2026 02:47:01 GMT", "InternalError"),  # 15 min behind
        ("not a date", "InternalError"),  # no ttl at all
        ("Mon, 04 May 2026 03:22:01 GMT", "RequestTimeTooSkewed"),  # not retried either way
    ],
    ids=["ahead", "behind", "bad-date", "too-skewed"],
)
def test_clock_skew_is_handled_as_botocore_handles_it(
    aws_env: None, monkeypatch: pytest.MonkeyPatch, server_date: str, code: str
) -> None:
    import time

    import botocore.endpoint

    moment = datetime.datetime(2026, 5, 4, 3, 2, 1)  # the local clock, injected both ways
    clock = iter(moment + datetime.timedelta(seconds=n) for n in range(10_000))

    def now(remove_tzinfo: bool = True) -> datetime.datetime:
        return next(clock)

    monkeypatch.setattr(botocore.endpoint, "get_current_datetime", now)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: moment)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    status = 500 if code == "InternalError" else 400
    body = f'{{"__type": "com.amazonaws.sqs#{code}", "message": "m"}}'.encode()
    requests: list[dict[str, str]] = []
    with _failing_server(status, body, {}, date=server_date, requests=requests) as seen:
        url = seen.pop(0)
        client = client_of(url, retries={"mode": "standard", "total_max_attempts": 3})
        lean = LeanTransport(client, clock=now)
        params: dict[str, Any] = {"QueueUrl": f"{url}/1/q", "WaitTimeSeconds": 0}
        theirs = outcome("ReceiveMessage", lambda: client.receive_message(**params))
        clock = iter(moment + datetime.timedelta(seconds=n) for n in range(10_000))
        split = len(requests)
        ours = outcome("ReceiveMessage", lambda: lean.call("ReceiveMessage", params))
    assert ours == theirs and ours[1]["Code"] == code

    def sent(rows: list[dict[str, str]]) -> list[tuple[str, str]]:
        return [(row["X-Amz-Date"], row["amz-sdk-request"]) for row in rows]

    assert sent(requests[split:]) == sent(requests[:split])
    # Signed by the local clock every time, never the server's.
    assert {row["X-Amz-Date"] for row in requests} == {"20260504T030201Z"}
    headers = [row["amz-sdk-request"] for row in requests[split:]]
    # botocore names max in the first attempt's header since its MaxAttemptsSeeder (the
    # floor, 1.40.2, does not): both ways, as the installed one does.
    first = "attempt=1; max=3" if hasattr(standard, "MaxAttemptsSeeder") else "attempt=1"
    if code == "RequestTimeTooSkewed":
        assert headers == [first]
    elif server_date == "not a date":
        assert headers == [first, "attempt=2; max=3", "attempt=3; max=3"]
    else:
        assert headers[0] == first and len(headers) == 3
        assert all(h.startswith("ttl=") for h in headers[1:])
    if server_date.startswith("Mon, 04 May 2026 03:07"):
        # Local 03:02:02 (the clock's second read) + the 60 s read timeout + 300 s of skew.
        assert headers[1] == "ttl=20260504T030802Z; attempt=2; max=3"


# -- proxies: botocore's choice of one (HTTP_PROXY, HTTPS_PROXY, NO_PROXY, proxies) ----------


@dataclass
class _Proxy:
    """A real HTTP proxy on loopback: CONNECT tunnels and absolute-form forwarding. ``seen``
    holds (method, target, Proxy-Authorization) of what reached it; ``tunnelled`` the bytes
    relayed through its tunnels."""

    url: str
    seen: list[tuple[str, str, str | None]]
    tunnelled: list[int]


def _relay(source: socket.socket, sink: socket.socket, counted: list[int]) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            counted.append(len(data))
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def _proxy(*, deny: bool = False) -> Iterator[_Proxy]:
    """``deny``: every request answered 407 (Proxy Authentication Required)."""
    import http.client
    import http.server

    seen: list[tuple[str, str, str | None]] = []
    tunnelled: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _noted(self) -> bool:
            seen.append((self.command, self.path, self.headers.get("Proxy-Authorization")))
            if deny:
                self.send_response(407)
                self.send_header("Content-Length", "0")
                self.end_headers()
            return not deny

        def do_CONNECT(self) -> None:
            if not self._noted():
                return
            host, port = self.path.rsplit(":", 1)
            upstream = socket.create_connection((host, int(port)), timeout=30)
            self.send_response(200, "Connection established")
            self.end_headers()
            self.wfile.flush()
            back = threading.Thread(target=_relay, args=(upstream, self.connection, tunnelled))
            back.start()
            _relay(self.connection, upstream, tunnelled)
            back.join(30)
            upstream.close()
            self.close_connection = True

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if not self._noted():
                return
            target = urlsplit(self.path)
            upstream = http.client.HTTPConnection(target.hostname or "", target.port or 80)
            hop = ("proxy-connection", "proxy-authorization", "connection")
            forwarded = {k: v for k, v in self.headers.items() if k.lower() not in hop}
            upstream.request("POST", target.path or "/", body=body, headers=forwarded)
            answer = upstream.getresponse()
            data = answer.read()
            upstream.close()
            self.send_response(answer.status)
            for name, value in answer.getheaders():
                if name.lower() not in ("content-length", "connection", "transfer-encoding"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield _Proxy(f"http://127.0.0.1:{server.server_address[1]}", seen, tunnelled)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextlib.contextmanager
def _sqs_behind(
    scheme: str, moto: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """An SQS server on loopback: moto's (http), or bench/fast_sqs.py over TLS (https) with
    a self-signed certificate trusted through AWS_CA_BUNDLE."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    if scheme == "http":
        yield str(moto.endpoint_url)
        return
    cert, key = self_signed(tmp_path)
    monkeypatch.setenv("AWS_CA_BUNDLE", str(cert))
    with _fast_sqs_over_tls(cert, key) as url:
        yield url


def _calls_both_ways(both: Both, url: str, proxy: _Proxy) -> list[Any]:
    """A send and a receive made by botocore's client, then by the lean transport; what each
    sent through the proxy; both outcomes (equal)."""
    send = {"QueueUrl": url, "Entries": [entry(0, "through the proxy ü")]}
    receive = {"QueueUrl": url, "VisibilityTimeout": 0, "WaitTimeSeconds": 0}
    passed = []
    outcomes = []
    for call in (both.botocore, both.lean_call):
        proxy.seen.clear()
        proxy.tunnelled.clear()
        outcomes.append([call("SendMessageBatch", send), call("ReceiveMessage", receive)])
        passed.append((list(proxy.seen), bool(proxy.tunnelled)))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0][0] == "ok"
    assert passed[0] == passed[1]
    return list(passed[0])


@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize(
    "how", ["environment", "config", "no-proxy-host", "no-proxy-star", "no-proxy-elsewhere"]
)
def test_calls_through_a_proxy_go_and_answer_as_botocores(
    server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str, how: str
) -> None:
    with _sqs_behind(scheme, server, tmp_path, monkeypatch) as endpoint_url, _proxy() as proxy:
        url = str(client_of(endpoint_url).create_queue(QueueName="proxied")["QueueUrl"])
        # The proxy's user and password, quoted in the URL: Proxy-Authorization.
        authed = proxy.url.replace("http://", "http://us%40er:p%3Ass@")
        variable = f"{scheme.upper()}_PROXY"
        if how == "config":
            both = Both(endpoint_url, proxies={scheme: authed})
        else:
            monkeypatch.setenv(variable, authed)
            bypass = {"no-proxy-host": "127.0.0.1", "no-proxy-star": "*"}
            monkeypatch.setenv("NO_PROXY", bypass.get(how, "example.com,.example.org"))
            both = Both(endpoint_url)
        seen, tunnelled = _calls_both_ways(both, url, proxy)
    if how.startswith("no-proxy-") and how != "no-proxy-elsewhere":
        assert seen == [] and not tunnelled
        return
    auth = "Basic " + base64.b64encode(b"us@er:p:ss").decode()
    netloc = urlsplit(endpoint_url).netloc
    if scheme == "https":  # one tunnel each, the connection kept for the second call
        assert seen == [("CONNECT", netloc, auth)] and tunnelled
    else:  # every request forwarded, named by its whole URL
        assert seen == [("POST", f"{endpoint_url}/", auth)] * 2 and not tunnelled


@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("failure", ["refused", "407"])
def test_a_proxy_that_fails_is_the_same_error_both_ways(
    server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str, failure: str
) -> None:
    behind = _sqs_behind(scheme, server, tmp_path, monkeypatch)
    with behind as endpoint_url, _proxy(deny=True) as proxy:
        proxy_url = proxy.url if failure == "407" else f"http://127.0.0.1:{free_port()}"
        monkeypatch.setenv(f"{scheme.upper()}_PROXY", proxy_url)
        both = Both(endpoint_url, retries={"total_max_attempts": 1}, connect_timeout=5)
        kind = both.equal("ReceiveMessage", {"QueueUrl": f"{endpoint_url}/1/q"})
    assert kind[0] != "ok"
    if failure == "refused" or scheme == "https":
        assert kind[0] is botocore.exceptions.ProxyConnectionError


def test_a_proxy_spoken_to_over_tls_is_refused_in_one_line_before_any_call(
    aws_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "https://user:secret@127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with pytest.raises(UsageProblem, match="proxy") as refused:
        lean_calls(AwsSettings(endpoint_url="https://127.0.0.1:9", region="us-east-1"))
    line = str(refused.value)
    assert "\n" not in line and "--sqs-client botocore" in line and "secret" not in line


# -- the endpoint: botocore's resolver's, and its request URL ----------------------------------


class _Stop(Exception):
    """Raised from botocore's before-send: its request is seen, never sent."""


@pytest.mark.parametrize(
    "endpoint_url, config",
    [
        ("http://127.0.0.1:9", {}),
        ("http://127.0.0.1:9/some/prefix", {}),
        (None, {}),
        (None, {"use_fips_endpoint": True}),
        (None, {"use_dualstack_endpoint": True}),
    ],
    ids=["plain", "path", "region", "fips", "dual-stack"],
)
def test_the_request_goes_where_botocores_would(
    aws_env: None, endpoint_url: str | None, config: dict[str, Any]
) -> None:
    import boto3

    client = boto3.client(
        "sqs", region_name="eu-west-1", endpoint_url=endpoint_url, config=Config(**config)
    )
    urls: list[str] = []

    def seen(request: Any, **_: Any) -> None:
        urls.append(request.url)
        raise _Stop

    client.meta.events.register("before-send.sqs", seen)
    with pytest.raises(_Stop):
        client.receive_message(QueueUrl="https://sqs.eu-west-1.amazonaws.com/1/q")
    lean = LeanTransport(client)
    assert lean.signed_request("ReceiveMessage", b"{}").url == urls[0]


# -- TLS: botocore's verification, its CA bundle -----------------------------------------------


@contextlib.contextmanager
def _fast_sqs_over_tls(cert: Path, key: Path) -> Iterator[str]:
    import ssl

    server = load_fast_sqs().FastSqsServer("127.0.0.1", 0)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("trust", ["AWS_CA_BUNDLE", "verify-off", "untrusted"])
def test_tls_is_verified_as_botocore_verifies_it(
    aws_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trust: str
) -> None:
    import boto3

    cert, key = self_signed(tmp_path)
    if trust == "AWS_CA_BUNDLE":
        monkeypatch.setenv("AWS_CA_BUNDLE", str(cert))
    with _fast_sqs_over_tls(cert, key) as endpoint_url:
        client = boto3.client(
            "sqs",
            region_name="us-east-1",
            endpoint_url=endpoint_url,
            # None: botocore's own choice (AWS_CA_BUNDLE here); True would override it.
            verify=False if trust == "verify-off" else None,
            config=Config(retries={"total_max_attempts": 1}),
        )
        check_answers(client)
        lean = LeanTransport(client)
        params = {"QueueUrl": f"{endpoint_url}/123456789012/none", "WaitTimeSeconds": 0}
        with warnings.catch_warnings():
            # urllib3 warns of each unverified request: the test suite makes warnings errors.
            warnings.simplefilter("ignore")
            theirs = outcome("ReceiveMessage", lambda: client.receive_message(**params))
            ours = outcome("ReceiveMessage", lambda: lean.call("ReceiveMessage", params))
    if trust == "untrusted":  # the words are ssl's, as each library quotes them: the kind is one
        assert ours[0] is theirs[0] is botocore.exceptions.SSLError
    else:
        assert ours == theirs and ours[0] is not botocore.exceptions.SSLError


def test_one_transport_serves_many_threads(fast_endpoint: str) -> None:
    both = Both(fast_endpoint)
    urls = [both.queue() for _ in range(8)]
    errors: list[BaseException] = []

    def work(url: str) -> None:
        try:
            for n in range(20):
                rows = [entry(i, f"{url} {n} {i}") for i in range(10)]
                sent = both.lean.call("SendMessageBatch", {"QueueUrl": url, "Entries": rows})
                assert len(sent["Successful"]) == 10
                got = both.lean.call("ReceiveMessage", {"QueueUrl": url, "MaxNumberOfMessages": 10})
                assert all(m["Body"].startswith(url) for m in got["Messages"])
                handles = [
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(got["Messages"])
                ]
                deleted = both.lean.call(
                    "DeleteMessageBatch", {"QueueUrl": url, "Entries": handles}
                )
                assert len(deleted["Successful"]) == len(handles)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(url,)) for url in urls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors[0]
    assert not any(thread.is_alive() for thread in threads)
    # Connections are reused, never more kept idle than the pool's size.
    assert 0 < len(both.lean._pool._idle) <= min(8, both.lean._pool.size)


@pytest.mark.parametrize(
    "body, content_type",
    [
        (b"<html><title>Sign in</title></html>", "text/html"),
        (b"", "application/x-amz-json-1.0"),
        (b'{"Messages": "not a list"}', "application/x-amz-json-1.0"),
        (b'{"Successful": [{"Id": 1}]}', "application/x-amz-json-1.0"),
    ],
    ids=["html", "empty", "wrong-shape", "wrong-type"],
)
def test_a_2xx_that_is_no_sqs_answer_is_refused_alike_and_a_send_left_in_doubt(
    aws_env: None, body: bytes, content_type: str
) -> None:
    with _failing_server(200, body, {"Content-Type": content_type}) as seen:
        url = seen.pop(0)
        both = Both(url, retries={"total_max_attempts": 1})
        kind = both.equal("ReceiveMessage", {"QueueUrl": f"{url}/1/q", "WaitTimeSeconds": 0})
        assert kind[0] is ForeignAnswer
        both.equal(
            "DeleteMessageBatch",
            {"QueueUrl": f"{url}/1/q", "Entries": _ONE_ENTRY["DeleteMessageBatch"]},
        )
        calls = SqsBroker(both.client, lean=both.lean, lean_send=both.lean)
        with pytest.raises(SendInDoubt):
            calls.send_batch(f"{url}/1/q", [SendEntry(id="0", body="x", headers={})])


# -- before-call: botocore's handlers and a Stubber's, run alike --------------------------------


def test_before_call_handlers_run_alike(
    fast_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found making lean the default: CLI tests answer through botocore's Stubber hook
    (before-call), and in Lambda botocore's own before-call handler adds X-Amzn-Trace-Id."""
    from botocore.stub import Stubber

    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "drain")
    monkeypatch.setenv("_X_AMZN_TRACE_ID", "Root=1-5759e988-bd862e3fe1be46a994272793")
    both = Both(fast_endpoint)
    url = both.queue()
    sent: list[Any] = []
    both.client.meta.events.register("before-send.sqs", lambda request, **_: sent.append(request))
    params = {"QueueUrl": url, "WaitTimeSeconds": 0}
    assert both.botocore("ReceiveMessage", params) == both.lean_call("ReceiveMessage", params)
    traces = [request.headers.get("X-Amzn-Trace-Id") for request in sent]
    # botocore's endpoint encodes its headers to bytes; http.client sends both alike.
    texts = [t.decode() if isinstance(t, bytes) else t for t in traces]
    assert texts == ["Root=1-5759e988-bd862e3fe1be46a994272793"] * 2
    with Stubber(both.client) as stubber:
        for _ in range(2):
            stubber.add_client_error("receive_message", "AccessDenied", "no", 403)
        answers = [
            both.botocore("ReceiveMessage", params),
            both.lean_call("ReceiveMessage", params),
        ]
        stubber.assert_no_pending_responses()
    assert answers[0] == answers[1] and answers[0][1]["Code"] == "AccessDenied"
