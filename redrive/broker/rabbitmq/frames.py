"""py-amqp's frame writer, corked: the frames of a batch of publishes go out in one write.

py-amqp writes each ``basic_publish`` (method, header and body frames) with one
``sendall``: a batch of 100 publishes is 100 system calls and as many TCP segments for the
broker to read. Under :meth:`CorkedWriter.corked` the writes gather in a buffer and go as one
when the block ends (a frame over ``frame_max`` is written as py-amqp writes it, into the
same buffer). The bytes on the wire are exactly py-amqp's. The one place redrive reaches
into py-amqp's framing (``Connection(frame_writer=...)`` is its documented hook).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from amqp.method_framing import frame_writer


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
        self._cork = _Cork(transport)
        self._write: Callable[..., Any] = frame_writer(connection, self._cork)

    def __call__(self, *args: Any) -> Any:
        return self._write(*args)

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
