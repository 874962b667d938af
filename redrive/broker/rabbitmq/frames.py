"""py-amqp's framing where redrive reaches into it (the one place): writes corked, reads
buffered.

Writes: py-amqp writes each ``basic_publish`` (method, header and body frames) with one
``sendall``: a batch of 100 publishes is 100 system calls and as many TCP segments for the
broker to read. Under :meth:`CorkedWriter.corked` the writes gather in a buffer and go as one
when the block ends (a frame over ``frame_max`` is written as py-amqp writes it, into the
same buffer). The bytes on the wire are exactly py-amqp's. ``Connection(frame_writer=...)``
is py-amqp's documented hook.

Reads: py-amqp reads every frame with three ``recv`` calls (its header, its payload, its end
octet): a delivery is three frames, nine system calls, and a batch of confirms as many again.
:class:`Connection` makes its transport one that receives what the socket has, up to
:data:`READ_CHUNK` bytes at once, and serves frames from that buffer (py-amqp's
``Connection.Transport`` is the hook; TLS too: an ``amqps://`` socket's ``read`` is read the
same way). The frames are py-amqp's: the same (type, channel, payload) as its
``read_frame`` gives, the same errors. A read that times out keeps every byte received, so
the next read goes on where it stopped, as py-amqp's does.
"""

from __future__ import annotations

import errno
import ssl
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import amqp
import amqp.exceptions
from amqp import spec
from amqp.exceptions import UnexpectedFrame
from amqp.method_framing import frame_writer
from amqp.serialization import dumps
from amqp.transport import SSLTransport, TCPTransport, _AbstractTransport

from redrive.broker.rabbitmq.properties import Received, deserialized, serialized

#: How much one ``recv`` asks for: a batch of 100 small deliveries is ~50 KiB.
READ_CHUNK: Final = 256 * 1024
_HEADER: Final = struct.Struct(">BHI")
_METHOD: Final = struct.Struct(">HH")
_SIZE: Final = struct.Struct(">I")
_FRAME_END: Final = 0xCE
_END: Final = b"\xce"
#: A content header's class id, weight and body size (its property flags and list follow).
_CONTENT: Final = struct.Struct(">HHQ")
#: A ``recv`` that was interrupted or would block: py-amqp tries again (or, before a frame's
#: first byte, tells a timeout when ``raise_on_initial_eintr``).
_AGAIN: Final = frozenset({errno.EAGAIN, errno.EINTR, errno.ENOENT, errno.EWOULDBLOCK})


class _Cork:
    """The transport's ``write``, or a buffer while corked."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.buffer: bytearray | None = None

    def write(self, data: bytes | memoryview) -> None:
        if self.buffer is None:
            self.transport.write(data)
        else:
            # A copy: py-amqp reuses the memoryview's buffer for the next frame.
            self.buffer += data

    def flush(self) -> None:
        data, self.buffer = self.buffer, None
        if data:
            self.transport.write(bytes(data))


class CorkedWriter:
    """A frame writer for ``amqp.Connection(frame_writer=CorkedWriter)``."""

    def __init__(self, connection: Any, transport: Any) -> None:
        self._connection = connection
        self._cork = _Cork(transport)
        self._write: Callable[..., Any] = frame_writer(connection, self._cork)

    def __call__(self, *args: Any) -> Any:
        return self._write(*args)

    def publish(self, channel: int, arguments: bytes, method: bytes, message: Outgoing) -> None:
        """One ``basic.publish`` (its ``arguments``, and ``method``: its method frame,
        whole), its content header and body frames: the bytes py-amqp's writer gives for
        it, without its per-call format strings and buffer copies. A body that is not
        bytes goes to py-amqp's writer (it encodes text its own way)."""
        body = message.body
        if type(body) is not bytes:
            self._write(1, channel, spec.Basic.Publish, arguments, message)
            return
        properties = message._serialize_properties()
        header = _HEADER.pack(2, channel, 12 + len(properties))
        content = _CONTENT.pack(spec.Basic.CLASS_ID, 0, len(body))
        parts = [method, header, content, properties, _END]
        chunk = self._connection.frame_max - 8
        for at in range(0, len(body), chunk):
            part = body[at : at + chunk]
            parts += (_HEADER.pack(3, channel, len(part)), part, _END)
        self._cork.write(b"".join(parts))
        self._connection.bytes_sent += 1

    @contextmanager
    def corked(self) -> Iterator[None]:
        """Write what the block writes at its end, in one write (written even if the block
        raises: what it published is then on the wire as it would have been uncorked)."""
        if self._cork.buffer is not None:  # already corked: the outer block writes
            yield
            return
        self._cork.buffer = bytearray()
        try:
            yield
        finally:
            self._cork.flush()


class Outgoing(amqp.Message):  # type: ignore[misc]
    """``amqp.Message`` whose header frame's properties are written by
    :func:`redrive.broker.rabbitmq.properties.serialized` (py-amqp's bytes, cheaper)."""

    def __init__(self, body: bytes, received: Received | None = None, **properties: Any) -> None:
        super().__init__(body, **properties)
        self.received = received
        """The headers this message's were received as, if it is sent as received."""

    def _serialize_properties(self) -> bytes:
        try:
            return serialized(self.properties, self.received)
        except Exception:
            # A value py-amqp's own encoder writes in its own way, or refuses as it does.
            data: bytes = super()._serialize_properties()
            return data


def publisher(channel: Any, routing_key: str) -> Callable[[Outgoing], None]:
    """``basic.publish`` of messages through the default exchange to ``routing_key``,
    ``mandatory``: the frames py-amqp's ``basic_publish`` writes (its method's arguments
    framed once, not once a message), without what it does around each publish: a
    ``drain_events(timeout=0)`` for a ``connection.blocked`` notice, three system calls
    and an exception a message when nothing came (py-amqp acts on no such notice; the
    frames that came are read with the batch's confirms)."""
    connection = channel.connection
    if connection is None or not channel.is_open:
        raise amqp.exceptions.RecoverableConnectionError("basic_publish: connection closed")
    writer = connection.frame_writer
    assert isinstance(writer, CorkedWriter), "a lane's connection is a frames.Connection"
    number = channel.channel_id
    arguments = dumps("Bssbb", (0, "", routing_key, True, False))
    # The method frame is the same for every publish of the batch: framed once.
    payload = _METHOD.pack(*spec.Basic.Publish) + arguments
    method = _HEADER.pack(1, number, len(payload)) + payload + _END

    def publish(message: Outgoing) -> None:
        writer.publish(number, arguments, method, message)

    return publish


class Incoming(amqp.Message):  # type: ignore[misc]
    """``amqp.Message`` whose header frame's properties are read by
    :func:`redrive.broker.rabbitmq.properties.deserialized` (py-amqp's values, cheaper)."""

    def _load_properties(self, class_id: int, buf: bytes, offset: int) -> int:
        if class_id == spec.Basic.CLASS_ID:
            try:
                starts: list[int] = []
                self.properties, offset = deserialized(buf, offset, starts)
                headers = self.properties.get("application_headers")
                # Where each header is in the frame: a resend copies the unchanged ones.
                self.received = Received(headers, buf, starts) if headers else None
                return offset
            except Exception:
                pass  # malformed or unusual: py-amqp reads it (or raises) as it does
        end: int = super()._load_properties(class_id, buf, offset)
        return end


#: The methods whose content (a header frame, body frames) follows them.
_CONTENT_METHODS: Final = frozenset({spec.Basic.Return, spec.Basic.Deliver, spec.Basic.GetOk})


def frame_handler(connection: Any, callback: Callable[..., Any]) -> Callable[..., bool]:
    """py-amqp's ``method_framing.frame_handler`` (5.x), its messages :class:`Incoming`:
    ``Connection(frame_handler=...)`` is py-amqp's hook, the frames and errors its own."""
    expected: dict[int, int] = {}
    partial: dict[int, Any] = {}

    def on_frame(frame: tuple[int, int, bytes]) -> bool:
        frame_type, channel, buf = frame
        connection.bytes_recv += 1
        wanted = expected.get(channel, 1)
        if frame_type != wanted and frame_type != 8:
            raise UnexpectedFrame(f"Received frame {frame_type} while expecting type: {wanted}")
        if frame_type == 1:
            method_sig = _METHOD.unpack_from(buf, 0)
            if method_sig in _CONTENT_METHODS:
                # Keep what came until the content header (and body) come.
                partial[channel] = Incoming(frame_method=method_sig, frame_args=buf)
                expected[channel] = 2
                return False
            callback(channel, method_sig, buf, None)
        elif frame_type == 2:
            message = partial[channel]
            message.inbound_header(buf)
            if not message.ready:
                expected[channel] = 3  # its body frames next
                return False
            expected[channel] = 1  # a message with no body: done
            del partial[channel]
            callback(channel, message.frame_method, message.frame_args, message)
        elif frame_type == 3:
            message = partial[channel]
            message.inbound_body(buf)
            if not message.ready:
                return False  # more body frames to come
            expected[channel] = 1
            del partial[channel]
            callback(channel, message.frame_method, message.frame_args, message)
        elif frame_type == 8:
            return False  # a heartbeat (counted above)
        return True

    return on_frame


class FrameReader:
    """AMQP frames from a buffer of what ``recv`` gave (see the module's docstring): each
    ``recv`` asks for up to :data:`READ_CHUNK` bytes (or the rest of a larger frame)."""

    def __init__(self, recv: Callable[[int], bytes], raise_on_initial_eintr: bool) -> None:
        self._recv = recv
        self._raise_on_initial_eintr = raise_on_initial_eintr
        self._data = b""
        self._at = 0

    def ready(self) -> bool:
        """Whether the next frame is all in the buffer (:meth:`read` then calls no
        ``recv``)."""
        data, at = self._data, self._at
        if len(data) - at < _HEADER.size:
            return False
        (size,) = _SIZE.unpack_from(data, at + 3)
        return bool(at + _HEADER.size + size < len(data))

    def read(self) -> tuple[int, int, bytes]:
        """The next frame: (type, channel, payload), as py-amqp's ``read_frame`` gives it."""
        while True:
            data, at = self._data, self._at
            have = len(data) - at
            if have >= _HEADER.size:
                frame_type, channel, size = _HEADER.unpack_from(data, at)
                end = at + _HEADER.size + size
                if end < len(data):
                    if data[end] != _FRAME_END:
                        raise UnexpectedFrame(
                            f"Received frame_end {data[end]:#04x} while expecting 0xce"
                        )
                    self._at = end + 1
                    return frame_type, channel, data[at + _HEADER.size : end]
                self._receive(end + 1 - len(data), initial=False)
            else:
                self._receive(_HEADER.size - have, initial=True)

    def _receive(self, missing: int, *, initial: bool) -> None:
        """One ``recv`` more into the buffer (what is unread of it kept, whatever is
        raised)."""
        while True:
            try:
                chunk = self._recv(max(READ_CHUNK, missing))
            except OSError as exc:
                if exc.errno not in _AGAIN:
                    raise
                if initial and self._raise_on_initial_eintr:
                    raise TimeoutError() from None
                continue
            break
        if not chunk:
            raise OSError("Server unexpectedly closed connection")
        rest = self._data[self._at :]
        self._data = rest + chunk if rest else chunk
        self._at = 0


def _read_frame(transport: Any) -> tuple[int, int, bytes]:
    """``read_frame`` of a buffered transport, its errors py-amqp's."""
    try:
        frame: tuple[int, int, bytes] = transport.frames.read()
        return frame
    except TimeoutError:
        raise
    except OSError as exc:
        if isinstance(exc, ssl.SSLError) and "timed out" in str(exc):
            # Not a lost connection (http://bugs.python.org/issue10272), as py-amqp says.
            raise TimeoutError() from None
        if exc.errno not in _AGAIN:
            transport.connected = False
        raise


def _having_timeout(transport: Any, timeout: float | None) -> Iterator[Any]:
    """py-amqp's ``having_timeout`` (the socket's timeout set for a read, and set back),
    but not when the next frame is already in the buffer: the read needs no ``recv``, and
    setting a socket's timeout is a system call each way (two a frame, where most frames
    now come from the buffer)."""
    frames = getattr(transport, "frames", None)
    if timeout is None or (frames is not None and frames.ready()):
        yield transport.sock
        return
    with _AbstractTransport.having_timeout(transport, timeout) as sock:
        yield sock


class _Buffered:
    """What both buffered transports add to py-amqp's (mixed in before it)."""

    raise_on_initial_eintr: bool

    def _setup_transport(self) -> None:
        super()._setup_transport()  # type: ignore[misc]
        self.frames = FrameReader(self._quick_recv, self.raise_on_initial_eintr)  # type: ignore[attr-defined]

    def read_frame(self, unpack: Any = None) -> tuple[int, int, bytes]:
        return _read_frame(self)

    @contextmanager
    def having_timeout(self, timeout: float | None) -> Iterator[Any]:
        yield from _having_timeout(self, timeout)


class BufferedTCPTransport(_Buffered, TCPTransport):  # type: ignore[misc]
    """py-amqp's TCP transport, its frames read from a buffer."""


class BufferedSSLTransport(_Buffered, SSLTransport):  # type: ignore[misc]
    """py-amqp's TLS transport, its frames read from a buffer (of what the TLS socket's
    ``read`` gave: at most a TLS record, 16 KiB, each)."""


class Connection(amqp.Connection):  # type: ignore[misc]
    """``amqp.Connection`` with its frames read buffered and written by a
    :class:`CorkedWriter`."""

    def __init__(self, host: str, **kwargs: Any) -> None:
        super().__init__(host, frame_handler=frame_handler, frame_writer=CorkedWriter, **kwargs)

    def Transport(  # py-amqp's name for the hook
        self,
        host: str,
        connect_timeout: float | None,
        ssl: Any = False,
        read_timeout: float | None = None,
        write_timeout: float | None = None,
        socket_settings: Any = None,
        **kwargs: Any,
    ) -> Any:
        kind = BufferedSSLTransport if ssl else BufferedTCPTransport
        return kind(
            host,
            connect_timeout=connect_timeout,
            ssl=ssl,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            socket_settings=socket_settings,
            **kwargs,
        )
