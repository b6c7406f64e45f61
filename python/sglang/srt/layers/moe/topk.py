"""Expert routing: router logits -> each token's top-k experts and their weights.

Two scoring rules cover the served families:
- softmax (Qwen3-MoE, Mixtral, Qwen3-Next): softmax over all experts in float32, top-k, and
  with `renormalize` (HF's `norm_topk_prob`) the k weights rescaled to sum to 1;
- sigmoid with group-limited selection (DeepSeek-V3): sigmoid scores; the choice (not the
  weights) adds `e_score_correction_bias`; experts form `num_expert_group` groups, a group's
  score is the sum of its two best choice scores, only the best `topk_group` groups compete;
  the weights are the chosen experts' sigmoid scores, renormalised if asked, times
  `routed_scaling_factor`.
Ties go to the lower expert id (torch.topk's order), the same on every path. On CUDA the
softmax rule runs as one Triton launch (sgl_kernel_ext/moe/topk_softmax_triton.py).
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Optional

import torch

from sglang.srt.layers.batch_invariant import pointwise


@dataclass(frozen=True)
class TopKConfig:
    top_k: int
    renormalize: bool  # HF norm_topk_prob
    scoring_func: str = "softmax"  # "softmax" | "sigmoid"
    num_expert_group: Optional[int] = None  # HF n_group (sigmoid routing)
    topk_group: Optional[int] = None
    routed_scaling_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.scoring_func not in ("softmax", "sigmoid"):
            raise ValueError(f"MoE scoring function {self.scoring_func!r} is not supported (softmax, sigmoid).")
        if (self.num_expert_group is None) != (self.topk_group is None):
            raise ValueError("Group-limited routing needs both num_expert_group (n_group) and topk_group.")


def select_experts(
    router_logits: torch.Tensor, config: TopKConfig, correction_bias: Optional[torch.Tensor] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [N, E] -> (weights [N, k] float32, expert ids [N, k] int32)."""
    if config.scoring_func == "softmax":
        if correction_bias is not None or config.num_expert_group is not None:
            raise ValueError("Softmax routing takes no correction bias and no expert groups.")
        kernel = _triton_softmax_topk() if router_logits.is_cuda else None
        if kernel is not None and kernel.softmax_topk_applies(router_logits, config.top_k):
            weights, ids = kernel.softmax_topk(router_logits, config.top_k, config.renormalize)
            return _scaled(weights, config), ids
    logits = router_logits.float()
    if config.scoring_func == "softmax":
        weights, ids = torch.topk(torch.softmax(logits, dim=-1), config.top_k, dim=-1)  # [N, k]
        if config.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
    else:
        scores = pointwise(torch.sigmoid, logits)  # [N, E]
        choice = scores if correction_bias is None else scores + correction_bias.float()
        if config.num_expert_group is not None:
            choice = _limit_to_groups(choice, config.num_expert_group, config.topk_group)
        ids = torch.topk(choice, config.top_k, dim=-1)[1]  # [N, k]
        weights = scores.gather(1, ids)
        if config.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return _scaled(weights, config), ids.to(torch.int32)


def _scaled(weights: torch.Tensor, config: TopKConfig) -> torch.Tensor:
    if config.routed_scaling_factor != 1.0:
        return weights * config.routed_scaling_factor
    return weights


@functools.cache
def _triton_softmax_topk() -> Optional[ModuleType]:
    """sgl_kernel_ext.moe.topk_softmax_triton (one launch on CUDA); None without triton."""
    try:
        return importlib.import_module("sgl_kernel_ext.moe.topk_softmax_triton")
    except ImportError:
        return None


def _limit_to_groups(choice: torch.Tensor, num_groups: int, topk_group: int) -> torch.Tensor:
    """choice [N, E] with every expert outside the `topk_group` best groups set to -inf; a group
    scores the sum of its two best experts."""
    n, num_experts = choice.shape
    if num_experts % num_groups:
        raise ValueError(f"{num_experts} experts do not split into n_group={num_groups} groups.")
    grouped = choice.view(n, num_groups, num_experts // num_groups)  # [N, G, E/G]
    group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1)[0].sum(dim=-1)  # [N, G]
    best_groups = torch.topk(group_scores, topk_group, dim=-1)[1]  # [N, topk_group]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best_groups, True)  # [N, G]
    return grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(n, num_experts)
