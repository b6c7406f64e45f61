"""CUDA path of SamplingBatchInfo.apply_logits_bias: every built-in penalty and the logit bias in
one sgl_kernel_ext launch over the rows' sparse token lists (no [B, V] temporaries)."""

from __future__ import annotations

import importlib.util
from functools import lru_cache
import torch

from sglang.srt.sampling.penaltylib import (
    BatchedFrequencyPenalizer,
    BatchedMinNewTokensPenalizer,
    BatchedPresencePenalizer,
    BatchedRepetitionPenalizer,
)


@lru_cache(maxsize=None)
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def penalty_lists(info):
    """The batch's PenaltyLists, or None when a penalizer the kernel does not know is active."""
    from sgl_kernel_ext.sampling.penalties import PenaltyLists

    lists = PenaltyLists()
    orchestrator = info.penalizer_orchestrator
    for penalizer in orchestrator.penalizers.values() if orchestrator is not None else ():
        if not penalizer.is_prepared():
            continue
        kind = type(penalizer)
        if kind is BatchedFrequencyPenalizer:
            counts = penalizer.output_counts
            lists.freq_ids, lists.freq_counts, lists.freq_penalty = counts.ids, counts.counts, penalizer.penalties
        elif kind is BatchedPresencePenalizer:
            counts = penalizer.output_counts
            lists.pres_ids, lists.pres_counts, lists.pres_penalty = counts.ids, counts.counts, penalizer.penalties
        elif kind is BatchedMinNewTokensPenalizer:
            lists.stop_ids, lists.output_lens = penalizer.stop_ids, penalizer.output_lens
            lists.min_new_tokens = penalizer.min_new_tokens
        elif kind is BatchedRepetitionPenalizer:
            lists.rep_ids, lists.rep_penalty = penalizer.seen.ids, penalizer.penalties
        else:
            return None
    lists.bias_ids, lists.bias_values = info.logit_bias_ids, info.logit_bias_values
    return lists


def apply_logits_bias_fused(info, logits: torch.Tensor) -> bool:
    """Penalties and logit bias in place with one kernel; False (nothing done) when the torch path
    must run instead: no triton, a grammar vocab mask (it sits between penalties and bias), or a
    custom penalizer."""
    if not triton_available() or info.vocab_mask is not None:
        return False
    lists = penalty_lists(info)
    if lists is None:
        return False
    if not lists.empty:
        from sgl_kernel_ext.sampling.penalties import apply_penalties_triton

        apply_penalties_triton(logits, lists)
    return True
