"""The endpoints the server's processes talk over (ZMQ ipc paths, a results socket, the TP
rendezvous), made fresh per launch."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class PortArgs:
    """The processes' endpoints (ZMQ ipc but results_socket); each is bound by the process that reads from it."""

    scheduler_input_ipc: str
    detokenizer_ipc: str
    tokenizer_manager_ipc: str
    # A Unix socket path, not ZMQ: rank 0's results under --detokenizer-mode inline (results_channel.py).
    results_socket: str
    # torch.distributed rendezvous of the TP ranks (rank 0 hosts the store on this port).
    dist_init_method: str
    # The HTTP process reads the replicas' load reports here (replica_load.py).
    load_ipc: str

    @classmethod
    def init_new(cls) -> "PortArgs":
        import tempfile

        base = tempfile.mkdtemp(prefix="sglang-ipc-")
        return cls(
            scheduler_input_ipc=f"ipc://{base}/scheduler",
            detokenizer_ipc=f"ipc://{base}/detokenizer",
            tokenizer_manager_ipc=f"ipc://{base}/tokenizer_manager",
            results_socket=f"{base}/results",
            dist_init_method=f"tcp://127.0.0.1:{free_local_port()}",
            load_ipc=f"ipc://{base}/load",
        )


def free_local_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
