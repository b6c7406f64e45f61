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
import socket
import struct
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
    manager binds its socket before it sends the scheduler anything to answer. A send blocks
    while the socket's buffer (~200 KB by default) holds unread results, so rank 0 waits for a
    tokenizer manager that has fallen that far behind; a ZMQ PUSH would queue up to 1000
    messages first."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._sock: Optional[socket.socket] = None

    def send(self, data: bytes) -> None:
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.connect(self._path)
        self._sock.sendall(_HEADER.pack(len(data)) + data)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


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
    server_args: ServerArgs, port_args: PortArgs, context: zmq.Context, on_message: Callable[[bytes], None]
) -> ResultsSource:
    """The tokenizer manager's end of results_sender."""
    if not server_args.detokenizer_process():
        return FramedResults(port_args.results_socket, on_message)
    return ZmqResults(context, port_args.tokenizer_manager_ipc, on_message)
