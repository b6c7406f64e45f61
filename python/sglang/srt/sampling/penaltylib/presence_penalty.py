"""Presence penalty: a token generated at least once loses the penalty, however often it recurs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from sglang.srt.sampling.penaltylib.base import _OutputTokenPenalizer

if TYPE_CHECKING:
    from sgl_kernel_ext.sampling.penalties import PenaltyLists


class BatchedPresencePenalizer(_OutputTokenPenalizer):
    """logit -= presence_penalty if count > 0 (generated tokens only; negative penalties reward)."""

    @staticmethod
    def _penalty_of(sampling_params: Any) -> float:
        return float(sampling_params.presence_penalty)

    @staticmethod
    def _weight(counts: torch.Tensor) -> torch.Tensor:
        return (counts > 0).to(torch.float32)

    def write_fused(self, lists: "PenaltyLists") -> bool:
        (lists.pres_ids, lists.pres_counts), lists.pres_lengths = self.output_counts.storage, self.output_counts.lengths
        lists.pres_penalty = self.penalties
        return True
