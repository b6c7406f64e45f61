"""Each data-parallel replica's load: reported by its scheduler, balanced on by the controller,
served by /get_load and /get_server_info.

Scheduler rank 0 of every replica pushes a ReplicaLoad (msgpack over ZMQ) when its load has
changed: at most every --load-watch-interval seconds while it works, and at once before it
waits idle, so an idle server's last report is exact. With several replicas the reports go to
the data-parallel controller, which forwards them to the HTTP process; with one they go there
directly. With several HTTP workers (--tokenizer-worker-num) the launching process reads them and
publishes each to every worker's table.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

import msgspec
import zmq

from sglang.srt.managers.io_struct import ReplicaLoad, decoder, encode

logger = logging.getLogger(__name__)

_POLL_MS = 200  # how often the table's reader thread looks at its stop flag
_SEND_HWM = 16


class ReplicaLoadReporter:
    """The scheduler's side: sends a report when the load changed and one is due."""

    def __init__(self, context: zmq.Context, address: str, interval_s: float) -> None:
        self._socket = context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, _SEND_HWM)
        self._socket.connect(address)
        self._interval_s = interval_s
        self._last: Optional[ReplicaLoad] = None
        self._sent_at = 0.0

    def report(self, measure: Callable[[], ReplicaLoad], now: bool) -> None:
        """Once the interval has passed (or `now`), measure the load and send it if it changed."""
        at = time.monotonic()
        if not now and at - self._sent_at < self._interval_s:
            return
        load = measure()
        if load == self._last:
            return
        try:
            self._socket.send(encode(load), zmq.NOBLOCK)
        except zmq.Again:  # nobody reads (sglang.Engine): a report is a snapshot, the next one replaces it
            return
        self._last, self._sent_at = load, at


def publisher_address(load_ipc: str) -> str:
    """Where the launching process republishes the reports to the HTTP workers."""
    return f"{load_ipc}_pub"


class ReplicaLoadTable:
    """The HTTP process's side: the latest report of each replica, kept by a reader thread.

    publish: also send every report on to the HTTP workers (a ZMQ PUB bound at this address).
    subscribe: read the reports an HTTP worker gets from that publisher at `address`.
    """

    def __init__(self, address: str, dp_size: int, publish: Optional[str] = None, subscribe: bool = False) -> None:
        self._loads: list[ReplicaLoad] = [ReplicaLoad(i, 0, 0, 0, 0) for i in range(dp_size)]
        self._context = zmq.Context()
        if subscribe:
            self._socket = self._context.socket(zmq.SUB)
            self._socket.setsockopt(zmq.SUBSCRIBE, b"")
            self._socket.connect(address)
        else:
            self._socket = self._context.socket(zmq.PULL)
            self._socket.bind(address)
        self._publisher: Optional[zmq.Socket] = None
        if publish is not None:
            self._publisher = self._context.socket(zmq.PUB)
            self._publisher.bind(publish)
        self._decoder = decoder(ReplicaLoad)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="replica-loads", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            if not self._socket.poll(_POLL_MS):
                continue
            frame = self._socket.recv()
            try:
                load = self._decoder.decode(frame)
            except msgspec.DecodeError:
                logger.exception("Dropping an undecodable load report")
                continue
            if self._publisher is not None:
                self._publisher.send(frame)
            if 0 <= load.dp_rank < len(self._loads):
                self._loads[load.dp_rank] = load

    def snapshot(self) -> list[dict]:
        """SGLang's /get_load answer: one {dp_rank, num_reqs, num_waiting_reqs, num_tokens, ...} per replica."""
        return [msgspec.structs.asdict(load) for load in self._loads]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._context.destroy(linger=0)
