"""DataParallelController: the process between the tokenizer manager and `--dp-size` replicas.

    TokenizerManager --PUSH--> controller --PUSH--> replica i's scheduler rank 0 (one TP group each)
    every replica's rank 0 --BatchTokenOut--> the one DetokenizerManager --> TokenizerManager

Each generate request goes to one replica, chosen by --load-balance-method (SGLang's names):
round_robin, shortest_queue (fewest running + waiting requests) or minimum_tokens (fewest KV
tokens in use + waiting prompt tokens). Every other message (abort, flush, load query) goes to
every replica: an abort for a request a replica does not hold is ignored there. Frames are
forwarded as they came; the controller decodes them only to route them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
from collections import deque
from typing import Any, NoReturn

import msgspec
import zmq

from sglang.srt.managers.io_struct import ReplicaLoad, SchedulerInput, TokenizedGenerateReqInput, decoder
from sglang.srt.server_args import PortArgs, ServerArgs

logger = logging.getLogger(__name__)

_PARENT_CHECK_MS = 1000
_LOAD_FORWARD_HWM = 16  # load reports are snapshots: an old one unread is worth nothing


def replica_port_args(port_args: PortArgs, dp_rank: int, dp_size: int, dist_init_method: str) -> PortArgs:
    """Replica `dp_rank`'s endpoints: its own input socket and TP rendezvous when there are
    several replicas (their load reports then go to the controller); the server's otherwise."""
    if dp_size == 1:
        return dataclasses.replace(port_args, dist_init_method=dist_init_method)
    return dataclasses.replace(
        port_args,
        scheduler_input_ipc=f"{port_args.scheduler_input_ipc}_dp{dp_rank}",
        load_ipc=_controller_load_ipc(port_args),
        dist_init_method=dist_init_method,
    )


def _controller_load_ipc(port_args: PortArgs) -> str:
    return f"{port_args.load_ipc}_controller"


class LoadBalancer:
    """Which replica takes the next request.

    shortest_queue and minimum_tokens compare each replica's last report plus the requests sent
    to it that the report did not count yet (the report says how many it had received), so a
    burst spreads out before the next report. Ties go round the replicas.
    """

    def __init__(self, method: str, dp_size: int) -> None:
        self.method = method
        self._loads = [ReplicaLoad(i, 0, 0, 0, 0) for i in range(dp_size)]
        self._sent = [0] * dp_size
        self._in_transit: list[deque[int]] = [deque() for _ in range(dp_size)]  # prompt tokens per request
        self._next = 0

    def update(self, load: ReplicaLoad) -> None:
        i = load.dp_rank
        self._loads[i] = load
        pending = self._in_transit[i]
        while len(pending) > max(self._sent[i] - load.num_reqs_received, 0):
            pending.popleft()

    def pick(self, prompt_tokens: int) -> int:
        n = len(self._loads)
        order = [(self._next + k) % n for k in range(n)]
        if self.method == "round_robin":
            chosen = order[0]
        elif self.method == "shortest_queue":
            chosen = min(order, key=lambda i: self._loads[i].num_reqs + len(self._in_transit[i]))
        else:
            chosen = min(order, key=lambda i: self._loads[i].num_tokens + sum(self._in_transit[i]))
        self._next = (chosen + 1) % n
        self._sent[chosen] += 1
        self._in_transit[chosen].append(prompt_tokens)
        return chosen


class DataParallelController:
    def __init__(self, server_args: ServerArgs, port_args: PortArgs) -> None:
        dp_size = server_args.dp_size
        self.balancer = LoadBalancer(server_args.load_balance_method, dp_size)
        self.context = zmq.Context()
        self.recv_socket = self._socket(zmq.PULL, port_args.scheduler_input_ipc, bind=True)
        self.load_socket = self._socket(zmq.PULL, _controller_load_ipc(port_args), bind=True)
        self.load_forward = self._socket(zmq.PUSH, port_args.load_ipc, bind=False, send_hwm=_LOAD_FORWARD_HWM)
        self.replicas = [
            self._socket(zmq.PUSH, replica_port_args(port_args, i, dp_size, "").scheduler_input_ipc, bind=False)
            for i in range(dp_size)
        ]
        self.decode_input = decoder(SchedulerInput)
        self.decode_load = decoder(ReplicaLoad)
        self.parent_pid = os.getppid()

    def _socket(self, kind: int, address: str, bind: bool, send_hwm: int = 0) -> zmq.Socket:
        """send_hwm 0: never drop or block (the replicas read everything)."""
        sock = self.context.socket(kind)
        if kind == zmq.PUSH:
            sock.setsockopt(zmq.SNDHWM, send_hwm)  # before connecting: ZMQ applies it to new pipes only
        if bind:
            sock.bind(address)
        else:
            sock.connect(address)
        return sock

    def event_loop(self) -> NoReturn:
        poller = zmq.Poller()
        poller.register(self.recv_socket, zmq.POLLIN)
        poller.register(self.load_socket, zmq.POLLIN)
        while True:
            ready = dict(poller.poll(_PARENT_CHECK_MS))
            if self.load_socket in ready:
                self._drain(self.load_socket, self._on_load)
            if self.recv_socket in ready:
                self._drain(self.recv_socket, self._dispatch)
            if os.getppid() != self.parent_pid:
                raise SystemExit("data-parallel controller: the server process is gone")

    @staticmethod
    def _drain(sock: zmq.Socket, handle: Any) -> None:
        while sock.poll(0):
            frame = sock.recv()
            try:
                handle(frame)
            except msgspec.DecodeError:  # a stray or hostile frame must not stop every replica's traffic
                logger.exception("Dropping an undecodable frame (%d bytes)", len(frame))

    def _on_load(self, frame: bytes) -> None:
        self.balancer.update(self.decode_load.decode(frame))
        with contextlib.suppress(zmq.Again):  # nobody reads them under sglang.Engine: drop, never queue
            self.load_forward.send(frame, zmq.NOBLOCK)

    def _dispatch(self, frame: bytes) -> None:
        message = self.decode_input.decode(frame)
        if isinstance(message, TokenizedGenerateReqInput):
            self.replicas[self.balancer.pick(len(message.input_ids))].send(frame)
            return
        for replica in self.replicas:
            replica.send(frame)


def run_data_parallel_controller_process(server_args: ServerArgs, port_args: PortArgs) -> None:
    """Process entry: route requests to the replicas until the launcher stops it."""
    logging.basicConfig(level=server_args.log_level.upper(), format="[dp controller] %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher owns Ctrl-C; its SIGTERM ends this process at once
    controller = DataParallelController(server_args, port_args)
    logger.info("%d replicas, --load-balance-method %s", server_args.dp_size, server_args.load_balance_method)
    try:
        controller.event_loop()
    finally:
        controller.context.destroy(linger=0)
