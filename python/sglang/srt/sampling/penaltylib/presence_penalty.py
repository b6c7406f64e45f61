"""Presence penalty: a token generated at least once loses the penalty, however often it recurs."""

from __future__ import annotations

from typing import Any

import torch

from sglang.srt.sampling.penaltylib.base import _OutputTokenPenalizer


class BatchedPresencePenalizer(_OutputTokenPenalizer):
    """logit -= presence_penalty if count > 0 (generated tokens only; negative penalties reward)."""

    @staticmethod
    def _penalty_of(sampling_params: Any) -> float:
        return float(sampling_params.presence_penalty)

    @staticmethod
    def _weight(counts: torch.Tensor) -> torch.Tensor:
        return (counts > 0).to(torch.float32)
