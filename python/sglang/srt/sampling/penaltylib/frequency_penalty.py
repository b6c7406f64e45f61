"""Frequency penalty: each generated occurrence of a token lowers its logit by the penalty."""

from __future__ import annotations

from typing import Any

import torch

from sglang.srt.sampling.penaltylib.base import _OutputTokenPenalizer


class BatchedFrequencyPenalizer(_OutputTokenPenalizer):
    """logit -= frequency_penalty * count (generated tokens only; negative penalties reward)."""

    @staticmethod
    def _penalty_of(sampling_params: Any) -> float:
        return float(sampling_params.frequency_penalty)

    @staticmethod
    def _weight(counts: torch.Tensor) -> torch.Tensor:
        return counts
