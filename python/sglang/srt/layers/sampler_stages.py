"""The logits stages before the draw, in the Sampler's order: the guided rows' mix with their guide
context (sampling/guidance.py) -> penalties -> logit_bias -> grammar
mask (SamplingBatchInfo.apply_logits_bias, one fused kernel for the first two on CUDA) -> batch-level
logits processors -> custom logit processors. Each works in place on the step's [B, V] logits; a
processor that fails fails only its own rows, which come back as {row: message}."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from sglang.srt.constrained.bitmask import grammar_bitmask
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.logprob_processor import clamped_log_softmax, fill_logprobs
from sglang.srt.layers.sampler_io import SampledRow
from sglang.srt.sampling.guidance import apply_guidance
from sglang.srt.sampling.sampling_batch_info import ProcessorEntry, SamplingBatchInfo


def mix_guided_rows(logits: torch.Tensor, info: SamplingBatchInfo, guide_logits: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The guided rows of `logits` ([B, V], in place) mixed with `guide_logits` ([G, V]); returns
    their alphas ([G] float32), or None when no row is guided."""
    if info.guidance is None:
        return None
    if guide_logits is None or guide_logits.shape[0] != len(info.guidance):
        raise ValueError(f"{len(info.guidance)} guided rows need as many rows of guide logits.")
    return apply_guidance(logits, guide_logits, info.guidance)


def main_context_logprobs(
    out: LogitsProcessorOutput, main_logits: torch.Tensor, info: SamplingBatchInfo, next_ids: torch.Tensor,
    top_logprobs_nums: list[int], token_ids_logprobs: list[Optional[list[int]]],
) -> None:
    """The `raw` logprob mode on guided rows: their logprobs (sampled, top-k, token ids) from the
    main context's own logits (`main_logits` [G, V], before the mix), written over the rows of
    `out` that the step filled from the mixed logits."""
    rows, picks = info.guidance.rows, info.guidance.row_list
    mine = LogitsProcessorOutput(next_token_logits=None)
    fill_logprobs(mine, clamped_log_softmax(main_logits), next_ids.index_select(0, rows),
                  [top_logprobs_nums[i] for i in picks], [token_ids_logprobs[i] for i in picks])
    out.next_token_logprobs.index_copy_(0, rows, mine.next_token_logprobs)
    for name in ("next_token_top_logprobs_val", "next_token_top_logprobs_idx", "next_token_token_ids_logprobs_val"):
        values = getattr(mine, name, None)
        if values is not None:
            getattr(out, name)[:, : values.shape[1]].index_copy_(0, rows, values)


def apply_penalties_bias_and_mask(logits: torch.Tensor, info: SamplingBatchInfo, rows: Sequence[SampledRow]) -> None:
    """Penalties, logit_bias, then the grammar rows' vocab mask, built from `rows`' matchers for this step."""
    if info.grammars is not None:
        info.vocab_mask = grammar_bitmask(rows, logits.shape[1], logits.device)  # [B, ceil(V / 32)] int32
    try:
        info.apply_logits_bias(logits)
    finally:
        info.vocab_mask = None


def run_batch_processors(
    logits: torch.Tensor, info: SamplingBatchInfo, truth: Optional[Sequence[SampledRow]]
) -> dict[int, str]:
    """The batch-level processors acting on some row (none: no processor code runs); `truth`, when
    given, is checked against each processor's view of the rows."""
    if info.logits_processors is None:
        return {}
    return info.logits_processors.run(logits, info.rows, info.is_all_greedy, truth)


def apply_custom_logit_processors(logits: torch.Tensor, info: SamplingBatchInfo) -> dict[int, str]:
    """Run each distinct custom processor once on its rows."""
    errors: dict[int, str] = {}
    if not info.has_custom_logit_processor:
        return errors
    for entry in info.custom_logit_processor.values():
        message = entry.error or _run_processor(logits, entry, info.custom_params)
        if message is not None:
            errors.update(dict.fromkeys(entry.rows, message))
    return errors


def _run_processor(logits: torch.Tensor, entry: ProcessorEntry, custom_params: list[Optional[dict]]) -> Optional[str]:
    rows_logits = logits.index_select(0, entry.indices)  # [R, V]
    try:
        result = entry.processor(rows_logits, [custom_params[r] for r in entry.rows])
        if not isinstance(result, torch.Tensor) or result.shape != rows_logits.shape:
            raise TypeError(f"must return a tensor of shape {tuple(rows_logits.shape)}")
        logits.index_copy_(0, entry.indices, result.to(device=logits.device, dtype=logits.dtype))
    except Exception as err:  # noqa: BLE001 - any processor error fails its own rows only
        return f"custom_logit_processor {type(entry.processor).__name__} failed: {type(err).__name__}: {err}"
    return None
