"""A step's guided rows (sampling_params.guidance) in the ModelRunner: the guide contexts' logits
handed to the Sampler, and each main row's sampled id stored as its guide row's next input."""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.step import Step
from sglang.srt.utils import host_to_device


def guide_logits(step: Step, output: LogitsProcessorOutput, device: torch.device) -> Optional[torch.Tensor]:
    """[G, V] the logits of the step's guide rows, in the guided rows' order; None without any."""
    if not step.guide_rows:
        return None
    return output.next_token_logits.index_select(0, host_to_device(step.guide_rows, device))


def store_guide_tokens(step: Step, next_ids: torch.Tensor, future_tokens: torch.Tensor, device: torch.device) -> None:
    """On the device: the guided rows' sampled ids ([S] int64) into their guide rows' request
    slots of `future_tokens`, which the next decode step reads as input ids."""
    if not step.guide_rows:
        return
    slots = step.forward_batch.req_pool_indices.index_select(0, host_to_device(step.guide_rows, device))  # [G]
    future_tokens.index_copy_(0, slots, next_ids.index_select(0, step.sampling_info.guidance.rows))


def alpha_to_host(step: Step, alpha: Optional[torch.Tensor]) -> Optional[tuple[list[int], torch.Tensor]]:
    """(the sampled rows of the mixture rows, their alphas [G] float32 on the host), copied
    without waiting (read after the step's ready event); None when no row mixes."""
    guidance = step.sampling_info.guidance
    if alpha is None or not guidance.mixture_rows:
        return None
    rows = [guidance.row_list[j] for j in guidance.mixture_rows]
    picked = alpha if len(rows) == len(guidance) else alpha.index_select(0, host_to_device(guidance.mixture_rows, alpha.device))
    if picked.device.type != "cuda":
        return rows, picked
    host = torch.empty(picked.shape, dtype=picked.dtype, pin_memory=True)
    host.copy_(picked, non_blocking=True)
    return rows, host
