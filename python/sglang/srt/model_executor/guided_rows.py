"""A step's guided rows (sampling_params.guidance) in the ModelRunner: the forward of the guide
contexts on the guide model, the guide contexts' logits handed to the Sampler, and each main
row's sampled id stored as its guide row's next input."""

from __future__ import annotations

from typing import Any, Optional

import torch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.step import Step
from sglang.srt.utils import host_to_device


def run_guide_model(step: Step, guide_runner: Any) -> Optional[LogitsProcessorOutput]:
    """The guide model's forward of the step's guide contexts on it (its decode inputs read from
    its own future_tokens); None when the step has none."""
    batch = step.guide_forward_batch
    if batch is None:
        return None
    if step.mode.is_decode():
        batch.input_ids = guide_runner.future_tokens.index_select(0, batch.req_pool_indices).clamp(min=0)
    return guide_runner.forward(batch)


def guide_logits(
    step: Step, output: LogitsProcessorOutput, guide_output: Optional[LogitsProcessorOutput], device: torch.device
) -> Optional[torch.Tensor]:
    """[G, V] the logits of the step's guide rows, in the guided rows' order; None without any."""
    if not step.guide_rows:
        return None
    logits = output.next_token_logits
    if guide_output is not None:
        logits = torch.cat([logits, guide_output.next_token_logits])  # [B + Bg, V]
    return logits.index_select(0, host_to_device(step.guide_rows, device))


def store_guide_tokens(
    step: Step, next_ids: torch.Tensor, future_tokens: torch.Tensor, guide_runner: Any, device: torch.device
) -> None:
    """On the device: the guided rows' sampled ids ([S] int64) into their guide rows' request
    slots of the `future_tokens` of the guide's model, which the next decode step reads."""
    if not step.guide_rows:
        return
    sampled_rows = step.sampling_info.guidance.row_list
    served = step.forward_batch.batch_size
    for on_guide_model in (False, True):
        picks = [j for j, row in enumerate(step.guide_rows) if (row >= served) == on_guide_model]
        if not picks:
            continue
        batch, buffer = (step.guide_forward_batch, guide_runner.future_tokens) if on_guide_model else (step.forward_batch, future_tokens)
        offset = served if on_guide_model else 0
        slots = batch.req_pool_indices.index_select(0, host_to_device([step.guide_rows[j] - offset for j in picks], device))
        buffer.index_copy_(0, slots, next_ids.index_select(0, host_to_device([sampled_rows[j] for j in picks], device)))


def alpha_to_host(step: Step, alpha: Optional[torch.Tensor]) -> Optional[tuple[list[int], torch.Tensor]]:
    """(the sampled rows of the mixture rows, their alphas [M] float32 on the host), copied
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
