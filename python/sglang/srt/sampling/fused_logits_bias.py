"""CUDA path of SamplingBatchInfo.apply_logits_bias and update_penalties: every built-in penalty
and the logit bias in one sgl_kernel_ext launch over the rows' sparse token lists (no [B, V]
temporaries), and the step's tokens recorded in the penalty state in one more. Both kernels read
the lists through the device's PenaltyTable, which a CUDA graph of the sampling step reads too."""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from typing import TYPE_CHECKING, Optional, Protocol

import torch

from sglang.srt.sampling.penaltylib import BatchedPenalizerOrchestrator
from sglang.srt.sampling.penaltylib.base import _BatchedPenalizer

if TYPE_CHECKING:
    from sgl_kernel_ext.sampling.penalties import PenaltyLists, PenaltyTable


class PenaltySource(Protocol):
    """What the fused kernels read of a batch (its SamplingBatchInfo, which imports this module)."""

    penalizer_orchestrator: Optional[BatchedPenalizerOrchestrator]
    logit_bias_ids: Optional[torch.Tensor]  # [B, K] int64
    logit_bias_values: Optional[torch.Tensor]  # [B, K] float32

    def __len__(self) -> int: ...


@lru_cache(maxsize=None)
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def penalty_lists(info: PenaltySource) -> Optional["PenaltyLists"]:
    """The batch's PenaltyLists, each prepared penalizer writing its own part; None when one has
    no fused representation."""
    from sgl_kernel_ext.sampling.penalties import PenaltyLists

    lists = PenaltyLists()
    for penalizer in _prepared_penalizers(info):
        if not penalizer.write_fused(lists):
            return None
    lists.bias_ids, lists.bias_values = info.logit_bias_ids, info.logit_bias_values
    return lists


def _prepared_penalizers(info: PenaltySource) -> list[_BatchedPenalizer]:
    orchestrator = info.penalizer_orchestrator
    if orchestrator is None:
        return []
    return [p for p in orchestrator.penalizers.values() if p.is_prepared()]


_TABLES: dict[torch.device, "PenaltyTable"] = {}


def penalty_table(device: torch.device) -> "PenaltyTable":
    """The device's one table (a captured graph holds its address for the process's lifetime)."""
    from sgl_kernel_ext.sampling.penalties import PenaltyTable

    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # "cuda" and "cuda:0" must be one table
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _TABLES:
        _TABLES[device] = PenaltyTable(device)
    return _TABLES[device]


def write_penalty_table(info: PenaltySource, device: torch.device) -> bool:
    """Point the device's table at `info`'s lists; False when the torch path must run instead:
    no triton, or a custom penalizer."""
    if not triton_available():
        return False
    lists = penalty_lists(info)
    if lists is None:
        return False
    penalty_table(device).write(lists, len(info))
    return True


def apply_logits_bias_fused(info: PenaltySource, logits: torch.Tensor) -> bool:
    """Penalties and logit bias in place with one kernel; False (nothing done) when the torch path
    must run instead (see write_penalty_table)."""
    if not write_penalty_table(info, logits.device):
        return False
    if info.penalizer_orchestrator is not None or info.logit_bias_ids is not None:
        from sgl_kernel_ext.sampling.penalties import apply_penalties_triton

        apply_penalties_triton(logits, penalty_table(logits.device))
    return True


def update_penalties_fused(info: PenaltySource, next_ids: torch.Tensor) -> bool:
    """Record the step's tokens ([B] int64 on the device) in every penalty's state with one kernel;
    False (nothing done) when the penalizers' own torch updates must run instead."""
    if not write_penalty_table(info, next_ids.device):
        return False
    from sgl_kernel_ext.sampling.penalties import update_penalties_triton

    update_penalties_triton(next_ids, penalty_table(next_ids.device))
    record_fused_update(info)
    return True


def record_fused_update(info: PenaltySource) -> None:
    """Host bookkeeping after a kernel recorded a step's tokens (see TokenCounts.record_added)."""
    for penalizer in _prepared_penalizers(info):
        penalizer.record_fused_update()
