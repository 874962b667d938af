"""The lean SQS call path (issue 25): the per-message calls without botocore's call machinery.

ReceiveMessage, SendMessageBatch, DeleteMessageBatch and ChangeMessageVisibilityBatch cost
about three times less client CPU made here than through a botocore client's method: JSON
over a keep-alive ``http.client`` pool, signed by botocore's own ``SigV4Auth``. Everything a
call's guarantees rest on stays botocore's, taken from the client the transport is built
from: credentials (refreshable ones re-read per request, as botocore's signer does), the
endpoint botocore resolved, TLS verification and CA bundle, proxies, timeouts, and the
client's own retry handler (its retry mode, max attempts, quota and adaptive rate limiter,
driven by the same events botocore's endpoint emits). An answer comes back as the dict
botocore's method returns, and an error as the exception botocore raises, so
:func:`redrive.aws.errors.aws_errors` and :class:`~redrive.broker.sqs.calls.SqsCalls`'
in-doubt rules work unchanged. Every 2xx answer is checked as :mod:`redrive.aws.answers`
checks botocore's. SendMessageBatch is never retried here: SqsCalls retries it only when
provably not sent.

Clock skew, as botocore handles it for SQS (read in botocore 1.44: endpoint.py, auth.py,
retries/standard.py, retryhandler.py, data/_retry.json): it does not correct it. SigV4 signs
with the local clock (``botocore.auth.get_current_datetime``) on every attempt; no retry
mode names RequestTimeTooSkewed, SignatureDoesNotMatch or a skew among its retryable errors,
so a skewed request fails as its error and is not resent; no offset is kept between calls.
The one thing botocore derives from the server's ``Date`` is the ``ttl=`` of a retry's
``amz-sdk-request`` header (the server's time by which the retry's answer is awaited),
which this path writes the same way (:meth:`LeanTransport._note_ttl`). So a machine whose
clock is off fails here exactly as it fails on botocore, with the same error.
"""

from __future__ import annotations

import base64
import datetime
import functools
import http.client
import json
import os
import select
import socket
import ssl
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import botocore
import botocore.auth
import botocore.awsrequest
import botocore.compat
import botocore.exceptions
import botocore.httpsession
import botocore.parsers
import botocore.retries.standard
import botocore.utils
from botocore.hooks import first_non_none_response

from redrive.aws.answers import ENDPOINT_KEY, ForeignAnswer, json_misfit, not_the_answer
from redrive.aws.session import AwsSettings
from redrive.broker.sqs.broker import SqsBroker
from redrive.errors import UsageProblem

OPERATIONS: Final = (
    "ReceiveMessage",
    "SendMessageBatch",
    "DeleteMessageBatch",
    "ChangeMessageVisibilityBatch",
)
# A batch whose answer was lost may be in the queue: SqsCalls decides, never a resend here.
_NEVER_RETRIED: Final = frozenset({"SendMessageBatch"})
_Convert = Callable[[Any], Any]


class LeanUnsupported(ValueError):
    """A client setting the lean path does not implement (the botocore path still does)."""


# -- what botocore's JSON serializer and parser do to values, worked out once per shape ------


def _to_base64(value: Any) -> str:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    return base64.b64encode(raw).decode("ascii")


def _writer(shape: Any) -> _Convert | None:
    """How botocore's JSONSerializer writes a value of ``shape``; None: as it is."""
    kind = shape.type_name
    if kind == "blob":
        return _to_base64
    if kind == "timestamp":
        raise LeanUnsupported(f"a timestamp input ({shape.name})")
    if kind == "list":
        item = _writer(shape.member)
        return None if item is None else (lambda v: [item(x) for x in v])
    if kind == "map":
        value = _writer(shape.value)
        return None if value is None else (lambda v: {k: value(x) for k, x in v.items()})
    if kind == "structure" and not shape.is_document_type:
        members = {
            name: (member.serialization.get("name", name), _writer(member))
            for name, member in shape.members.items()
        }
        if all(key == name and write is None for name, (key, write) in members.items()):
            return None

        def write(value: Mapping[str, Any]) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for name, item in value.items():
                key, convert = members[name]
                out[key] = item if convert is None else convert(item)
            return out

        return write
    return None


def _reader(shape: Any) -> _Convert | None:
    """How botocore's JSON parser turns ``json.loads``' value of ``shape`` into what its
    methods return: blobs decoded, members by their model names, unknown keys and nulls of a
    structure dropped; None: as it is."""
    kind = shape.type_name
    if kind == "blob":
        return base64.b64decode
    if kind == "timestamp":
        return botocore.parsers.DEFAULT_TIMESTAMP_PARSER
    if kind == "list":
        item = _reader(shape.member)
        if item is None:
            return None
        return lambda v: [None if x is None else item(x) for x in v]
    if kind == "map":
        value = _reader(shape.value)
        return None if value is None else (lambda v: {k: value(x) for k, x in v.items()})
    if kind == "structure" and not shape.is_document_type:
        return _structure_reader(shape)
    return None


def _structure_reader(shape: Any) -> _Convert:
    members = [
        (member.serialization.get("name", name), name, _reader(member))
        for name, member in shape.members.items()
    ]

    def read(value: Any) -> dict[str, Any] | None:
        if value is None:
            return None
        out: dict[str, Any] = {}
        for key, name, convert in members:
            item = value.get(key)
            if item is not None:
                out[name] = item if convert is None else convert(item)
        return out

    return read


@dataclass(frozen=True)
class _Operation:
    name: str
    model: Any
    target: str
    write: _Convert | None
    read: _Convert

    @classmethod
    def of(cls, service_model: Any, name: str) -> _Operation:
        model = service_model.operation_model(name)
        prefix = service_model.metadata["targetPrefix"]
        return cls(
            name=name,
            model=model,
            target=f"{prefix}.{name}",
            write=None if model.input_shape is None else _writer(model.input_shape),
            read=_structure_reader(model.output_shape),
        )

    def body(self, params: Mapping[str, Any]) -> bytes:
        # json.dumps' defaults, as botocore's: the bytes signed are the bytes botocore sends.
        value = params if self.write is None else self.write(params)
        return json.dumps(value).encode("utf-8")


# -- the connections ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    url: str
    host: str
    port: int
    path: str
    """What the request line names: the path, or the whole URL through an HTTP proxy."""
    tls: ssl.SSLContext | None
    proxy: tuple[str, int, str] | None
    """The proxy's host, port and URL."""
    proxy_headers: Mapping[str, str]
    connect_timeout: float | None
    read_timeout: float | None


def _tls_context(verify: Any, client_cert: Any) -> ssl.SSLContext:
    """TLS as botocore's http session verifies it (its CA bundle: AWS_CA_BUNDLE, the
    config's ca_bundle, ``--no-verify-ssl``). One context per bundle and client certificate
    as they are on disk now, shared by every transport that needs it (an SSLContext is made
    to be shared): loading a CA bundle costs ~70 ms of CPU, and each worker's client made one."""
    cafile = None if verify is False else botocore.httpsession.get_cert_path(verify)
    certs = (client_cert,) if isinstance(client_cert, str) else tuple(client_cert or ())
    return _shared_tls_context(
        verify is False, cafile, certs, tuple(_on_disk(p) for p in (cafile, *certs))
    )


def _on_disk(path: str | None) -> tuple[int, int] | None:
    """A file's size and mtime: a bundle rewritten in place is loaded again."""
    if path is None:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None  # loading it fails, and says why
    return stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=16)
def _shared_tls_context(
    unverified: bool, cafile: str | None, certs: tuple[str, ...], _stamps: tuple[object, ...]
) -> ssl.SSLContext:
    if unverified:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(cafile=cafile)
    if certs:
        context.load_cert_chain(*certs)
    return context


_PROXY_HOST_FLAG: Final = "BOTO_EXPERIMENTAL__ADD_PROXY_HOST_HEADER"


def _unauthed(url: str) -> str:
    """A proxy URL without its password (a refusal is printed)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, f"{parts.username}:***@{netloc}", *parts[2:]))


def _target_of(client: Any, url: str) -> _Target:
    """Where and how the calls go: the proxy is the one botocore chose when it built the
    client's endpoint (``HTTP_PROXY``/``HTTPS_PROXY`` by the URL's scheme unless ``NO_PROXY``
    bypasses its host, through botocore.utils.get_environ_proxies, or the config's
    ``proxies``): taken from its http session, never decided again here."""
    parts = urlsplit(url)
    https = parts.scheme == "https"
    session = client._endpoint.http_session
    config = client.meta.config
    proxies = session._proxy_config
    proxy_url = proxies.proxy_url_for(url)
    proxy: tuple[str, int, str] | None = None
    headers: Mapping[str, str] = {}
    if proxy_url:
        at = urlsplit(proxy_url)
        if at.scheme != "http":
            # urllib3 speaks TLS to an https:// proxy (TLS in TLS for an https endpoint,
            # proxies_config's CA bundle, client cert and forwarding): not done here. For an
            # http:// proxy proxies_config changes nothing in urllib3, so it needs no refusal.
            raise LeanUnsupported(f"a proxy spoken to over {at.scheme} ({_unauthed(proxy_url)})")
        proxy = (at.hostname or "", at.port or 80, proxy_url)
        # Proxy-Authorization from the URL's user and password, as botocore words it: on
        # the CONNECT of a tunnel, on every request forwarded in plain HTTP.
        headers = dict(proxies.proxy_headers_for(proxy_url))
        if botocore.utils.ensure_boolean(os.environ.get(_PROXY_HOST_FLAG, "")):
            # botocore's experimental flag, read per send there, once per transport here.
            headers["host"] = parts.hostname or ""
    return _Target(
        url=url,
        host=parts.hostname or "",
        port=parts.port or (443 if https else 80),
        # Through an HTTP proxy a plain-HTTP request names the whole URL; HTTPS tunnels.
        path=url if proxy and not https else (parts.path or "/"),
        tls=_tls_context(getattr(session, "_verify", True), config.client_cert) if https else None,
        proxy=proxy,
        proxy_headers=headers,
        connect_timeout=config.connect_timeout,
        read_timeout=config.read_timeout,
    )


def _dropped(connection: http.client.HTTPConnection) -> bool:
    """Whether the server closed an idle keep-alive connection (urllib3 checks the same
    before reusing one): a send on it would fail after the request may have left."""
    sock = connection.sock
    if sock is None:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class _Pool:
    """Keep-alive connections to one endpoint, for any number of threads: an idle one is
    reused, else a new one opened; at most ``size`` are kept idle."""

    def __init__(self, target: _Target, size: int) -> None:
        self.target = target
        self.size = size
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        # Closed when the pool is dropped, as urllib3's pools are: a transport lives as long
        # as its broker, and nobody need remember to close it.
        weakref.finalize(self, _close_all, self._idle)

    def exchange(
        self, request: botocore.awsrequest.AWSPreparedRequest, body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        """One request and its answer: status, headers (lower-cased, as botocore's) and body
        (``body``: the request's own bytes)."""
        connection = self._take()
        url = self.target.url
        try:
            connection.request("POST", self.target.path, body=body, headers=self._headers(request))
            response = connection.getresponse()
            answer = response.read()
        except TimeoutError as exc:
            connection.close()
            raise botocore.exceptions.ReadTimeoutError(endpoint_url=url, error=exc) from exc
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise botocore.exceptions.ConnectionClosedError(
                endpoint_url=url, error=exc, request=request
            ) from exc
        headers: dict[str, str] = {}
        for name, value in response.getheaders():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        if response.will_close:
            connection.close()
        else:
            self._give_back(connection)
        return response.status, headers, answer

    def _headers(self, request: botocore.awsrequest.AWSPreparedRequest) -> dict[str, str]:
        headers = dict(request.headers.items())
        if self.target.proxy and self.target.tls is None:
            headers.update(self.target.proxy_headers)
        return headers

    def _take(self) -> http.client.HTTPConnection:
        with self._lock:
            while self._idle:
                connection = self._idle.pop()
                if not _dropped(connection):
                    return connection
                connection.close()
        return self._open()

    def _give_back(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self.size:
                self._idle.append(connection)
                return
        connection.close()

    def _open(self) -> http.client.HTTPConnection:
        """A new connection, its errors botocore's (urllib3's, as botocore maps them)."""
        target = self.target
        host, port = (
            (target.proxy[0], target.proxy[1]) if target.proxy else (target.host, target.port)
        )
        connection: http.client.HTTPConnection
        if target.tls is not None:
            connection = http.client.HTTPSConnection(
                host, port, timeout=target.connect_timeout, context=target.tls
            )
            if target.proxy:
                connection.set_tunnel(target.host, target.port, headers=dict(target.proxy_headers))
        else:
            connection = http.client.HTTPConnection(host, port, timeout=target.connect_timeout)
        try:
            connection.connect()
        except TimeoutError as exc:
            raise botocore.exceptions.ConnectTimeoutError(
                endpoint_url=target.url, error=exc
            ) from exc
        except ssl.SSLError as exc:
            raise botocore.exceptions.SSLError(endpoint_url=target.url, error=exc) from exc
        except OSError as exc:
            if target.proxy:
                raise botocore.exceptions.ProxyConnectionError(
                    proxy_url=target.proxy[2], error=exc
                ) from exc
            raise botocore.exceptions.EndpointConnectionError(
                endpoint_url=target.url, error=exc
            ) from exc
        assert connection.sock is not None
        # The connect timeout bounds the connect (and TLS); the read timeout every wait after.
        connection.sock.settimeout(target.read_timeout)
        # http.client writes headers and body apart: without this, Nagle's algorithm holds the
        # body until the headers are acknowledged (urllib3, botocore's, sets it too).
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection

    def close(self) -> None:
        with self._lock:
            _close_all(self._idle)


def _close_all(connections: list[http.client.HTTPConnection]) -> None:
    while connections:
        connections.pop().close()


# -- the transport -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Answer:
    """What botocore's retry handlers and after-call hooks read of an HTTP answer (its
    AWSResponse's fields)."""

    url: str
    status_code: int
    headers: Mapping[str, str]
    content: bytes


def _resolved_endpoint(client: Any) -> str:
    """The endpoint botocore's resolver gives the client's calls (region, FIPS, dual-stack,
    AWS_ENDPOINT_URL, ``--endpoint-url``): SQS's rules do not depend on a call's queue, so
    once per transport."""
    model = client.meta.service_model.operation_model("ReceiveMessage")
    context: dict[str, Any] = {"client_config": client.meta.config}
    url, headers, properties = client._resolve_endpoint_ruleset(model, {}, context)
    if headers or properties:
        # Headers or auth schemes the rules add would be botocore's to apply, not ours.
        raise LeanUnsupported(f"an endpoint with rules' headers or properties ({url})")
    return str(url)


def _request_url(endpoint_url: str) -> str:
    """Where botocore POSTs a JSON-protocol call: the endpoint's path, "/" when it has none
    (botocore.awsrequest's join of the endpoint and the operation's "/")."""
    parts = urlsplit(endpoint_url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", parts.query, ""))


def _total_attempts(config: Any) -> int:
    """Attempts as botocore counts them, for the ``amz-sdk-request`` header only: the retry
    decisions are the client's own handler's."""
    retries = config.retries or {}
    if "total_max_attempts" in retries:
        return int(retries["total_max_attempts"])
    if "max_attempts" in retries:
        return int(retries["max_attempts"]) + 1
    return 3


# Newer botocore (MaxAttemptsSeeder) names ``max`` in the first attempt's header too; older
# releases (1.40.2, the floor) add it only once a retry has been weighed, so their first
# attempt's header has none. The lean path's header is the installed botocore's.
_MAX_ON_FIRST_ATTEMPT = hasattr(botocore.retries.standard, "MaxAttemptsSeeder")


def retry_header(attempt: int, max_attempts: int, ttl: str | None) -> str:
    """botocore's ``amz-sdk-request`` (add_retry_headers: ttl, attempt, max, those set)."""
    parts = [] if ttl is None else [f"ttl={ttl}"]
    parts.append(f"attempt={attempt}")
    if attempt > 1 or _MAX_ON_FIRST_ATTEMPT:
        parts.append(f"max={max_attempts}")
    return "; ".join(parts)


class LeanTransport:
    """The four per-message SQS calls for one botocore ``client``, as that client makes them
    (see the module). Thread-safe: one transport serves every worker."""

    def __init__(
        self,
        client: Any,
        *,
        pool_size: int | None = None,
        clock: Callable[[], datetime.datetime] | None = None,
    ) -> None:
        meta = client.meta
        service = meta.service_model
        if service.protocol != "json":
            raise LeanUnsupported(f"the {service.protocol} protocol")
        self.client = client
        self.endpoint_url = _resolved_endpoint(client)
        self._url = _request_url(self.endpoint_url)
        self._events = meta.events
        self._service_id = service.service_id.hyphenize()
        self._service_name = str(service.metadata.get("serviceId", "SQS"))
        self._signer = client._request_signer
        self._unsigned = meta.config.signature_version is botocore.UNSIGNED
        self._max_attempts = _total_attempts(meta.config)
        self._region = meta.region_name
        self._config = meta.config
        self._read_timeout: Any = meta.config.read_timeout
        # The clock botocore's endpoint reads (naive UTC), injectable for a test.
        self._clock: Callable[[], datetime.datetime] = clock or botocore.compat.get_current_datetime
        self._query_mode = bool(service.is_query_compatible)
        self._content_type = f"application/x-amz-json-{service.metadata['jsonVersion']}"
        self._user_agent = f"Botocore/{botocore.__version__} redrive-lean"
        self._operations = {name: _Operation.of(service, name) for name in OPERATIONS}
        self._error_parser = botocore.parsers.create_parser("json")
        size = pool_size or meta.config.max_pool_connections or 10
        self._pool = _Pool(_target_of(client, self._url), size)

    def close(self) -> None:
        self._pool.close()

    def signed_request(
        self,
        operation: str,
        body: bytes,
        *,
        attempt: int = 1,
        invocation: str = "",
        ttl: str | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> botocore.awsrequest.AWSRequest:
        """The request botocore would send for ``body``, signed now with the credentials'
        current key (a refreshable set refreshes here when due, as botocore's signer does)."""
        headers = {
            "X-Amz-Target": self._operations[operation].target,
            "Content-Type": self._content_type,
        }
        if self._query_mode:
            headers["x-amzn-query-mode"] = "true"
        headers["User-Agent"] = self._user_agent
        if extra:  # what before-call's handlers added to the request dict's headers
            headers.update(extra)
        request = botocore.awsrequest.AWSRequest(
            method="POST", url=self._url, data=body, headers=headers
        )
        if not self._unsigned:
            credentials = self._signer._credentials
            if credentials is None:
                raise botocore.exceptions.NoCredentialsError()
            botocore.auth.SigV4Auth(
                credentials.get_frozen_credentials(),
                self._signer._signing_name,
                self._signer._region_name,
            ).add_auth(request)
        # Unsigned, as botocore adds them: which call and attempt this is, for the service.
        request.headers["amz-sdk-invocation-id"] = invocation or str(uuid.uuid4())
        request.headers["amz-sdk-request"] = retry_header(attempt, self._max_attempts, ttl)
        return request

    def request_body(self, operation: str, params: Mapping[str, Any]) -> bytes:
        """The JSON botocore's serializer writes for ``params``, byte for byte."""
        return self._operation(operation).body(params)

    def _operation(self, operation: str) -> _Operation:
        op = self._operations.get(operation)
        if op is None:
            raise ValueError(f"the lean SQS path does not make {operation}")
        return op

    def call(self, operation: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """What ``client.<operation>(**params)`` returns, or the exception it raises."""
        op = self._operation(operation)
        body = op.body(params)
        # botocore's request context (the retry handler keeps its quota capacity here) and
        # request dict, as its client method hands them to before-call's handlers: botocore's
        # own (the Lambda recursion-detection header) and a Stubber's, which answers itself.
        context: dict[str, Any] = {
            "client_region": self._region,
            "client_config": self._config,
            "retries": {"attempt": 1, "invocation-id": str(uuid.uuid4())},
        }
        headers: dict[str, str] = {}
        request_dict = {"url": self._url, "method": "POST", "headers": headers, "body": body}
        request_dict["context"] = context
        event = f"{self._service_id}.{op.name}"
        _, answered = self._events.emit_until_response(
            f"before-call.{event}",
            model=op.model,
            params=request_dict,
            request_signer=self._signer,
            context=context,
        )
        answer: Any
        parsed: dict[str, Any]
        if answered is not None:
            answer, parsed = answered
        else:
            answer, parsed = self._send(op, body, headers, request_dict)
        self._events.emit(
            f"after-call.{event}",
            http_response=answer,
            parsed=parsed,
            model=op.model,
            context=context,
        )
        if answer.status_code >= 300:
            error = parsed.get("Error", {})  # (the code as botocore's client method reads it)
            code = context.get("error_code_override") or error.get("Code")
            raise self.client.exceptions.from_code(code)(parsed, op.name)
        return parsed

    def _send(
        self, op: _Operation, body: bytes, headers: Mapping[str, str], request_dict: Any
    ) -> tuple[_Answer, dict[str, Any]]:
        """The attempts botocore's endpoint makes, its retry handler judging each."""
        context = request_dict["context"]
        attempts = 1
        while True:
            answer, parsed, caught = self._attempt(op, body, headers, context)
            if not self._retry(op, attempts, request_dict, answer, parsed, caught):
                break
            attempts += 1
            context["retries"]["attempt"] = attempts
            if answer is not None:
                self._note_ttl(context["retries"], answer)
        if parsed is not None and "ResponseMetadata" in parsed:
            parsed["ResponseMetadata"]["RetryAttempts"] = attempts - 1
        if caught is not None:
            event = f"after-call-error.{self._service_id}.{op.name}"
            self._events.emit(event, exception=caught, context=context)
            raise caught
        assert answer is not None and parsed is not None
        return answer, parsed

    def _attempt(
        self, op: _Operation, body: bytes, extra: Mapping[str, str], context: Mapping[str, Any]
    ) -> tuple[_Answer | None, dict[str, Any] | None, Exception | None]:
        """One attempt, as botocore's endpoint makes it: any exception is caught (for the
        retry handler to judge) and the answer is lost when its check fails."""
        retries = context["retries"]
        try:
            request = self.signed_request(
                op.name,
                body,
                attempt=retries["attempt"],
                invocation=retries["invocation-id"],
                ttl=retries.get("ttl"),
                extra=extra,
            )
            # Prepared once, as botocore's endpoint sends it: the adaptive mode's rate limiter
            # waits here, and a stub (moto's mock_aws) answers in the server's place.
            # (Built, not ``request.prepare()``d: nothing here needs preparing, and that copy
            # of the headers is CPU on every call.)
            prepared = botocore.awsrequest.AWSPreparedRequest(
                "POST", self._url, request.headers, body, False
            )
            stubbed = first_non_none_response(
                self._events.emit(f"before-send.{self._service_id}.{op.name}", request=prepared)
            )
            if stubbed is not None:
                status = int(stubbed.status_code)
                headers = {k.lower(): v for k, v in stubbed.headers.items()}
                raw = bytes(stubbed.content)
            else:
                status, headers, raw = self._pool.exchange(prepared, body)
            answer = _Answer(self._url, status, headers, raw)
            return answer, self._parsed(op, status, headers, raw), None
        except Exception as exc:  # botocore's endpoint catches every one alike
            return None, None, exc

    def _note_ttl(self, retries: dict[str, Any], answer: _Answer) -> None:
        """botocore's endpoint's only use of the server's clock (``_set_ttl``), done the
        same: before a retry, the last answer's Date gives the skew, and the retry's
        ``amz-sdk-request`` says by when (the local clock plus the read timeout plus the skew,
        the server's time) its answer is awaited. Nothing is re-signed or re-dated."""
        date = answer.headers.get("date")
        if not date:
            return
        try:
            received = self._clock()
            skew = datetime.datetime.strptime(date, "%a, %d %b %Y %H:%M:%S %Z") - received
            ttl = self._clock() + datetime.timedelta(seconds=self._read_timeout) + skew
            retries["ttl"] = ttl.strftime("%Y%m%dT%H%M%SZ")
        except Exception:  # botocore logs and goes on: a bad Date is the server's
            return

    def _retry(
        self,
        op: _Operation,
        attempts: int,
        request_dict: Mapping[str, Any],
        answer: _Answer | None,
        parsed: dict[str, Any] | None,
        caught: Exception | None,
    ) -> bool:
        """Whether the client's own retry handler retries (after sleeping its delay)."""
        responses = self._events.emit(
            f"needs-retry.{self._service_id}.{op.name}",
            response=None if caught is not None else (answer, parsed),
            endpoint=None,
            operation=op.model,
            attempts=attempts,
            caught_exception=caught,
            request_dict=request_dict,
        )
        delay = first_non_none_response(responses)
        if delay is None or delay is False or op.name in _NEVER_RETRIED:
            return False
        time.sleep(float(delay))
        return True

    def _parsed(
        self, op: _Operation, status: int, headers: dict[str, str], raw: bytes
    ) -> dict[str, Any]:
        """The answer as botocore's parser gives it; a 2xx that is no SQS answer raises
        ForeignAnswer, as the check redrive hooks into every botocore client does."""
        if status >= 300:
            # Errors are rare: botocore's own parser words them (codes, generic 5xx pages).
            response = {"status_code": status, "headers": headers, "body": raw}
            parsed: dict[str, Any] = self._error_parser.parse(response, op.model.output_shape)
            parsed[ENDPOINT_KEY] = self.endpoint_url
            return parsed
        value: Any = None
        what: str | None
        try:
            value = json.loads(raw) if raw.strip() else None
        except ValueError:
            value = None
        if value is None:
            response = {"status_code": status, "headers": headers, "body": raw}
            what = not_the_answer(op.model, response) or f"HTTP {status} with JSON null"
        else:
            what = json_misfit(op.model, status, value)
        if what is not None:
            raise ForeignAnswer(endpoint=self.endpoint_url, what=what, service=self._service_name)
        parsed = op.read(value)
        metadata: dict[str, Any] = {}
        if "x-amzn-requestid" in headers:
            metadata["RequestId"] = headers["x-amzn-requestid"]
        metadata["HTTPStatusCode"] = status
        metadata["HTTPHeaders"] = headers
        parsed["ResponseMetadata"] = metadata
        return parsed


def lean_calls(settings: AwsSettings, *, region: str | None = None) -> SqsBroker:
    """SQS in ``region`` as :func:`redrive.broker.sqs.open_sqs` opens it, its per-message calls
    on the lean path (everything else on the same botocore clients)."""
    client = settings.client("sqs", region=region)
    # As open_sqs: sends on a client that never retries by itself (see SqsCalls.send_batch).
    send_client = settings.client("sqs", region=region, max_attempts=1)
    try:
        lean, lean_send = LeanTransport(client), LeanTransport(send_client)
    except LeanUnsupported as exc:
        # Refused, not quietly run on botocore: the audit records the client the operator
        # chose, so the client asked for is the client that runs. Nothing has been sent yet.
        raise UsageProblem(
            f"--sqs-client lean: the lean SQS path does not implement {exc}: "
            "use --sqs-client botocore"
        ) from None
    return SqsBroker(client, send_client=send_client, lean=lean, lean_send=lean_send)


__all__ = ["OPERATIONS", "LeanTransport", "LeanUnsupported", "lean_calls"]
