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

from sglang.srt.distributed.custom_all_reduce import destroy_custom_all_reduce, init_custom_all_reduce

logger = logging.getLogger(__name__)

_CPU_GROUP: Optional[dist.ProcessGroup] = None


def init_tp_groups(tp_rank: int, tp_size: int, device: torch.device, init_method: str, timeout_s: float,
                   custom_all_reduce: bool = False) -> None:
    """Join the TP job: every collective of both groups gives up after `timeout_s` seconds, and so
    does joining, with an error naming the rendezvous address. `custom_all_reduce`: set up the
    one-shot all-reduce for small CUDA messages (custom_all_reduce.py)."""
    try:
        _join(tp_rank, tp_size, device, init_method, timedelta(seconds=timeout_s))
    except (RuntimeError, TimeoutError) as err:  # torch.distributed's DistError is a RuntimeError
        raise RuntimeError(
            f"TP rank {tp_rank} could not join its TP group of {tp_size} ranks at {init_method.removeprefix('tcp://')} "
            f"within --dist-timeout {timeout_s:.0f} s: {err}"
        ) from err
    logger.info("TP rank %d of %d joined (%s).", tp_rank, tp_size, dist.get_backend())
    init_custom_all_reduce(device, custom_all_reduce, tp_cpu_group())


def _join(tp_rank: int, tp_size: int, device: torch.device, init_method: str, timeout: timedelta) -> None:
    global _CPU_GROUP
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group(
            "nccl", init_method=init_method, world_size=tp_size, rank=tp_rank, timeout=timeout, device_id=device
        )
    else:
        dist.init_process_group("gloo", init_method=init_method, world_size=tp_size, rank=tp_rank, timeout=timeout)
    _CPU_GROUP = dist.new_group(backend="gloo", timeout=timeout)


def tp_group_lost(err: BaseException) -> bool:
    """Whether `err` says another rank of the group went away (its process ended, or the network
    failed): gloo reports a closed or reset connection, torch.distributed a DistNetworkError. A
    backend error of this rank's own (an NCCL failure, a timeout) is not that: it is a failure."""
    if isinstance(err, dist.DistNetworkError):
        return True
    message = str(err)
    return isinstance(err, RuntimeError) and any(s in message for s in _PEER_GONE)


_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


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
    destroy_custom_all_reduce()
    if dist.is_initialized():
        dist.destroy_process_group()
    _CPU_GROUP = None
