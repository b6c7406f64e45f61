"""A sparse MoE MLP block: router linear -> top-k routing -> experts (Qwen3-MoE, Mixtral).

Parameter names follow HF's block: `gate.weight` [E, H] (the router, replicated on every rank)
and `experts.*` (FusedMoE, loaded from `experts.{e}.<proj>.weight` via expert_weight_target).
"""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.layers.linear import ColumnParallelLinear
from sglang.srt.layers.moe.fused_moe import FusedMoE
from sglang.srt.layers.moe.topk import TopKConfig, select_experts


class SparseMoeBlock(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        intermediate_size: int,
        topk: TopKConfig,
        *,
        params_dtype: torch.dtype = torch.float32,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        super().__init__()
        self.topk = topk
        # tp_size=1: every rank holds the whole router and routes every token alike.
        self.gate = ColumnParallelLinear(hidden_size, num_experts, params_dtype=params_dtype)
        self.experts = FusedMoE(
            num_experts, topk.top_k, hidden_size, intermediate_size,
            params_dtype=params_dtype, tp_rank=tp_rank, tp_size=tp_size,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] -> [N, H], all-reduced over the TP group."""
        weights, ids = select_experts(self.gate(x), self.topk)  # [N, k] float32, [N, k] int32
        return self.experts(x, weights, ids)
