"""The eager torch step of a plain sampling backend: NaN guard, greedy rows, temperature, the
backend's draw of unseeded rows, hash-Gumbel draws of seeded rows, logprobs.

UnfusedStep is the shape every plain backend's step shares; TorchStep draws over the whole batch
at once (one support for every row, a second one for the seeded rows). The CPU's grouped step
(sampler_cpu.py) is the same shape with its own greedy and draw stages.
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.layers.logprob_processor import clamped_log_softmax, fill_logprobs
from sglang.srt.layers.sampler_io import TORCH_STEP, StepCall, StepOwner, flag_failed_rows
from sglang.srt.layers.sampling_backends import every_row_support
from sglang.srt.layers.sampling_ops import compute_support, draw_seeded
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo


class UnfusedStep:
    """A plain backend's step; subclasses give the greedy rows' ids and the sampled rows' draw."""

    name: str

    def __init__(self, owner: StepOwner) -> None:
        self.owner = owner

    def __call__(self, call: StepCall) -> tuple[torch.Tensor, torch.Tensor]:
        output, info, row_errors, positions, logprobs, forced_ids, force_after = call
        assert force_after is None, "forcing from support statistics needs a fused backend's step"
        logits = output.next_token_logits
        invalid = invalid_rows(logits, row_errors)
        greedy_ids = self.greedy_ids(logits, info)
        mode = self.owner.logprobs_mode
        raw_logprobs = clamped_log_softmax(logits) if logprobs is not None and mode == "raw" else None
        scaled = logits
        if info.need_temperature_scaling and (logprobs is not None or not info.is_all_greedy):
            # In place: next_token_logits holds the scaled logits afterwards, which saves a second [B, V] buffer.
            scaled = logits.div_(info.temperatures)
        next_ids = greedy_ids if info.is_all_greedy else self.draw(scaled, info, positions, greedy_ids)
        if forced_ids is not None:
            next_ids = torch.where(forced_ids >= 0, forced_ids, next_ids)
        next_ids = torch.where(invalid, torch.full_like(next_ids, -1), next_ids)
        if logprobs is not None:
            values = raw_logprobs if raw_logprobs is not None else self.logprobs(scaled, info)
            fill_logprobs(output, values, next_ids, *logprobs)
        return next_ids, invalid

    def greedy_ids(self, logits: torch.Tensor, info: SamplingBatchInfo) -> Optional[torch.Tensor]:
        """The greedy rows' argmax ids (None when no row is greedy)."""
        raise NotImplementedError

    def draw(
        self,
        scaled: torch.Tensor,
        info: SamplingBatchInfo,
        positions: Optional[torch.Tensor],
        greedy_ids: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """[B] int64 ids of every row of a batch with sampled rows, from the scaled logits [B, V]."""
        raise NotImplementedError

    def logprobs(self, scaled: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        """[B, V] logprobs of the server's mode (scaled or processed) from the scaled logits."""
        if self.owner.logprobs_mode == "scaled":
            return clamped_log_softmax(scaled)
        support = every_row_support(scaled, info)
        kept = torch.where(support.keeps(scaled), scaled, torch.full_like(scaled, float("-inf")))  # [B, V]
        return clamped_log_softmax(kept)


class TorchStep(UnfusedStep):
    """Every plain backend off the CPU: one support over the whole batch (greedy rows included),
    a second one over the seeded rows."""

    name = TORCH_STEP

    def greedy_ids(self, logits: torch.Tensor, info: SamplingBatchInfo) -> Optional[torch.Tensor]:
        """[B] int64 argmax of every row when some row is greedy."""
        return logits.argmax(dim=-1) if info.is_any_greedy else None

    def draw(
        self,
        scaled: torch.Tensor,
        info: SamplingBatchInfo,
        positions: Optional[torch.Tensor],
        greedy_ids: Optional[torch.Tensor],
    ) -> torch.Tensor:
        next_ids = self._sample(scaled, info, positions)
        if greedy_ids is None:
            return next_ids
        return torch.where(info.greedy_mask, greedy_ids, next_ids)

    def _sample(self, scaled: torch.Tensor, info: SamplingBatchInfo, positions: Optional[torch.Tensor]) -> torch.Tensor:
        if info.all_seeded:
            next_ids = torch.zeros(scaled.shape[0], dtype=torch.int64, device=scaled.device)  # [B]
        else:
            next_ids = self.owner.backend.sample(scaled, info, self.owner.generator)
        if info.seeded_rows is None:
            return next_ids
        rows = info.seeded_rows
        seeded_scaled = scaled.index_select(0, rows)  # [S, V]
        support = None
        if info.need_top_k_sampling or info.need_top_p_sampling or info.need_min_p_sampling:
            support = compute_support(
                seeded_scaled,
                info.top_ks.index_select(0, rows),
                info.top_ps.index_select(0, rows),
                info.min_ps.index_select(0, rows),
                window=None if self.owner.seeded_full_sort else info.max_top_k,
                need_top_p=info.need_top_p_sampling,
                need_min_p=info.need_min_p_sampling,
            )
        seeds = info.sampling_seed.index_select(0, rows)
        seeded_ids = draw_seeded(seeded_scaled, support, seeds, positions.index_select(0, rows).to(torch.int64))
        return next_ids.index_copy(0, rows, seeded_ids)


def invalid_rows(logits: torch.Tensor, row_errors: dict[int, str]) -> torch.Tensor:
    """[B] bool: NaN or +inf anywhere, or nothing finite to sample (all -inf), or failed before the draw."""
    invalid = ~torch.isfinite(logits.amax(dim=-1))  # amax propagates NaN and +inf
    return flag_failed_rows(invalid, row_errors) if row_errors else invalid
