"""The SQS adapter: batch splitting, per-entry results, send retries and error translation."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import boto3
import botocore.exceptions as bx
import pytest
from botocore.stub import Stubber

from redrive.aws.errors import aws_error, aws_errors
from redrive.aws.session import AwsSettings
from redrive.broker.base import SendEntry
from redrive.broker.sqs import SqsBroker, open_sqs
from redrive.broker.sqs import calls as sqs_module
from redrive.broker.sqs.calls import MAX_BATCH_BYTES, _batch_result, request_entry, split_batches
from redrive.broker.sqs.headers import headers_of
from redrive.errors import (
    AwsError,
    AwsUnavailable,
    ForeignEndpoint,
    NotSent,
    QueueNotFound,
    RedriveError,
    SendInDoubt,
    SendNotConnected,
)

URL = "https://sqs.us-east-1.amazonaws.com/123456789012/onion-checkout"


def entry(i: int, body_bytes: int = 10, attributes: dict[str, Any] | None = None) -> SendEntry:
    return SendEntry(id=str(i), body="x" * body_bytes, headers=headers_of(attributes or {}))


def client_error(code: str, status: int = 400, message: str = "nope") -> bx.ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return bx.ClientError(response, "SendMessageBatch")


# -- split_batches ------------------------------------------------------------------------


def test_split_batches_keeps_at_most_ten_entries() -> None:
    batches = list(split_batches([entry(i) for i in range(25)]))
    assert [len(b) for b in batches] == [10, 10, 5]
    assert [e.id for b in batches for e in b] == [str(i) for i in range(25)]


def test_split_batches_nothing_gives_no_batch() -> None:
    assert list(split_batches([])) == []


def test_split_batches_respects_the_byte_limit() -> None:
    # Three 100 KB bodies: two fit in 256 KiB, the third does not.
    batches = list(split_batches([entry(i, 100_000) for i in range(3)]))
    assert [len(b) for b in batches] == [2, 1]
    assert all(sum(e.size() for e in b) <= MAX_BATCH_BYTES for b in batches)


def test_split_batches_exactly_at_the_limit_is_one_batch() -> None:
    half = MAX_BATCH_BYTES // 2
    assert [len(b) for b in split_batches([entry(0, half), entry(1, half)])] == [2]
    assert [len(b) for b in split_batches([entry(0, half), entry(1, half + 1)])] == [1, 1]


def test_split_batches_counts_attribute_sizes() -> None:
    attrs = {"trace": {"DataType": "String", "StringValue": "t" * 2_000}}
    first = entry(0, MAX_BATCH_BYTES - 1_000)
    # The body alone fits next to the first entry; its attributes push it over.
    second = entry(1, 500, attrs)
    assert second.size() == 500 + len("trace") + len("String") + 2_000
    assert [len(b) for b in split_batches([first, second])] == [1, 1]
    assert [len(b) for b in split_batches([first, entry(1, 500)])] == [2]


def test_entry_size_counts_utf8_bytes_and_binary_values() -> None:
    e = SendEntry(
        id="0",
        body="é" * 10,
        headers=headers_of({"blob": {"DataType": "Binary", "BinaryValue": b"\x00" * 7}}),
    )
    assert e.size() == 20 + len("blob") + len("Binary") + 7


def test_an_entry_over_the_limit_alone_still_gets_a_batch() -> None:
    # SQS rejects it per entry; splitting must not loop or drop it.
    big, small = entry(0, MAX_BATCH_BYTES + 1), entry(1)
    assert [[e.id for e in b] for b in split_batches([small, big, small])] == [
        ["1"],
        ["0"],
        ["1"],
    ]


def test_send_entry_request_drops_receive_only_attribute_fields() -> None:
    e = SendEntry(
        id="0",
        body="b",
        headers=headers_of(
            {
                "a": {
                    "DataType": "String",
                    "StringValue": "v",
                    "StringListValues": [],
                    "BinaryListValues": [],
                }
            }
        ),
        group_id="g",
        deduplication_id="k",
    )
    assert request_entry(e) == {
        "Id": "0",
        "MessageBody": "b",
        "MessageAttributes": {"a": {"DataType": "String", "StringValue": "v"}},
        "MessageGroupId": "g",
        "MessageDeduplicationId": "k",
    }


# -- _batch_result ------------------------------------------------------------------------


def test_batch_result_entries_missing_from_both_lists_are_failed() -> None:
    response = {
        "Successful": [{"Id": "0", "MessageId": "m0"}],
        "Failed": [{"Id": "1", "Code": "InvalidMessageContents", "Message": "bad"}],
    }
    result = _batch_result(response, ["0", "1", "2"], value_key="MessageId")
    assert result.ok == {"0": "m0"}
    assert result.failed["1"] == "InvalidMessageContents: bad"
    assert result.failed["2"] == "not in the response"
    assert set(result.ok).isdisjoint(result.failed)


def test_batch_result_empty_response_fails_everything() -> None:
    result = _batch_result({}, ["a", "b"])
    assert result.ok == {}
    assert set(result.failed) == {"a", "b"}


# -- send_batch -----------------------------------------------------------------------------


class ScriptedClient:
    """Plays a script: each call to send_message_batch raises or returns the next item."""

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.calls: list[dict[str, Any]] = []

    def send_message_batch(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step


def ok_response(n: int) -> dict[str, Any]:
    return {"Successful": [{"Id": str(i), "MessageId": f"m{i}"} for i in range(n)]}


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record send_batch's backoff sleeps instead of waiting them out."""
    slept: list[float] = []
    monkeypatch.setattr(sqs_module, "time", SimpleNamespace(sleep=slept.append))
    return slept


def test_send_batch_returns_message_ids(sleeps: list[float]) -> None:
    client = ScriptedClient(ok_response(2))
    result = SqsBroker(client).send_batch(URL, [entry(0), entry(1)])
    assert result.ok == {"0": "m0", "1": "m1"}
    assert result.failed == {}
    assert client.calls[0]["QueueUrl"] == URL
    assert [e["Id"] for e in client.calls[0]["Entries"]] == ["0", "1"]
    assert sleeps == []


def test_send_batch_of_nothing_calls_nothing() -> None:
    client = ScriptedClient()
    assert SqsBroker(client).send_batch(URL, []).ok == {}
    assert client.calls == []


@pytest.mark.parametrize("code", ["ThrottlingException", "RequestThrottled", "SlowDown"])
def test_send_batch_retries_throttling(sleeps: list[float], code: str) -> None:
    client = ScriptedClient(client_error(code), client_error(code, 503), ok_response(1))
    sqs = SqsBroker(client)
    assert sqs.send_batch(URL, [entry(0)]).ok == {"0": "m0"}
    assert len(client.calls) == 3
    assert len(sleeps) == 2
    assert sqs.throttled == 2


@pytest.mark.parametrize(
    "error",
    [
        bx.EndpointConnectionError(endpoint_url=URL),
        bx.ConnectTimeoutError(endpoint_url=URL),
    ],
    ids=["endpoint-connection", "connect-timeout"],
)
def test_send_batch_retries_connections_never_made(sleeps: list[float], error: Exception) -> None:
    client = ScriptedClient(error, ok_response(1))
    sqs = SqsBroker(client)
    assert sqs.send_batch(URL, [entry(0)]).ok == {"0": "m0"}
    assert len(client.calls) == 2
    assert sqs.throttled == 0


def test_send_batch_gives_up_after_its_attempts(sleeps: list[float]) -> None:
    client = ScriptedClient(*[client_error("ThrottlingException")] * 3)
    with pytest.raises(AwsError, match="throttl") as caught:
        SqsBroker(client, send_attempts=3).send_batch(URL, [entry(0)])
    assert not isinstance(caught.value, SendInDoubt)
    assert len(client.calls) == 3


def test_send_batch_unreachable_endpoint_ends_unavailable(sleeps: list[float]) -> None:
    client = ScriptedClient(*[bx.EndpointConnectionError(endpoint_url=URL)] * 2)
    with pytest.raises(AwsUnavailable, match="cannot reach"):
        SqsBroker(client, send_attempts=2).send_batch(URL, [entry(0)])


@pytest.mark.parametrize(
    "errors",
    [
        [bx.EndpointConnectionError(endpoint_url=URL)] * 2,
        [bx.ConnectTimeoutError(endpoint_url=URL)] * 2,
        [client_error("ThrottlingException"), bx.ConnectTimeoutError(endpoint_url=URL)],
    ],
    ids=["refused", "connect-timeout", "throttled-then-unconnected"],
)
def test_a_send_never_connected_in_any_attempt_was_not_sent(
    sleeps: list[float], errors: list[Exception]
) -> None:
    with pytest.raises(SendNotConnected, match="its 2 messages were not sent") as caught:
        SqsBroker(ScriptedClient(*errors), send_attempts=2).send_batch(URL, [entry(0), entry(1)])
    assert isinstance(caught.value, NotSent) and not isinstance(caught.value, SendInDoubt)
    assert len(str(caught.value).splitlines()) == 1


def test_a_send_that_connected_once_and_timed_out_is_in_doubt(sleeps: list[float]) -> None:
    """An attempt refused, the next one connected and got no answer: in doubt, however
    the attempts before it ended."""
    errors = [bx.EndpointConnectionError(endpoint_url=URL), bx.ReadTimeoutError(endpoint_url=URL)]
    with pytest.raises(SendInDoubt) as caught:
        SqsBroker(ScriptedClient(*errors), send_attempts=3).send_batch(URL, [entry(0)])
    assert not isinstance(caught.value, NotSent)


@pytest.mark.parametrize(
    "error",
    [
        bx.ReadTimeoutError(endpoint_url=URL),
        bx.ConnectionClosedError(endpoint_url=URL),
        bx.HTTPClientError(error="connection reset by peer"),
        client_error("InternalError", 500),
        client_error("ServiceUnavailable", 503),
    ],
    ids=["read-timeout", "connection-closed", "http-client-error", "500", "503"],
)
def test_send_batch_in_doubt_is_never_retried(sleeps: list[float], error: Exception) -> None:
    client = ScriptedClient(error, ok_response(2))
    with pytest.raises(SendInDoubt, match="may or may not") as caught:
        SqsBroker(client).send_batch(URL, [entry(0), entry(1)])
    assert len(client.calls) == 1
    assert sleeps == []
    assert "onion-checkout" in str(caught.value)
    assert "2 messages" in str(caught.value)


def test_send_batch_client_errors_are_not_retried(sleeps: list[float]) -> None:
    client = ScriptedClient(client_error("AccessDenied", 403), ok_response(1))
    with pytest.raises(AwsError, match=r"sqs:SendMessage\b"):
        SqsBroker(client).send_batch(URL, [entry(0)])
    assert len(client.calls) == 1


def stub_client() -> Any:
    # A session of its own: boto3's default session would cache these test credentials
    # for every later test in the process.
    return boto3.Session().client("sqs", region_name="us-east-1")


def test_send_batch_with_stubber_5xx_is_in_doubt(sleeps: list[float]) -> None:
    client = stub_client()
    with Stubber(client) as stub:
        stub.add_client_error(
            "send_message_batch", service_error_code="InternalError", http_status_code=500
        )
        with pytest.raises(SendInDoubt):
            SqsBroker(client).send_batch(URL, [entry(0)])
        stub.assert_no_pending_responses()


def test_send_batch_with_stubber_partial_failure(sleeps: list[float]) -> None:
    client = stub_client()
    with Stubber(client) as stub:
        stub.add_response(
            "send_message_batch",
            {
                "Successful": [{"Id": "0", "MessageId": "m0", "MD5OfMessageBody": "x"}],
                "Failed": [{"Id": "1", "SenderFault": True, "Code": "InvalidParameterValue"}],
            },
        )
        result = SqsBroker(client).send_batch(URL, [entry(0), entry(1), entry(2)])
    assert result.ok == {"0": "m0"}
    assert result.failed["1"].startswith("InvalidParameterValue")
    assert result.failed["2"] == "not in the response"


# -- the send client itself never retries (botocore would resend an unconfirmed batch) ----


class _Always500(http.server.BaseHTTPRequestHandler):
    requests: list[str]

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        self.requests.append(self.headers.get("X-Amz-Target", ""))
        body = json.dumps({"__type": "InternalError", "message": "boom"}).encode()
        self.send_response(500)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def failing_endpoint() -> Iterator[tuple[str, list[str]]]:
    requests: list[str] = []
    handler = type("Handler", (_Always500,), {"requests": requests})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_send_client_makes_exactly_one_request(failing_endpoint: tuple[str, list[str]]) -> None:
    endpoint, requests = failing_endpoint
    sqs = open_sqs(AwsSettings(endpoint, "us-east-1"))
    with pytest.raises(SendInDoubt):
        sqs.send_batch(f"{endpoint}/123456789012/q", [entry(0)])
    assert requests == ["AmazonSQS.SendMessageBatch"]


def test_other_calls_retry_server_errors(failing_endpoint: tuple[str, list[str]]) -> None:
    endpoint, requests = failing_endpoint
    settings = AwsSettings(endpoint, "us-east-1", max_attempts=3)
    with pytest.raises(AwsError, match="InternalError"):
        open_sqs(settings).attributes(f"{endpoint}/123456789012/q")
    assert requests == ["AmazonSQS.GetQueueAttributes"] * 3


class _Page(http.server.BaseHTTPRequestHandler):
    """Answers every request as a proxy, a load balancer or an endpoint lacking the action
    does: a status and a body that is no AWS error."""

    status = 502
    content_type = "text/html; charset=utf-8"
    body = (
        "<!doctype html>\n<html lang=en>\n<title>502 Bad Gateway</title>\n"
        "<h1>Bad Gateway</h1>\n<p>The upstream server did not answer.</p>\n"
    )

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = self.body.encode()
        self.send_response(self.status)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        ({}, "HTTP 502 with an HTML page (502 Bad Gateway)"),
        (
            {"status": 500, "content_type": "text/plain", "body": "Internal Server Error\n"},
            "HTTP 500 (Internal Server Error), not an AWS error",
        ),
        (
            {"status": 503, "content_type": "text/plain", "body": ""},
            "HTTP 503 (Service Unavailable), not an AWS error",
        ),
    ],
    ids=["html", "text", "empty"],
)
def test_an_answer_that_is_no_aws_error_is_one_line_without_the_page(
    page: dict[str, Any], expected: str
) -> None:
    handler = type("Handler", (_Page,), page)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        sqs = open_sqs(AwsSettings(endpoint, "us-east-1", max_attempts=1))
        with pytest.raises(AwsError) as caught:
            sqs.attributes(f"{endpoint}/123456789012/onion-checkout-dlq")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    message = str(caught.value)
    assert "\n" not in message and "<" not in message, message
    assert message.startswith("GetQueueAttributes on ")
    assert expected in message
    assert "--endpoint-url" in message


def test_an_html_error_page_from_a_server_without_the_action() -> None:
    """What moto 5.2's server answers for a call it lacks (e.g. ListMessageMoveTasks)."""
    page = (
        "<!doctype html>\n<html lang=en>\n<title>500 Internal Server Error</title>\n"
        "<h1>Internal Server Error</h1>\n<p>The server encountered an internal error.</p>\n"
    )
    err = raised(client_error("500", 500, page), "ListMessageMoveTasks", resource="onion-dlq")
    assert type(err) is AwsError
    assert str(err) == (
        "ListMessageMoveTasks on onion-dlq failed: the endpoint answered HTTP 500 with an HTML "
        "page (500 Internal Server Error), not an AWS error; it may not implement "
        "ListMessageMoveTasks: check --endpoint-url / AWS_ENDPOINT_URL (and any proxy in "
        "between)"
    )


# -- answers that are not SQS's (issue 22: `KeyError: 'QueueUrl'` from a server saying "ok") --

HTML_PAGE = (
    "<!doctype html>\n<html><head><title>Sign in to the proxy</title></head>\n"
    "<body><form>...</form></body></html>\n"
)
#: What answers in SQS's place: (status, content type, body), and what the line says of it.
FOREIGN = {
    "ok": (200, "text/plain", "ok", "HTTP 200 with text/plain (ok), not an SQS answer"),
    "html": (
        200,
        "text/html; charset=utf-8",
        HTML_PAGE,
        "HTTP 200 with an HTML page (Sign in to the proxy), not an SQS answer",
    ),
    "wrong json": (
        200,
        "application/json",
        '{"status": "ok", "version": 2}',
        "answer (unknown keys: status, version), not an SQS answer",
    ),
    "502 page": (
        502,
        "text/html",
        "<!doctype html>\n<html><title>502 Bad Gateway</title><h1>Bad Gateway</h1></html>\n",
        "HTTP 502 with an HTML page (502 Bad Gateway), not an AWS error",
    ),
}


@contextlib.contextmanager
def foreign_endpoint(status: int, content_type: str, body: str) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 answering every request with ``body``."""
    handler = type(
        "Handler", (_Page,), {"status": status, "content_type": content_type, "body": body}
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


#: Every SQS call the adapter makes, as the engine makes it.
CALLS: dict[str, Callable[[SqsBroker, str], Any]] = {
    "GetQueueUrl": lambda sqs, _: sqs.queue_url("onion-checkout"),
    "GetQueueAttributes": lambda sqs, url: sqs.attributes(url),
    "ListQueues": lambda sqs, _: sqs.list_queues("onion"),
    "ListDeadLetterSourceQueues": lambda sqs, url: sqs.dead_letter_sources(url),
    "ReceiveMessage": lambda sqs, url: sqs.receive(url, hold=30, wait_seconds=0),
    "SendMessageBatch": lambda sqs, url: sqs.send_batch(url, [entry(0)]),
    "DeleteMessageBatch": lambda sqs, url: sqs.delete_batch(url, {"0": "handle"}),
    "ChangeMessageVisibilityBatch": lambda sqs, url: sqs.change_visibility_batch(
        url, {"0": "handle"}, 30
    ),
    "PurgeQueue": lambda sqs, url: sqs.purge(url),
}


@pytest.mark.parametrize("answer", list(FOREIGN))
@pytest.mark.parametrize("call", list(CALLS))
def test_an_answer_that_is_not_sqss_is_one_line_for_every_call(call: str, answer: str) -> None:
    status, content_type, body, said = FOREIGN[answer]
    with foreign_endpoint(status, content_type, body) as endpoint:
        sqs = open_sqs(AwsSettings(endpoint, "us-east-1", max_attempts=1))
        with pytest.raises(RedriveError) as caught:
            CALLS[call](sqs, f"{endpoint}/123456789012/onion-checkout-dlq")
    message = str(caught.value)
    assert "\n" not in message and "<" not in message, message
    assert f"the endpoint {endpoint} answered" in message and said in message, message
    assert "check --endpoint-url / AWS_ENDPOINT_URL" in message, message
    if call == "SendMessageBatch":
        # Something answered the send: it may have reached SQS. Never resent blindly.
        assert isinstance(caught.value, SendInDoubt), message
        assert "may or may not be in the queue" in message
    else:
        # Every call goes there: operations over several queues stop at once.
        assert isinstance(caught.value, ForeignEndpoint), message
        assert message.startswith(f"{call} on "), message


@pytest.mark.parametrize(
    ("call", "body", "said"),
    [
        ("GetQueueUrl", '{"QueueUrl": 5}', "(QueueUrl is not a string)"),
        ("GetQueueUrl", "{}", "(no QueueUrl)"),
        ("GetQueueAttributes", '{"Attributes": [1]}', "(Attributes is not an object)"),
        ("ReceiveMessage", '{"Messages": "none"}', "(Messages is not a list)"),
        (
            "ReceiveMessage",
            '{"Messages": [{"Body": "x"}]}',
            "(an item of Messages has no MessageId)",
        ),
        # SQS (and LocalStack) leave out an empty list; an answer with neither is no answer.
        ("SendMessageBatch", "{}", "(no Successful)"),
        ("SendMessageBatch", '{"Successful": "all"}', "(Successful is not a list)"),
        ("ListQueues", '{"QueueUrls": "abc"}', "(QueueUrls is not a list)"),
        ("DeleteMessageBatch", "[]", "(not an object)"),
    ],
)
def test_json_of_another_shape_is_one_line(call: str, body: str, said: str) -> None:
    """JSON that botocore would parse into a wrong value, crash on, or read as nothing."""
    with foreign_endpoint(200, "application/x-amz-json-1.0", body) as endpoint:
        sqs = open_sqs(AwsSettings(endpoint, "us-east-1", max_attempts=1))
        with pytest.raises(RedriveError) as caught:
            CALLS[call](sqs, f"{endpoint}/123456789012/onion-checkout-dlq")
    message = str(caught.value)
    assert f"JSON that is no {call} answer {said}" in message, message
    assert "--endpoint-url" in message


def test_sqss_own_answers_pass(sqs_client: Any) -> None:
    """moto's answers (SQS's shapes) go through the same check: an empty receive, a
    purge's empty answer, a batch with both lists."""
    url = sqs_client.create_queue(QueueName="answers")["QueueUrl"]
    sqs = SqsBroker(sqs_client)
    assert sqs.queue_url("answers") == url
    assert "QueueArn" in sqs.attributes(url)
    assert sqs.receive(url, hold=30, wait_seconds=0) == []
    sent = sqs.send_batch(url, [entry(0), entry(1)])
    assert set(sent.ok) == {"0", "1"}
    (received, *_) = sqs.receive(url, hold=30, wait_seconds=0)
    assert sqs.delete_batch(url, {"0": received.tag}).ok == {"0": ""}
    sqs.purge(url)


# -- aws_errors ---------------------------------------------------------------------------


def raised(exc: BaseException, action: str = "ReceiveMessage", **kw: Any) -> RedriveError:
    with pytest.raises(RedriveError) as caught, aws_errors(action, **kw):
        raise exc
    message = str(caught.value)
    assert "\n" not in message, message
    assert caught.value.__cause__ is exc
    return caught.value


def test_no_credentials() -> None:
    err = raised(bx.NoCredentialsError())
    assert isinstance(err, AwsUnavailable)
    assert "no AWS credentials" in str(err)
    assert "AWS_PROFILE" in str(err)


def test_profile_not_found() -> None:
    err = raised(bx.ProfileNotFound(profile="prod"))
    assert isinstance(err, AwsUnavailable)
    assert "prod" in str(err) and "--profile" in str(err)


def test_no_region() -> None:
    err = raised(bx.NoRegionError())
    assert isinstance(err, AwsUnavailable)
    assert "--region" in str(err)


def test_invalid_region() -> None:
    err = raised(bx.InvalidRegionError(region_name="bad region"))
    # One family's typo: its own error row, not a stop for every family.
    assert type(err) is AwsError
    assert "bad region" in str(err) and "--region" in str(err)


def test_malformed_endpoint_url_is_one_error() -> None:
    with pytest.raises(AwsUnavailable, match="--endpoint-url"):
        open_sqs(AwsSettings("not a url", "us-east-1"))


@pytest.mark.parametrize(
    "cls", [bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError]
)
def test_unreachable_endpoint(cls: type[bx.BotoCoreError]) -> None:
    err = raised(cls(endpoint_url="http://127.0.0.1:9"))
    assert isinstance(err, AwsUnavailable)
    assert "cannot reach SQS at http://127.0.0.1:9" in str(err)
    assert cls.__name__ in str(err)


def test_connection_closed() -> None:
    err = raised(bx.ConnectionClosedError(endpoint_url="http://127.0.0.1:9"))
    assert isinstance(err, AwsUnavailable)


def test_invalid_request_is_one_line() -> None:
    report = "Invalid type for parameter QueueUrl, value: 1\nMissing required parameter: Entries"
    err = raised(bx.ParamValidationError(report=report), "SendMessageBatch", resource=URL)
    assert type(err) is AwsError
    assert "invalid request" in str(err)
    assert "Missing required parameter" in str(err)


@pytest.mark.parametrize(
    "code", ["AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "NonExistentQueue"]
)
def test_queue_not_found(code: str) -> None:
    err = raised(client_error(code), "GetQueueUrl", resource="onion-nope")
    assert isinstance(err, QueueNotFound)
    assert "onion-nope" in str(err) and "does not exist" in str(err)


@pytest.mark.parametrize(
    ("action", "iam"),
    [
        ("ReceiveMessage", "sqs:ReceiveMessage"),
        ("SendMessageBatch", "sqs:SendMessage"),
        ("DeleteMessageBatch", "sqs:DeleteMessage"),
        ("ChangeMessageVisibilityBatch", "sqs:ChangeMessageVisibility"),
        ("GetQueueAttributes", "sqs:GetQueueAttributes"),
    ],
)
def test_access_denied_names_the_iam_action(action: str, iam: str) -> None:
    err = raised(client_error("AccessDenied", 403), action, resource=URL)
    assert type(err) is AwsError
    assert "access denied" in str(err)
    assert f"{iam} on {URL}" in str(err)
    assert "Batch" not in str(err).split(" on ")[0]


def test_access_denied_exception_code() -> None:
    assert "sqs:PurgeQueue" in str(raised(client_error("AccessDeniedException"), "PurgeQueue"))


@pytest.mark.parametrize("code", ["ExpiredToken", "InvalidClientTokenId", "SignatureDoesNotMatch"])
def test_rejected_credentials(code: str) -> None:
    err = raised(client_error(code, 403))
    assert isinstance(err, AwsUnavailable)
    assert code in str(err) and "refresh" in str(err)


@pytest.mark.parametrize(
    "code", ["ThrottlingException", "RequestThrottled", "AWS.SimpleQueueService.RequestThrottled"]
)
def test_throttling_says_what_to_do(code: str) -> None:
    err = raised(client_error(code), "ReceiveMessage", resource=URL)
    assert type(err) is AwsError
    assert "throttl" in str(err)
    assert "rerun" in str(err)


def test_other_client_errors_keep_code_and_message() -> None:
    err = raised(client_error("KMS.DisabledException", 400, "key disabled\nsecond line"))
    assert type(err) is AwsError
    assert "KMS.DisabledException: key disabled second line" in str(err)


def test_other_botocore_errors() -> None:
    err = raised(bx.PartialCredentialsError(provider="env", cred_var="AWS_SECRET_ACCESS_KEY"))
    assert isinstance(err, AwsError)
    assert "AWS_SECRET_ACCESS_KEY" in str(err)


def test_other_exceptions_pass_through() -> None:
    with pytest.raises(KeyError), aws_errors("ReceiveMessage"):
        raise KeyError("x")


def test_service_name_appears_in_messages() -> None:
    err = raised(client_error("AccessDenied"), "PutObject", resource="s3://b/k", service="s3")
    assert "s3:PutObject" in str(err)


def test_the_translation_is_a_function_of_the_exception_alone() -> None:
    # aws_errors raises what aws_error returns: the decision is testable without a raise.
    denied = aws_error(client_error("AccessDenied"), "SendMessageBatch", resource="q")
    assert type(denied) is AwsError
    assert str(denied).startswith("access denied: the caller may not sqs:SendMessage on q;")
    missing = aws_error(client_error("QueueDoesNotExist"), "GetQueueUrl", resource="q")
    assert type(missing) is QueueNotFound
    assert type(aws_error(bx.NoRegionError(), "ListQueues")) is AwsUnavailable
    refused = aws_error(bx.ParamValidationError(report="bad"), "SendMessage", service="sqs")
    assert str(refused) == "SendMessage: invalid request: Parameter validation failed: bad"
    with pytest.raises(AwsError) as raised, aws_errors("SendMessageBatch", resource="q"):
        raise client_error("AccessDenied")
    assert str(raised.value) == str(denied)
    assert isinstance(raised.value.__cause__, bx.ClientError)
