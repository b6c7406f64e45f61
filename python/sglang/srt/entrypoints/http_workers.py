"""One HTTP + tokenizer worker of --tokenizer-worker-num N > 1 (a process the launcher spawns).

Every worker binds --host:--port with SO_REUSEPORT, so the kernel spreads the connections over
the workers, and serves the whole app (native and OpenAI routes) with a TokenizerManager of its
own: worker_id picks its results endpoint, which it stamps on everything it sends, so that the
scheduler (or the detokenizer) returns each request's results to the worker that accepted it.
The replicas' load reports reach it from the launcher's publisher. SIGTERM from the launcher
drains the worker's requests (DrainingServer); SIGINT is left to the launcher, which turns a
Ctrl-C into one SIGTERM for every worker.
"""

from __future__ import annotations

import logging
import signal
import socket
from typing import Any

from sglang.srt.entrypoints.http_server import create_app
from sglang.srt.entrypoints.serve import DrainingServer, build_server
from sglang.srt.managers.io_struct import SchedulerReady
from sglang.srt.managers.replica_load import ReplicaLoadTable, publisher_address
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import PortArgs, ServerArgs
from sglang.srt.utils.hf_transformers_utils import get_tokenizer, load_chat_template

logger = logging.getLogger(__name__)


class WorkerServer(DrainingServer):
    """DrainingServer that leaves SIGINT to the launcher (a terminal's Ctrl-C reaches every process
    of the group; the launcher answers it with the one SIGTERM that drains)."""

    def handle_exit(self, sig: int, frame: Any) -> None:
        if sig != signal.SIGINT:
            super().handle_exit(sig, frame)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    # uvicorn re-raises the signal that stopped it: exit 0 through the finally below.
    raise SystemExit(0)


def shared_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port that the other workers bind as well (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def run_http_worker(server_args: ServerArgs, port_args: PortArgs, ready: SchedulerReady, worker_id: int) -> None:
    """Process entry: serve HTTP on the shared port until the launcher's SIGTERM."""
    logging.basicConfig(
        level=server_args.log_level.upper(), format=f"[http worker {worker_id}] %(asctime)s %(levelname)s %(message)s"
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    tokenizer = None
    if not server_args.skip_tokenizer_init:
        tokenizer = load_chat_template(
            get_tokenizer(server_args.tokenizer_path, server_args.trust_remote_code), server_args.chat_template
        )
    loads = ReplicaLoadTable(publisher_address(port_args.load_ipc), server_args.dp_size, subscribe=True)
    tm = TokenizerManager(server_args, port_args, ready, tokenizer, worker_id)
    listener = shared_listener(server_args.host, server_args.port)
    try:
        server = build_server(create_app(tm, server_args, ready, loads), tm, server_args, WorkerServer)
        server.run(sockets=[listener])
    finally:
        listener.close()
        loads.close()
        tm.close()
