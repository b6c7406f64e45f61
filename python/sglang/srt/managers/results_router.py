"""Where each request's results go with several tokenizer workers or detokenizer processes.

    scheduler rank 0 --(rid's detokenizer)--> detokenizer d --(BatchTokenOut.http_worker_ipc)--> worker w
    scheduler rank 0 --(--detokenizer-mode inline)--> worker w

A tokenizer worker stamps its results endpoint on every request it sends (http_worker_ipc); the
scheduler remembers it per rid until the request's last output and splits each batch of outputs
by destination. A request's outputs always take the same path, so they arrive in order. Every
replica's rank 0 sends straight to the detokenizers (or the workers), never through the
data-parallel controller.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from typing import Any, Optional

import zmq

from sglang.srt.managers.io_struct import BatchTokenOut, SchedulerLoad, TokenOut, encode
from sglang.srt.managers.results_channel import FramedSender
from sglang.srt.server_args import PortArgs, ServerArgs


def worker_endpoints(server_args: ServerArgs, port_args: PortArgs) -> list[str]:
    """Each tokenizer worker's results endpoint: a framed Unix socket path (--detokenizer-mode
    inline) or a ZMQ ipc address; with one worker the server's own endpoint."""
    base = port_args.tokenizer_manager_ipc if server_args.detokenizer_process() else port_args.results_socket
    count = server_args.tokenizer_worker_num
    return [base] if count == 1 else [f"{base}_w{i}" for i in range(count)]


def detokenizer_endpoints(server_args: ServerArgs, port_args: PortArgs) -> list[str]:
    """Each detokenizer process's input address (none with --detokenizer-mode inline)."""
    if not server_args.detokenizer_process():
        return []
    count = server_args.detokenizer_worker_num
    return [port_args.detokenizer_ipc] if count == 1 else [f"{port_args.detokenizer_ipc}_d{i}" for i in range(count)]


def detokenizer_of(rid: str, count: int) -> int:
    """The detokenizer a request's outputs pass through: stable per rid, spread evenly."""
    return 0 if count == 1 else zlib.crc32(rid.encode()) % count


class ResultsRouter:
    """Rank 0's sender of results: each output to its request's tokenizer worker (through the
    request's detokenizer in process mode)."""

    def __init__(self, workers: list[str], sinks: list[Any], inline: bool) -> None:
        """workers: the workers' results endpoints; sinks: what sends to each worker (inline) or to
        each detokenizer (anything with send(bytes))."""
        self._workers = workers
        self._worker_index = {endpoint: i for i, endpoint in enumerate(workers)}
        self._owner: dict[str, int] = {}  # rid -> its worker (only with several workers)
        self._sinks = sinks
        self._inline = inline

    @classmethod
    def create(cls, server_args: ServerArgs, port_args: PortArgs, context: zmq.Context) -> "ResultsRouter":
        workers = worker_endpoints(server_args, port_args)
        detokenizers = detokenizer_endpoints(server_args, port_args)
        if not detokenizers:
            return cls(workers, [FramedSender(path) for path in workers], inline=True)
        return cls(workers, [_push(context, address) for address in detokenizers], inline=False)

    def register(self, rid: str, http_worker_ipc: Optional[str]) -> None:
        """Remember the worker that sent request `rid` (an unknown endpoint: the first worker)."""
        if len(self._workers) > 1:
            self._owner[rid] = self._worker_index.get(http_worker_ipc, 0)

    def send_outs(self, outs: list[TokenOut]) -> None:
        groups: dict[tuple[int, int], list[TokenOut]] = defaultdict(list)
        for out in outs:
            worker = self._owner.get(out.rid, 0)
            if out.finished_reason is not None:
                self._owner.pop(out.rid, None)
            groups[(self._sink_of(out.rid, worker), worker)].append(out)
        for (sink, worker), group in groups.items():
            self._send(sink, worker, BatchTokenOut(outs=group))

    def send_load(self, load: SchedulerLoad, http_worker_ipc: Optional[str]) -> None:
        worker = self._worker_index.get(http_worker_ipc, 0)
        self._send(worker if self._inline else 0, worker, BatchTokenOut(outs=[], load=load))

    def _sink_of(self, rid: str, worker: int) -> int:
        return worker if self._inline else detokenizer_of(rid, len(self._sinks))

    def _send(self, sink: int, worker: int, batch: BatchTokenOut) -> None:
        if not self._inline and len(self._workers) > 1:
            batch.http_worker_ipc = self._workers[worker]
        self._sinks[sink].send(encode(batch))


def _push(context: zmq.Context, address: str) -> zmq.Socket:
    sock = context.socket(zmq.PUSH)
    sock.connect(address)
    return sock
