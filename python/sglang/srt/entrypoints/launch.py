"""Process launching: the scheduler ranks, the detokenizer and the data-parallel controller.

ChildProcesses starts one scheduler process per TP rank of every --dp-size replica and, unless
--detokenizer-mode inline, the detokenizer (multiprocessing, spawn); launch_subprocesses waits
for every replica's rank 0 to report SchedulerReady while the tokenizer loads. The HTTP server
(http_server.launch_server) and the offline Engine both start their processes here. Children
also die with the launcher (PR_SET_PDEATHSIG) if it is killed outright; shutdown sends them
SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import importlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

import msgspec

from sglang.srt.distributed.placement import node_tp_ranks, replica_dist_init_method, scheduler_name
from sglang.srt.managers.data_parallel_controller import replica_port_args
from sglang.srt.managers.io_struct import SchedulerReady, decoder, replicas_ready
from sglang.srt.port_args import PortArgs, free_local_port
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.hf_transformers_utils import get_tokenizer, load_chat_template

logger = logging.getLogger(__name__)

# Tests point this at a fake scheduler ("module:function", same signature as the real one).
SCHEDULER_ENTRY_ENV = "SGLANG_TEST_SCHEDULER_ENTRY"
DEFAULT_SCHEDULER_ENTRY = "sglang.srt.managers.scheduler:run_scheduler_process"
DETOKENIZER_ENTRY = "sglang.srt.managers.detokenizer_manager:run_detokenizer_process"
HTTP_WORKER_ENTRY = "sglang.srt.entrypoints.http_workers:run_http_worker"
DP_CONTROLLER_ENTRY = "sglang.srt.managers.data_parallel_controller:run_data_parallel_controller_process"
READY_TIMEOUT_ENV = "SGLANG_SCHEDULER_READY_TIMEOUT"
DEFAULT_READY_TIMEOUT_S = 900.0
SHUTDOWN_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1


class LaunchError(RuntimeError):
    """The server could not start, or a child process died; the message says which and why."""


def _child_main(entry: str, args: tuple, parent_pid: int) -> None:
    """Spawned child: die with the launcher, then run `module:function`(*args)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the launcher died before prctl took effect
        os._exit(1)
    module, function = entry.split(":")
    getattr(importlib.import_module(module), function)(*args)


class ChildProcesses:
    """The scheduler ranks and the detokenizer process (if any), from start to SIGKILL."""

    def __init__(self, server_args: ServerArgs, port_args: PortArgs) -> None:
        self.server_args = server_args
        self.port_args = port_args
        self.failure: Optional[str] = None
        self._procs: list[tuple[str, multiprocessing.process.BaseProcess]] = []
        self._readers: dict[multiprocessing.connection.Connection, tuple[int, int]] = {}  # -> (dp rank, TP rank)
        self._pipes: dict[str, multiprocessing.connection.Connection] = {}  # child name -> its pipe
        self._stopping = threading.Event()

    def start(self) -> None:
        """This node's scheduler ranks of every replica; on node 0 also the detokenizer (unless
        --detokenizer-mode inline) and, with several replicas, the data-parallel controller."""
        ctx = multiprocessing.get_context("spawn")
        args = self.server_args
        if args.dp_size > 1 and args.node_rank == 0:
            self._spawn(ctx, "data-parallel controller", DP_CONTROLLER_ENTRY, (args, self.port_args))
        for dp_rank in range(args.dp_size):
            ports = replica_port_args(self.port_args, dp_rank, args.dp_size, self._dist_init_method(dp_rank))
            for rank in node_tp_ranks(args.tp_size, args.nnodes, args.node_rank):
                self._spawn_scheduler(ctx, ports, dp_rank, rank)
        if args.node_rank == 0 and args.detokenizer_process():
            count = args.detokenizer_worker_num
            for index in range(count):
                name = "detokenizer" if count == 1 else f"detokenizer {index}"
                self._spawn(ctx, name, DETOKENIZER_ENTRY, (args, self.port_args, index))

    def start_http_workers(self, ready: SchedulerReady) -> None:
        """The --tokenizer-worker-num HTTP + tokenizer worker processes (entrypoints.http_workers)."""
        ctx = multiprocessing.get_context("spawn")
        for worker_id in range(self.server_args.tokenizer_worker_num):
            self._spawn(ctx, f"http worker {worker_id}", HTTP_WORKER_ENTRY, (self.server_args, self.port_args, ready, worker_id))

    def stop_http_workers(self, timeout: float) -> None:
        """SIGTERM to the HTTP workers (each drains its requests), then wait up to `timeout` seconds
        for them; shutdown() stops what is left."""
        self._stopping.set()
        workers = [proc for name, proc in self._procs if name.startswith("http worker")]
        for proc in workers:
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + timeout
        for proc in workers:
            proc.join(max(0.0, deadline - time.monotonic()))

    def _dist_init_method(self, dp_rank: int) -> str:
        """Where replica dp_rank's TP group meets: --dist-init-addr's port + dp_rank, else a free local port."""
        if self.server_args.dist_init_addr is not None:
            return replica_dist_init_method(self.server_args.dist_init_addr, dp_rank)
        return self.port_args.dist_init_method if dp_rank == 0 else f"tcp://127.0.0.1:{free_local_port()}"

    def _spawn_scheduler(self, ctx: Any, ports: PortArgs, dp_rank: int, rank: int) -> None:
        name = scheduler_name(dp_rank, rank, self.server_args.dp_size)
        entry = os.environ.get(SCHEDULER_ENTRY_ENV, DEFAULT_SCHEDULER_ENTRY)
        reader, writer = ctx.Pipe(duplex=False)
        self._spawn(ctx, name, entry, (self.server_args, ports, rank, writer, dp_rank))
        writer.close()  # only the child's copy stays open, so its death reads as EOF
        self._readers[reader] = (dp_rank, rank)
        self._pipes[name] = reader

    def _spawn(self, ctx: Any, name: str, entry: str, args: tuple) -> None:
        proc = ctx.Process(target=_child_main, args=(entry, args, os.getpid()), name=name)
        proc.start()
        self._procs.append((name, proc))

    def wait_ready(self, timeout: float) -> SchedulerReady:
        """The replicas' SchedulerReady messages combined (io_struct.replicas_ready), once every
        replica's rank 0 sent its own; LaunchError on a start-up error, death or timeout."""
        deadline = time.monotonic() + timeout
        ready: dict[int, SchedulerReady] = {}
        while (remaining := deadline - time.monotonic()) > 0:
            sentinels = [proc.sentinel for _, proc in self._procs]
            signalled = multiprocessing.connection.wait([*self._readers, *sentinels], timeout=remaining)
            for conn in [c for c in signalled if c in self._readers]:
                dp_rank = self._readers[conn][0]
                message = self._read_ready(conn)
                if message is not None:
                    ready[dp_rank] = message
            if len(ready) == self.server_args.dp_size:
                return replicas_ready([ready[dp_rank] for dp_rank in range(self.server_args.dp_size)])
            if (dead := self._exited(signalled)) is not None:
                raise LaunchError(f"{dead} before the scheduler was ready")
        raise LaunchError(
            f"The scheduler was not ready after {timeout:.0f} s (set {READY_TIMEOUT_ENV} to wait longer)."
        )

    def _read_ready(self, conn: multiprocessing.connection.Connection) -> Optional[SchedulerReady]:
        _, rank = self._readers[conn]
        try:
            message = conn.recv()
        except EOFError:  # the child exited; its sentinel reports how
            del self._readers[conn]
            return None
        if isinstance(message, str):
            raise LaunchError(message)
        if rank != 0:
            raise LaunchError(f"scheduler rank {rank} sent an unexpected ready message.")
        try:
            return decoder(SchedulerReady).decode(message)
        except (msgspec.DecodeError, TypeError) as err:
            raise LaunchError(f"scheduler rank 0 sent an invalid ready message: {err}") from None

    def _exited(self, signalled: Sequence[Any]) -> Optional[str]:
        """Which child exited, given the objects multiprocessing.connection.wait returned."""
        for name, proc in self._procs:
            if proc.sentinel in signalled:
                # The sentinel fires when the child's fds close, a moment before it can be
                # reaped: join, so the exit code is there to report.
                proc.join()
                return f"{name} exited with code {proc.exitcode}{self._last_words(name)}"
        return None

    def _last_words(self, name: str) -> str:
        """': reason' when the child sent why it failed before exiting (scheduler ranks do)."""
        conn = self._pipes.get(name)
        if conn is None or not conn.poll():
            return ""
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return ""
        return f": {message}" if isinstance(message, str) else ""

    def watch(self, on_failure: Callable[[str], None]) -> None:
        """Call on_failure(reason) from a thread when a child dies before shutdown."""
        threading.Thread(target=self._watch, args=(on_failure,), name="child-watchdog", daemon=True).start()

    def _watch(self, on_failure: Callable[[str], None]) -> None:
        signalled = multiprocessing.connection.wait([proc.sentinel for _, proc in self._procs])
        if self._stopping.is_set():
            return
        self.failure = self._exited(signalled)
        logger.error("%s; shutting the server down.", self.failure)
        on_failure(self.failure)

    def wait_first_exit(self) -> None:
        """Block until a child exits (nodes other than 0); a non-zero exit is the failure."""
        signalled = multiprocessing.connection.wait([proc.sentinel for _, proc in self._procs])
        reason = self._exited(signalled)  # joins the first of them
        if next(proc for _, proc in self._procs if proc.sentinel in signalled).exitcode != 0:
            self.failure = reason
        logger.info("%s; stopping this node.", reason)

    def shutdown(self) -> None:
        self._stopping.set()
        for _, proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        for _, proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for name, proc in self._procs:
            if proc.is_alive():
                logger.warning("%s did not exit on SIGTERM within %.0f s; killing it.", name, SHUTDOWN_GRACE_S)
                proc.kill()
                proc.join()
        shutil.rmtree(self.ipc_dir(), ignore_errors=True)

    def ipc_dir(self) -> str:
        """The server's temporary folder: PortArgs.init_new puts every ipc endpoint there."""
        return os.path.dirname(self.port_args.scheduler_input_ipc.removeprefix("ipc://"))


def _load_in_background(path: str, trust_remote_code: bool) -> concurrent.futures.Future:
    """Load the tokenizer while the scheduler loads the model (GGUF parsing takes seconds)."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def work() -> None:
        try:
            future.set_result(get_tokenizer(path, trust_remote_code))
        except BaseException as err:  # noqa: BLE001 - re-raised by future.result()
            future.set_exception(err)

    threading.Thread(target=work, name="tokenizer-load", daemon=True).start()
    return future


def launch_subprocesses(children: ChildProcesses) -> tuple[SchedulerReady, Any]:
    """Start the children and wait until they are ready; the tokenizer (with its chat template)
    loads meanwhile, None with --skip-tokenizer-init. The caller shuts `children` down, also
    when this raises (LaunchError on a start-up failure)."""
    args = children.server_args
    children.start()
    tokenizer = None if args.skip_tokenizer_init else _load_in_background(args.tokenizer_path, args.trust_remote_code)
    ready = children.wait_ready(float(os.environ.get(READY_TIMEOUT_ENV, DEFAULT_READY_TIMEOUT_S)))
    logger.info("Scheduler ready: %s", ready)
    if tokenizer is None:
        return ready, None
    return ready, load_chat_template(tokenizer.result(), args.chat_template)


def ignore_signals() -> None:
    """SIGINT/SIGTERM ignored from here on: a second Ctrl-C must not cut the cleanup short."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def run_scheduler_node(children: ChildProcesses) -> None:
    """--node-rank > 0: this node's scheduler ranks only, until one exits. They all do when node 0
    stops (their TP group closes under them, which they treat as a clean stop); raises LaunchError
    when a rank failed."""
    args = children.server_args
    try:
        children.start()
        logger.info("Node %d of %d: scheduler ranks %s of %d replica(s) started; node 0 at %s serves HTTP.",
                    args.node_rank, args.nnodes, list(node_tp_ranks(args.tp_size, args.nnodes, args.node_rank)),
                    args.dp_size, args.dist_init_addr)
        children.wait_first_exit()
    finally:
        ignore_signals()
        children.shutdown()
    if children.failure is not None:
        raise LaunchError(children.failure)
