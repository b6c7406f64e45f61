"""The framed Unix socket that carries scheduler rank 0's results to the tokenizer manager under
--detokenizer-mode inline: whole messages, in order per sender, whatever the reads split; one
connection per sender; a stray connection with foreign bytes is closed alone; the reader moves
between event loops; a reader that stalls never blocks the sender, which queues up to its limit
and then drops that reader."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import tempfile
import threading
import time

import pytest

from sglang.srt.managers.results_channel import MAX_MESSAGE_BYTES, FramedResults, FramedSender


@pytest.fixture
def path() -> str:
    with tempfile.TemporaryDirectory() as folder:
        yield os.path.join(folder, "results")


def _read_until(results: FramedResults, received: list[bytes], count: int) -> None:
    """Serve `results` on a fresh event loop until `count` messages arrived (30 s at most)."""

    async def run() -> None:
        results.attach(asyncio.get_running_loop())
        deadline = asyncio.get_running_loop().time() + 30
        while len(received) < count:
            assert asyncio.get_running_loop().time() < deadline, f"{len(received)} of {count} messages"
            await asyncio.sleep(0.001)

    asyncio.run(run())


def _raw_connection(path: str) -> socket.socket:
    """A connection that writes whatever bytes the test gives it."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    return conn


def _framed(message: bytes) -> bytes:
    return struct.pack("<Q", len(message)) + message


def test_messages_arrive_whole_and_in_order(path: str) -> None:
    received: list[bytes] = []
    results = FramedResults(path, received.append)
    sender = FramedSender(path)
    small = [b"", b"a"]
    for message in small:
        sender.send(message)  # before any loop reads: the socket's buffer holds them
    large = [os.urandom(3 << 20), b"after the large one"]  # 3 MiB: many reads, most of it queued by the sender
    writer = threading.Thread(target=lambda: [sender.send(m) for m in large], daemon=True)
    writer.start()
    try:
        _read_until(results, received, 4)
    finally:
        results.close()  # a failed read must not leave the writer blocked
        writer.join(30)
        sender.close()
    assert received == small + large
    assert not os.path.exists(path)


def test_a_message_split_across_writes_is_delivered_once_complete(path: str) -> None:
    received: list[bytes] = []
    results = FramedResults(path, received.append)
    raw = _raw_connection(path)
    stream = _framed(b"first") + _framed(b"second")

    async def run() -> None:
        results.attach(asyncio.get_running_loop())
        for i in range(len(stream)):
            raw.send(stream[i : i + 1])
            await asyncio.sleep(0)  # the reader may see any prefix
            expected = [b"first"] if i + 1 >= len(_framed(b"first")) else []
            if i + 1 == len(stream):
                expected.append(b"second")
            deadline = asyncio.get_running_loop().time() + 30
            while received != expected and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.001)
            assert received == expected, i

    asyncio.run(run())
    raw.close()
    results.close()


def test_senders_each_keep_their_order(path: str) -> None:
    received: list[bytes] = []
    results = FramedResults(path, received.append)
    senders = [FramedSender(path) for _ in range(3)]
    for i in range(50):
        for k, sender in enumerate(senders):
            sender.send(f"{k}:{i}".encode())
    _read_until(results, received, 150)
    for k in range(3):
        assert [m for m in received if m.startswith(f"{k}:".encode())] == [f"{k}:{i}".encode() for i in range(50)]
    results.close()


def test_a_stray_connection_is_closed_alone(path: str) -> None:
    received: list[bytes] = []
    results = FramedResults(path, received.append)
    stray = _raw_connection(path)
    stray.sendall(struct.pack("<Q", MAX_MESSAGE_BYTES + 1) + b"not ours")
    sender = FramedSender(path)
    sender.send(b"ours")
    _read_until(results, received, 1)
    assert received == [b"ours"]
    stray.settimeout(30)
    assert stray.recv(1) == b"", "the stray connection is still open"
    sender.send(b"still served")
    _read_until(results, received, 2)
    assert received == [b"ours", b"still served"]
    results.close()


def test_a_message_whose_handling_raises_is_not_handled_again(path: str) -> None:
    received: list[bytes] = []

    def handle(message: bytes) -> None:
        received.append(message)
        if message == b"fails":  # the event loop logs it; the tokenizer manager catches its own
            raise RuntimeError("handling failed")

    results = FramedResults(path, handle)
    raw = _raw_connection(path)
    raw.sendall(_framed(b"fails") + _framed(b"next"))  # one read holds both
    _read_until(results, received, 1)
    raw.sendall(_framed(b"after"))
    _read_until(results, received, 2)
    # "next" was taken off the buffer with "fails" and is lost with it; nothing is handled twice.
    assert received == [b"fails", b"after"]
    raw.close()
    results.close()


def test_a_sender_that_closes_mid_message_is_dropped_alone(path: str) -> None:
    received: list[bytes] = []
    results = FramedResults(path, received.append)
    broken = _raw_connection(path)
    broken.sendall(_framed(b"whole") + _framed(b"cut short")[:-3])
    broken.close()
    sender = FramedSender(path)
    sender.send(b"other sender")
    _read_until(results, received, 2)
    assert sorted(received) == [b"other sender", b"whole"]
    sender.close()
    results.close()


def test_the_reader_moves_to_another_loop(path: str) -> None:
    received: list[bytes] = []
    results = FramedResults(path, received.append)
    sender = FramedSender(path)
    sender.send(b"one")
    _read_until(results, received, 1)  # the first loop accepted the connection, then closed
    sender.send(b"two")
    _read_until(results, received, 2)
    assert received == [b"one", b"two"]
    results.close()



def _send_all_within(sender: FramedSender, messages: list[bytes], seconds: float) -> None:
    """Sends every message on a thread and fails if that takes longer than `seconds` (a blocked send)."""
    writer = threading.Thread(target=lambda: [sender.send(m) for m in messages], daemon=True)
    start = time.monotonic()
    writer.start()
    writer.join(seconds)
    assert not writer.is_alive(), f"the sends blocked for more than {seconds} s"
    assert time.monotonic() - start < seconds


def test_a_reader_that_never_reads_is_dropped_past_the_limit(path: str, caplog) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # accepts, then never reads
    listener.bind(path)
    listener.listen(1)
    sender = FramedSender(path, max_pending_bytes=4 << 20)
    messages = [os.urandom(256 << 10) for _ in range(32)]  # 8 MiB: past the socket's buffer and the limit
    with caplog.at_level(logging.ERROR, logger="sglang.srt.managers.results_channel"):
        _send_all_within(sender, messages[:8], 5)  # 2 MiB: queued, nothing dropped yet
        assert not caplog.records
        _send_all_within(sender, messages[8:], 5)
        _send_all_within(sender, [b"after the drop"], 5)  # discarded, without an error
    assert [r.getMessage() for r in caplog.records if "unread: dropping its connection" in r.getMessage()]
    conn, _ = listener.accept()
    conn.settimeout(30)
    received = 0
    while chunk := conn.recv(1 << 20):
        received += len(chunk)
    assert received < sum(len(m) for m in messages), "the dropped reader's connection is closed with results unsent"
    conn.close()
    listener.close()
    sender.close()


def test_a_reader_that_reads_late_gets_every_message_in_order(path: str) -> None:
    received: list[bytes] = []
    results = FramedResults(path, received.append)  # read by no loop until every message is sent
    sender = FramedSender(path)
    messages = [os.urandom(100 << 10) + i.to_bytes(4, "little") for i in range(100)]  # 10 MiB
    _send_all_within(sender, messages, 10)
    time.sleep(0.2)  # the flusher finds the socket still full
    _read_until(results, received, len(messages))
    assert received == messages
    sender.close()
    results.close()
