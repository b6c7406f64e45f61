"""Frequency penalty: each generated occurrence of a token lowers its logit by the penalty."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from sglang.srt.sampling.penaltylib.base import _OutputTokenPenalizer

if TYPE_CHECKING:
    from sgl_kernel_ext.sampling.penalties import PenaltyLists


class BatchedFrequencyPenalizer(_OutputTokenPenalizer):
    """logit -= frequency_penalty * count (generated tokens only; negative penalties reward)."""

    @staticmethod
    def _penalty_of(sampling_params: Any) -> float:
        return float(sampling_params.frequency_penalty)

    @staticmethod
    def _weight(counts: torch.Tensor) -> torch.Tensor:
        return counts

    def write_fused(self, lists: "PenaltyLists") -> bool:
        (lists.freq_ids, lists.freq_counts), lists.freq_lengths = self.output_counts.storage, self.output_counts.lengths
        lists.freq_penalty = self.penalties
        return True
