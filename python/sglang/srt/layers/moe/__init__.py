"""Mixture-of-experts layers: routing (topk.select_experts) and the experts (fused_moe.FusedMoE)."""

from sglang.srt.layers.moe.fused_moe import FusedMoE, expert_weight_target
from sglang.srt.layers.moe.topk import TopKConfig, select_experts

__all__ = ["FusedMoE", "TopKConfig", "expert_weight_target", "select_experts"]
