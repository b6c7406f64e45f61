"""Serving the HTTP app: launch_server (`python -m sglang.launch_server`) and the graceful drain.

launch_server starts the scheduler ranks and the detokenizer (entrypoints.launch), builds the
TokenizerManager and the app (entrypoints.http_server), and runs uvicorn in this process. A
watchdog thread stops the server when a child dies; the first SIGINT/SIGTERM drains running
requests (DrainingServer), and shutdown stops the children.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Any, Optional

import uvicorn
from fastapi import FastAPI

from sglang.srt.entrypoints.http_server import create_app
from sglang.srt.entrypoints.launch import (
    DEFAULT_READY_TIMEOUT_S,
    READY_TIMEOUT_ENV,
    SHUTDOWN_GRACE_S,
    ChildProcesses,
    LaunchError,
    ignore_signals,
    launch_subprocesses,
    run_scheduler_node,
)
from sglang.srt.managers.replica_load import ReplicaLoadTable, publisher_address
from sglang.srt.managers.tokenizer_manager import ABORTED_BY_SHUTDOWN, TokenizerManager
from sglang.srt.server_args import PortArgs, ServerArgs

logger = logging.getLogger(__name__)

DRAIN_POLL_S = 0.05


def _exit_on_signal(signum: int, frame: Any) -> None:
    # SystemExit unwinds through launch_server's finally, which stops the children.
    raise SystemExit(0)


def launch_server(server_args: ServerArgs) -> None:
    """Start the children, wait for the scheduler, serve HTTP until a signal or a child's death.

    Raises LaunchError when start-up fails or a child process dies.
    """
    logging.basicConfig(level=server_args.log_level.upper(), format="[server] %(asctime)s %(levelname)s %(message)s")
    if server_args.ignored_flags:
        logger.warning("These SGLang flags have no effect in this server and are ignored: %s", " ".join(server_args.ignored_flags))
    for message in server_args.startup_warnings:
        logger.warning(message)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_on_signal)
    port_args = PortArgs.init_new()
    children = ChildProcesses(server_args, port_args)
    if server_args.node_rank > 0:
        run_scheduler_node(children)
        return
    if server_args.tokenizer_worker_num > 1:
        run_with_http_workers(children)
        return
    loads = ReplicaLoadTable(port_args.load_ipc, server_args.dp_size)
    tm: Optional[TokenizerManager] = None
    try:
        ready, tokenizer = launch_subprocesses(children)
        tm = TokenizerManager(server_args, port_args, ready, tokenizer)
        _serve(create_app(tm, server_args, ready, loads), tm, server_args, children)
    finally:
        ignore_signals()
        children.shutdown()
        loads.close()
        if tm is not None:
            tm.close()
    if children.failure is not None:
        raise LaunchError(children.failure)


def run_with_http_workers(children: ChildProcesses) -> None:
    """--tokenizer-worker-num N > 1: the scheduler ranks and detokenizers, then N HTTP workers
    (entrypoints.http_workers) that serve the port; this process forwards the load reports and
    watches them all. A signal drains the workers first (each for up to
    --graceful-shutdown-timeout), then stops the rest; a child's death stops everything."""
    args, port_args = children.server_args, children.port_args
    loads = ReplicaLoadTable(port_args.load_ipc, args.dp_size, publish=publisher_address(port_args.load_ipc))
    try:
        children.start()
        ready = children.wait_ready(float(os.environ.get(READY_TIMEOUT_ENV, DEFAULT_READY_TIMEOUT_S)))
        if args.enable_metrics:  # before the workers import prometheus_client (metrics/collector.py)
            from sglang.srt.metrics.collector import MULTIPROC_DIR_ENV

            os.environ[MULTIPROC_DIR_ENV] = os.path.join(children.ipc_dir(), "metrics")
            os.mkdir(os.environ[MULTIPROC_DIR_ENV])
        children.start_http_workers(ready)
        logger.info("Serving on http://%s:%d with %d HTTP workers", args.host, args.port, args.tokenizer_worker_num)
        children.wait_first_exit()
        children.failure = children.failure or "a child process exited"
    finally:
        ignore_signals()
        children.stop_http_workers(args.graceful_shutdown_timeout + SHUTDOWN_GRACE_S)
        children.shutdown()
        loads.close()
    raise LaunchError(children.failure)


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a graceful shutdown: the first SIGTERM/SIGINT stops admission (503),
    lets running requests finish for up to --graceful-shutdown-timeout seconds, aborts the rest
    (their clients get the abort), then stops serving; launch_server then exits 0. A second
    signal stops at once."""

    def __init__(self, config: uvicorn.Config, tm: TokenizerManager, timeout: float) -> None:
        super().__init__(config)
        self.tm = tm
        self.timeout = timeout
        self._drain: Optional[asyncio.Task] = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self._drain is not None or not self.started:
            super().handle_exit(sig, frame)
            return
        self._captured_signals.append(sig)  # re-raised when serving ends: launch_server's exit
        self.tm.accepting = False
        logger.info("Signal %d: refusing new requests; %d running may finish within %.0f s.", sig, self.tm.num_requests(), self.timeout)
        self._drain = asyncio.get_event_loop().create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        deadline = time.monotonic() + self.timeout
        while self.tm.num_requests() and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        if self.tm.num_requests():
            logger.warning("Aborting %d requests still running after %.0f s.", self.tm.num_requests(), self.timeout)
            self.tm.abort_all(ABORTED_BY_SHUTDOWN)
        self.should_exit = True


def build_server(app: FastAPI, tm: TokenizerManager, server_args: ServerArgs, server_class: type = DrainingServer) -> DrainingServer:
    config = uvicorn.Config(
        app,
        host=server_args.host,
        port=server_args.port,
        log_level=server_args.log_level,
        timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S),
    )
    return server_class(config, tm, server_args.graceful_shutdown_timeout)


def _serve(app: FastAPI, tm: TokenizerManager, server_args: ServerArgs, children: ChildProcesses) -> None:
    server = build_server(app, tm, server_args)

    def stop(reason: str) -> None:
        tm.fail_all(reason)  # their results would never come
        server.should_exit = True

    children.watch(stop)
    logger.info("Serving on http://%s:%d", server_args.host, server_args.port)
    server.run()
