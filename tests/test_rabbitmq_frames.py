"""The buffered frame reader (redrive/broker/rabbitmq/frames.py) against what py-amqp's own
``read_frame`` gives for the same bytes, however the socket splits them: frames across
``recv`` boundaries, many frames in one ``recv``, a read that times out halfway and goes on,
a lost connection, a bad frame end; and the publishes it frames itself against py-amqp's
frame writer's bytes. The real socket, on a real node, is tests/test_rabbitmq_broker.py's."""

from __future__ import annotations

import errno
import socket
import ssl
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from amqp import spec
from amqp.exceptions import UnexpectedFrame
from amqp.method_framing import frame_writer
from amqp.serialization import dumps
from amqp.transport import TCPTransport
from conftest import self_signed

from redrive.broker.rabbitmq.frames import (
    READ_CHUNK,
    BufferedSSLTransport,
    Connection,
    CorkedWriter,
    FrameReader,
    Outgoing,
    publisher,
)


def frame(frame_type: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


FRAMES = [
    (1, 1, b"\x00\x3c\x00\x3c" + b"method" * 5),
    (2, 1, b"\x00\x3c\x00\x00" + bytes(range(200))),
    (3, 1, b'{"body": "x"}' * 40),
    (8, 0, b""),  # a heartbeat: an empty payload
    (3, 7, bytes(READ_CHUNK + 123)),  # larger than one recv asks for
]
WIRE = b"".join(frame(*f) for f in FRAMES)


class Socket:
    """``recv`` giving the wire in the pieces a script says: a size, or an exception."""

    def __init__(self, data: bytes, pieces: Iterator[int | BaseException]) -> None:
        self.data = data
        self.at = 0
        self.pieces = pieces
        self.asked: list[int] = []

    def recv(self, n: int) -> bytes:
        self.asked.append(n)
        piece = next(self.pieces, n)
        if isinstance(piece, BaseException):
            raise piece
        given = self.data[self.at : self.at + min(n, piece)]
        self.at += len(given)
        return given


def read_all(read: Callable[[], Any], count: int) -> list[Any]:
    return [read() for _ in range(count)]


def py_amqp_frames(data: bytes, count: int) -> list[Any]:
    """What py-amqp's own transport reads from the same bytes, 1,000 bytes a recv."""
    transport = TCPTransport("localhost:1")
    transport._read_buffer = b""
    transport._quick_recv = Socket(data, iter(lambda: 1000, None)).recv
    return read_all(transport.read_frame, count)


@pytest.mark.parametrize(
    "pieces",
    [
        # One byte a recv through the small frames, then the large one in large pieces.
        pytest.param(lambda: iter([1] * 700 + [50_000] * 10), id="one byte a recv"),
        pytest.param(lambda: iter([3, 5, 9, 500, 2, 70_000, 11]), id="split anywhere"),
        pytest.param(lambda: iter([len(WIRE)]), id="everything in one recv"),
    ],
)
def test_frames_are_py_amqps_however_the_socket_splits_them(
    pieces: Callable[[], Iterator[int]],
) -> None:
    sock = Socket(WIRE, pieces())
    reader = FrameReader(sock.recv, raise_on_initial_eintr=True)
    got = read_all(reader.read, len(FRAMES))
    assert got == FRAMES == py_amqp_frames(WIRE, len(FRAMES))
    assert all(isinstance(payload, bytes) for _, _, payload in got)


def test_many_frames_in_one_recv_are_served_without_another() -> None:
    small = FRAMES[:4] * 50
    sock = Socket(b"".join(frame(*f) for f in small), iter([]))
    reader = FrameReader(sock.recv, raise_on_initial_eintr=True)
    assert read_all(reader.read, len(small)) == small
    assert sock.asked == [READ_CHUNK]


def test_a_frame_larger_than_a_chunk_asks_for_its_rest() -> None:
    big = FRAMES[4]
    sock = Socket(frame(*big), iter([100]))
    reader = FrameReader(sock.recv, raise_on_initial_eintr=True)
    assert reader.read() == big
    # The rest of the frame (its size is known from its header) in one ask.
    assert sock.asked == [READ_CHUNK, 7 + len(big[2]) + 1 - 100]


@pytest.mark.parametrize("cut", [0, 3, 7, 20, len(frame(*FRAMES[0])) - 1])
def test_a_read_that_times_out_keeps_what_it_received_and_goes_on(cut: int) -> None:
    """drain_events(timeout=...) raises socket.timeout from a read halfway through a frame
    (or before it): the next read gives the whole frame, and the ones after it."""
    timeout = TimeoutError("timed out")
    sock = Socket(WIRE, iter([*([cut] if cut else []), timeout, timeout, len(WIRE)]))
    reader = FrameReader(sock.recv, raise_on_initial_eintr=True)
    for _ in range(2):
        with pytest.raises(TimeoutError):
            reader.read()
    assert read_all(reader.read, len(FRAMES)) == FRAMES


def test_an_interrupted_recv_before_a_frame_is_a_timeout_and_within_one_is_tried_again() -> None:
    again = OSError(errno.EAGAIN, "again")
    sock = Socket(WIRE, iter([again, 10, again, len(WIRE)]))
    reader = FrameReader(sock.recv, raise_on_initial_eintr=True)
    with pytest.raises(TimeoutError):  # no byte of the frame yet: py-amqp's timeout
        reader.read()
    assert read_all(reader.read, len(FRAMES)) == FRAMES  # the second EAGAIN: tried again


def test_a_closed_connection_and_a_bad_frame_end_are_py_amqps_errors() -> None:
    sock = Socket(frame(*FRAMES[0])[:-3], iter([]))
    reader = FrameReader(sock.recv, raise_on_initial_eintr=True)
    with pytest.raises(OSError, match="unexpectedly closed"):
        reader.read()
    sock = Socket(frame(1, 1, b"abc", end=0x00), iter([]))
    reader = FrameReader(sock.recv, raise_on_initial_eintr=True)
    with pytest.raises(UnexpectedFrame, match="0x00"):
        reader.read()


def test_over_tls_the_frames_are_read_buffered_and_the_same(tmp_path: Path) -> None:
    """amqps:// (BufferedSSLTransport): a real TLS socket on loopback whose peer sends the
    frames in awkward pieces (each its own TLS record), then the rest at once."""
    cert, key = self_signed(tmp_path)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    heard: list[bytes] = []

    def serve() -> None:
        raw, _ = listener.accept()
        with server.wrap_socket(raw, server_side=True) as peer:
            heard.append(peer.recv(8))  # the AMQP protocol header
            for start, end in [(0, 3), (3, 9), (9, 300), (300, 301)]:
                peer.sendall(WIRE[start:end])
            peer.sendall(WIRE[301:])
            peer.recv(1)  # until the client closes

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    transport = Connection("127.0.0.1").Transport(
        f"127.0.0.1:{port}", 10, ssl={"ca_certs": str(cert), "server_hostname": "127.0.0.1"}
    )
    assert isinstance(transport, BufferedSSLTransport)
    try:
        transport.connect()
        with transport.having_timeout(10):
            got = read_all(transport.read_frame, len(FRAMES))
        assert got == FRAMES
        assert heard == [b"AMQP\x00\x00\x09\x01"]
    finally:
        transport.close()
        thread.join(10)
        listener.close()


class Written:
    """A transport's ``write`` and a connection's framing facts, for a frame writer."""

    def __init__(self, frame_max: int) -> None:
        self.frame_max = frame_max
        self.bytes_sent = 0
        self.data = bytearray()

    def write(self, data: Any) -> None:
        self.data += bytes(data)


class PublishChannel:
    channel_id = 3
    is_open = True

    def __init__(self, connection: Any) -> None:
        self.connection = connection


@pytest.mark.parametrize("corked", [True, False], ids=["corked", "uncorked"])
@pytest.mark.parametrize(
    ("body", "properties"),
    [
        pytest.param(b'[[1], {}, {"chain": null}]', {"delivery_mode": 2}, id="small"),
        pytest.param(b"", {"content_type": "application/json"}, id="empty body"),
        pytest.param(b"x" * 10_000, {"application_headers": {"id": "t-1"}}, id="several frames"),
        pytest.param(b"y" * 4_088, {}, id="one frame, exactly"),
        pytest.param("text, not bytes", {}, id="text body"),
    ],
)
def test_a_publish_is_py_amqps_bytes(body: Any, properties: dict[str, Any], corked: bool) -> None:
    """redrive frames each publish of a batch itself (its method frame once a batch): the
    bytes, frame after frame, are those py-amqp's writer gives for the same publish, a body
    over ``frame_max`` split as py-amqp splits it, and a text body left to py-amqp."""
    ours, theirs = Written(4_096), Written(4_096)
    writer = CorkedWriter(ours, ours)
    ours.frame_writer = writer  # type: ignore[attr-defined]
    publish = publisher(PublishChannel(ours), "onion-checkout")
    if corked:
        with writer.corked():
            publish(Outgoing(body, **properties))
            assert not ours.data
    else:
        publish(Outgoing(body, **properties))
    frame_writer(theirs, theirs)(
        1,
        3,
        spec.Basic.Publish,
        publish_arguments("onion-checkout"),
        Outgoing(body, **properties),
    )
    assert bytes(ours.data) == bytes(theirs.data)
    assert ours.bytes_sent == theirs.bytes_sent == 1


def publish_arguments(routing_key: str) -> bytes:
    data: bytes = dumps("Bssbb", (0, "", routing_key, True, False))
    return data
