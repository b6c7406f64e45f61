"""The process groups of one tensor-parallel rank.

Model collectives (row-parallel all-reduce, vocab all-gather, the token all-reduce(MIN), the
debug agreement check) run on the default group: gloo on CPU, NCCL on CUDA. They are issued by
the scheduler's forward worker thread. Scheduler control traffic (each step's new requests,
start-up agreement) runs on a second, gloo-only group from the main thread: two threads must
never issue collectives on one group, or the ranks could see them in different orders.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

_CPU_GROUP: Optional[dist.ProcessGroup] = None


def init_tp_groups(tp_rank: int, tp_size: int, device: torch.device, init_method: str, timeout_s: float) -> None:
    """Join the TP job: every collective of both groups gives up after `timeout_s` seconds."""
    global _CPU_GROUP
    timeout = timedelta(seconds=timeout_s)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group(
            "nccl", init_method=init_method, world_size=tp_size, rank=tp_rank, timeout=timeout, device_id=device
        )
    else:
        dist.init_process_group("gloo", init_method=init_method, world_size=tp_size, rank=tp_rank, timeout=timeout)
    _CPU_GROUP = dist.new_group(backend="gloo", timeout=timeout)
    logger.info("TP rank %d of %d joined (%s).", tp_rank, tp_size, dist.get_backend())


def tp_cpu_group() -> dist.ProcessGroup:
    """The gloo group for scheduler control traffic (main thread only)."""
    if _CPU_GROUP is None:
        raise RuntimeError("init_tp_groups() has not been called in this process.")
    return _CPU_GROUP


def tp_device_group() -> dist.ProcessGroup:
    """The group of the model's collectives (forward worker thread only)."""
    return dist.group.WORLD


def destroy_tp_groups() -> None:
    global _CPU_GROUP
    if dist.is_initialized():
        dist.destroy_process_group()
    _CPU_GROUP = None
