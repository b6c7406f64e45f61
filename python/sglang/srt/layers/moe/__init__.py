"""Mixture-of-experts layers: routing (topk.select_experts) and the experts (fused_moe.FusedMoE)."""

from sglang.srt.layers.moe.fused_moe import FusedMoE, expert_parallel, expert_weight_target, load_expert_weight
from sglang.srt.layers.moe.topk import TopKConfig, select_experts

__all__ = [
    "FusedMoE", "TopKConfig", "expert_parallel", "expert_weight_target", "load_expert_weight", "select_experts",
]
