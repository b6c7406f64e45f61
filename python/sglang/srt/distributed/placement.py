"""Where each scheduler rank runs: its node, its GPU or CPU cores, and its TP group's rendezvous.

A server of `--dp-size D --tp-size T` has D replicas, each a TP group of T ranks. With
`--nnodes N` every TP group spans the N nodes: node k runs ranks [k*T/N, (k+1)*T/N) of every
replica. GPUs follow SGLang's rule: replica i's ranks on a node take the GPUs from
`base_gpu_id + i * (T/N) * gpu_id_step`, `gpu_id_step` apart (a step of 0 puts every rank on
one GPU). On the CPU the replicas split the cores the server may use.
"""

from __future__ import annotations

import os
from typing import Optional


def tp_size_per_node(tp_size: int, nnodes: int) -> int:
    return tp_size // nnodes


def node_tp_ranks(tp_size: int, nnodes: int, node_rank: int) -> range:
    """The TP ranks (of every replica) that run on node `node_rank`."""
    per_node = tp_size_per_node(tp_size, nnodes)
    return range(node_rank * per_node, (node_rank + 1) * per_node)


def gpu_id(dp_rank: int, tp_rank: int, tp_size: int, nnodes: int, base_gpu_id: int, gpu_id_step: int) -> int:
    """The local GPU index of TP rank `tp_rank` of replica `dp_rank`."""
    per_node = tp_size_per_node(tp_size, nnodes)
    return base_gpu_id + (dp_rank * per_node + tp_rank % per_node) * gpu_id_step


def replica_cores(dp_rank: int, dp_size: int, cores: Optional[list[int]] = None) -> list[int]:
    """The CPU cores of replica `dp_rank`: a contiguous 1/dp_size share of the cores this process
    may run on (one core each, shared round the replicas, when there are fewer cores than replicas)."""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else cores
    if len(cores) < dp_size:
        return [cores[dp_rank % len(cores)]]
    share = len(cores) // dp_size
    return cores[dp_rank * share : (dp_rank + 1) * share]


def parse_dist_init_addr(addr: str) -> tuple[str, int]:
    """'HOST:PORT' (IPv6 as '[::1]:PORT') -> (host, port); ValueError naming the flag otherwise."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--dist-init-addr must be HOST:PORT, got {addr!r}.")
    return host.strip("[]"), int(port)


def replica_dist_init_method(dist_init_addr: str, dp_rank: int) -> str:
    """Replica i's TP group meets at HOST:PORT+i (rank 0 of the group hosts the store there)."""
    host, port = parse_dist_init_addr(dist_init_addr)
    host = f"[{host}]" if ":" in host else host
    return f"tcp://{host}:{port + dp_rank}"


def scheduler_name(dp_rank: int, tp_rank: int, dp_size: int) -> str:
    """How logs and errors name a scheduler process ('DP replica i' only with several replicas)."""
    return f"DP replica {dp_rank} scheduler rank {tp_rank}" if dp_size > 1 else f"scheduler rank {tp_rank}"


def ranks_sharing_gpu(dp_rank: int, tp_rank: int, dp_size: int, tp_size: int, nnodes: int, base_gpu_id: int,
                      gpu_id_step: int) -> int:
    """How many scheduler ranks of this node (this one included) run on this rank's GPU."""
    ranks = node_tp_ranks(tp_size, nnodes, tp_rank // tp_size_per_node(tp_size, nnodes))
    mine = gpu_id(dp_rank, tp_rank, tp_size, nnodes, base_gpu_id, gpu_id_step)
    return sum(gpu_id(d, r, tp_size, nnodes, base_gpu_id, gpu_id_step) == mine for d in range(dp_size) for r in ranks)
