"""The TP all-reduce of the model's hidden states: a one-shot kernel over symmetric (peer-mapped)
buffers for small messages on CUDA, NCCL for the rest.

Made once per TP rank after the process group joins (`init_custom_all_reduce`, every rank at the
same point: the buffer's rendezvous is a collective). Off with --disable-custom-all-reduce, on
CPU, and where symmetric memory cannot be set up (the start-up log says why); the model then
all-reduces through NCCL / gloo as before.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

# Messages up to this size take the one-shot kernel: each rank reads (world - 1) x the message over
# NVLink, which beats NCCL's ring for the [tokens, hidden] tensors of decode steps.
MAX_ONE_SHOT_BYTES = 256 * 1024


class OneShotAllReduce:
    """A symmetric buffer of MAX_ONE_SHOT_BYTES per rank and its signal pads."""

    def __init__(self, device: torch.device, group: dist.ProcessGroup) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        from sgl_kernel_ext.distributed.one_shot_all_reduce import signal_slots_needed

        self.buffer = symm_mem.empty(MAX_ONE_SHOT_BYTES, dtype=torch.uint8, device=device)  # [bytes]
        handle = symm_mem.rendezvous(self.buffer, group.group_name)
        if handle.signal_pad_size < 4 * signal_slots_needed(handle.world_size):
            raise RuntimeError(f"the signal pads hold {handle.signal_pad_size} bytes, too few for the kernel's flags")
        self.handle = handle
        self.rank, self.world_size = handle.rank, handle.world_size

    def serves(self, x: torch.Tensor) -> bool:
        return x.is_contiguous() and x.numel() * x.element_size() <= MAX_ONE_SHOT_BYTES

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from sgl_kernel_ext.distributed.one_shot_all_reduce import one_shot_all_reduce

        return one_shot_all_reduce(x, torch.empty_like(x), self.handle.buffer_ptrs_dev, self.handle.signal_pad_ptrs_dev,
                                   self.rank, self.world_size)


_ONE_SHOT: Optional[OneShotAllReduce] = None


def init_custom_all_reduce(device: torch.device, enabled: bool, cpu_group: dist.ProcessGroup) -> None:
    """Set up the one-shot all-reduce for this TP rank when `enabled` and on CUDA; every rank of
    the group calls this with the same `enabled`. The ranks agree over `cpu_group`: it is used
    only where every rank set it up."""
    global _ONE_SHOT
    _ONE_SHOT = None
    if not enabled or device.type != "cuda" or dist.get_world_size() == 1:
        return
    one_shot, reason = None, ""
    try:
        one_shot = OneShotAllReduce(device, dist.group.WORLD)
    except (RuntimeError, ImportError, AttributeError) as err:
        reason = str(err)
    ready = torch.tensor([int(one_shot is not None)])
    dist.all_reduce(ready, op=dist.ReduceOp.MIN, group=cpu_group)
    if not ready.item():
        logger.warning("The custom all-reduce is off (NCCL serves every all-reduce): %s",
                       reason or "another TP rank could not set it up")
        return
    _ONE_SHOT = one_shot
    logger.info("Custom all-reduce: one-shot over symmetric memory for messages up to %d KiB.", MAX_ONE_SHOT_BYTES // 1024)


def custom_all_reduce(x: torch.Tensor) -> Optional[torch.Tensor]:
    """The sum of every rank's `x` by the one-shot kernel, or None where it does not serve (not set
    up, too large, not contiguous): the caller then all-reduces by NCCL. The sum is rank-ordered,
    the same bits on every rank and at every batch size."""
    if _ONE_SHOT is None or not _ONE_SHOT.serves(x):
        return None
    return _ONE_SHOT(x)


def destroy_custom_all_reduce() -> None:
    global _ONE_SHOT
    _ONE_SHOT = None
