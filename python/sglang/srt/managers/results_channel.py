"""How results reach the tokenizer manager, read from its event loop's reader callbacks.

--detokenizer-mode process: the detokenizer's BatchStrOut on a ZMQ PULL socket (SGLang's layout).
--detokenizer-mode inline: scheduler rank 0's BatchTokenOut as length-prefixed messages on a Unix
stream socket. A ZMQ message wakes the sender's and the receiver's I/O threads before the
receiving thread; on a CPU server every streamed token's wake-ups compete with the forward's
OpenMP team for the same cores. On this socket the scheduler's write wakes the tokenizer
manager's event loop itself (docs/benchmarks.md has the measurements).

Every source calls `on_message(bytes)` once per message, in order per sender; the callback
handles its own errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from typing import Optional, Protocol

import zmq

from sglang.srt.server_args import PortArgs, ServerArgs

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("<Q")  # the message's length in bytes
# A length beyond this is not one of our messages (a stray client on the socket): its
# connection is closed rather than buffered for.
MAX_MESSAGE_BYTES = 1 << 32
_RECV_BYTES = 1 << 18  # per read callback: a B=256 step's results with top logprobs in a few reads
# Results a sender queues for a reader that has fallen behind before it drops that reader.
MAX_PENDING_BYTES = 64 << 20
_FLUSH_POLL_MS = 100  # the flusher's longest wait for room before it looks at the connection again


class ResultsSource(Protocol):
    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read on `loop` from now on (and no longer on the loop attached before)."""

    def close(self) -> None: ...


class ZmqResults:
    """A bound ZMQ PULL socket, drained from the loop's reader callback."""

    def __init__(self, context: zmq.Context, endpoint: str, on_message: Callable[[bytes], None]) -> None:
        self._sock = context.socket(zmq.PULL)
        self._sock.bind(endpoint)
        self._on_message = on_message
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._detach()
        self._loop = loop
        loop.add_reader(self._sock.FD, self._drain)
        self._drain()  # the FD is edge-triggered: what queued before the reader is read now

    def _drain(self) -> None:
        # zmq's FD signals an edge, so the socket is read until empty each time it fires.
        while True:
            try:
                data = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._on_message(data)

    def _detach(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._sock.FD)

    def close(self) -> None:
        self._detach()
        self._sock.close(linger=0)


class FramedResults:
    """A listening Unix stream socket; each connection (one per sending scheduler) carries
    messages as an 8-byte little-endian length and the bytes. Bound at construction, so a sender
    may connect (and write into the socket's buffer) before a loop reads."""

    def __init__(self, path: str, on_message: Callable[[bytes], None]) -> None:
        self._path = path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._on_message = on_message
        self._buffers: dict[socket.socket, bytearray] = {}  # per connection: bytes not yet a whole message
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._detach()
        self._loop = loop
        loop.add_reader(self._listener.fileno(), self._accept)
        for conn in self._buffers:
            loop.add_reader(conn.fileno(), self._read, conn)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as err:  # e.g. out of file descriptors: the connection waits in the backlog
                logger.error("Cannot accept a results connection: %s", err)
                return
            conn.setblocking(False)
            self._buffers[conn] = bytearray()
            self._loop.add_reader(conn.fileno(), self._read, conn)

    def _read(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(_RECV_BYTES)
        except BlockingIOError:
            return
        except OSError as err:
            logger.warning("A results connection failed: %s", err)
            data = b""
        buffer = self._buffers[conn]
        if not data:
            if buffer:
                logger.warning("A results connection closed %d bytes into a message", len(buffer))
            self._drop(conn)
            return
        buffer += data
        for message in self._whole_messages(conn, buffer):
            self._on_message(message)

    def _whole_messages(self, conn: socket.socket, buffer: bytearray) -> list[bytes]:
        """The complete messages at the front of `buffer`, removed from it (before any is handled,
        so none is handled twice); [] and the connection dropped on a length not ours."""
        messages, start = [], 0
        while len(buffer) - start >= _HEADER.size:
            (length,) = _HEADER.unpack_from(buffer, start)
            if length > MAX_MESSAGE_BYTES:
                logger.error("Closing a results connection that sent a %d-byte length: not our framing", length)
                self._drop(conn)
                return []
            end = start + _HEADER.size + length
            if len(buffer) < end:
                break
            messages.append(bytes(buffer[start + _HEADER.size : end]))
            start = end
        del buffer[:start]
        return messages

    def _drop(self, conn: socket.socket) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(conn.fileno())
        self._buffers.pop(conn, None)
        conn.close()

    def _detach(self) -> None:
        if self._loop is None or self._loop.is_closed():
            return
        self._loop.remove_reader(self._listener.fileno())
        for conn in self._buffers:
            self._loop.remove_reader(conn.fileno())

    def close(self) -> None:
        self._detach()
        for conn in list(self._buffers):
            conn.close()
        self._buffers.clear()
        self._listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self._path)


class FramedSender:
    """The scheduler's end of FramedResults. It connects at the first send: the tokenizer
    manager binds its socket before it sends the scheduler anything to answer.

    A send never blocks the scheduler: the socket is non-blocking, and what its buffer cannot
    take is queued (up to `max_pending_bytes`) for a flusher thread that writes it, in order, as
    the reader catches up. A reader that falls further behind is dropped with a logged error: its
    connection is closed and later results are discarded, so the scheduler goes on serving. A
    write that fails in the flusher raises its error from every later send, as a failed write in
    the send itself does."""

    def __init__(self, path: str, max_pending_bytes: int = MAX_PENDING_BYTES) -> None:
        self._path = path
        self._max_pending_bytes = max_pending_bytes
        self._sock: Optional[socket.socket] = None
        self._pending: deque[memoryview] = deque()  # frames (or their unsent tails), oldest first
        self._pending_bytes = 0
        self._cond = threading.Condition()  # guards the socket's writes and every field here
        self._flushing: Optional[socket.socket] = None  # the connection a flusher thread serves
        self._error: Optional[OSError] = None
        self._dropped = False

    def send(self, data: bytes) -> None:
        with self._cond:
            if self._error is not None:
                raise self._error
            if self._dropped:
                return
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._sock.connect(self._path)
                self._sock.setblocking(False)
            frame = memoryview(_HEADER.pack(len(data)) + data)
            if not self._pending:
                frame = frame[self._write(frame) :]
                if not frame:
                    return
            if self._pending_bytes + len(frame) > self._max_pending_bytes:
                logger.error(
                    "The tokenizer manager has left %d bytes of results unread: dropping its connection; "
                    "later results are discarded", self._pending_bytes + len(frame),
                )
                self._dropped = True
                self._disconnect()
                return
            self._pending.append(frame)
            self._pending_bytes += len(frame)
            if self._flushing is not self._sock:
                self._flushing = self._sock
                threading.Thread(target=self._flush_loop, args=(self._sock,), name="results-flusher", daemon=True).start()
            self._cond.notify()

    def _write(self, frame: memoryview) -> int:
        """Bytes of `frame` the socket took now (0 when its buffer is full)."""
        try:
            return self._sock.send(frame)
        except BlockingIOError:
            return 0

    def _flush_loop(self, sock: socket.socket) -> None:
        """Writes the queued frames to `sock` as it drains, waiting for room outside the lock;
        ends when `sock` is no longer the connection (closed, dropped or failed)."""
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLOUT)
        while True:
            with self._cond:
                while not self._pending and self._sock is sock:
                    self._cond.wait()
                if self._sock is not sock:
                    return
            poller.poll(_FLUSH_POLL_MS)  # room for more, or a periodic look at the connection
            with self._cond:
                if self._sock is not sock:
                    return
                self._flush_some()

    def _flush_some(self) -> None:
        """As much of the queue as the socket takes now (the lock held)."""
        try:
            while self._pending:
                frame = self._pending[0]
                sent = self._write(frame)
                self._pending_bytes -= sent
                if sent < len(frame):
                    self._pending[0] = frame[sent:]
                    return
                self._pending.popleft()
        except OSError as err:
            logger.error("The results connection failed with %d bytes unsent: %s", self._pending_bytes, err)
            self._error = err
            self._disconnect()

    def _disconnect(self) -> None:
        """Closes the connection and forgets what was queued for it (the lock held)."""
        self._pending.clear()
        self._pending_bytes = 0
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._disconnect()


class ResultsSender(Protocol):
    def send(self, data: bytes) -> None: ...


def results_sender(server_args: ServerArgs, port_args: PortArgs, context: zmq.Context) -> ResultsSender:
    """Rank 0's end: a ZMQ PUSH to the detokenizer process, or with --detokenizer-mode inline
    the tokenizer manager's framed socket."""
    if not server_args.detokenizer_process():
        return FramedSender(port_args.results_socket)
    sock = context.socket(zmq.PUSH)
    sock.connect(port_args.detokenizer_ipc)
    return sock


def results_source(
    server_args: ServerArgs, endpoint: str, context: zmq.Context, on_message: Callable[[bytes], None]
) -> ResultsSource:
    """A tokenizer manager's end of the results: its framed socket path (--detokenizer-mode
    inline) or its ZMQ address (results_router.worker_endpoints)."""
    if not server_args.detokenizer_process():
        return FramedResults(endpoint, on_message)
    return ZmqResults(context, endpoint, on_message)
