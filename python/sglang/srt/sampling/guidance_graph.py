"""The guidance mix inside a captured sampling graph (model_executor/sampling_graph.py).

A decode step's forward holds the sampled rows first and, after them, the guide contexts of the
guided rows on the served model, in guided-row order (StepBuilder.decode_step), so the decode
graph's logits hold both. The graph mixes every row of its bucket with static inputs: each row's
guide row, its coefficients (k, b, log plausibility as in sampling/guidance.py), whether it is
guided and whether its alpha is chosen by kl_symmetry; unguided and padding rows keep their
logits bit for bit. The arithmetic is guidance.py's, row by row, so a replayed step mixes exactly
as the eager path (test/sampling/test_guidance_graph.py compares them).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from sglang.srt.sampling.guidance import GuidanceBatch, kl_symmetric_alpha, mix_logits


class GuidanceGraphInputs:
    """The static per-row guidance inputs of the sampling graphs, [max_bs] rows each."""

    def __init__(self, max_bs: int, device: torch.device) -> None:
        self.guide_rows = torch.arange(max_bs, dtype=torch.int64, device=device)  # [max_bs]: the row's guide logits row
        self.guided = torch.zeros(max_bs, 1, dtype=torch.bool, device=device)  # [max_bs, 1]
        self.kl = torch.zeros(max_bs, 1, dtype=torch.bool, device=device)  # [max_bs, 1]
        self.k = torch.zeros(max_bs, 1, dtype=torch.float32, device=device)  # [max_bs, 1]
        self.b = torch.zeros(max_bs, 1, dtype=torch.float32, device=device)  # [max_bs, 1]
        self.log_plausibility = torch.full((max_bs, 1), -math.inf, dtype=torch.float32, device=device)  # [max_bs, 1]
        self.alpha = torch.ones(max_bs, dtype=torch.float32, device=device)  # [max_bs] output: each row's alpha
        self._loaded: Optional[GuidanceBatch] = None

    def load(self, batch: GuidanceBatch, sampled: int, rows: int) -> None:
        """Point rows [0, rows) at `batch` (`sampled` sampled rows, their guide rows after them in
        guided-row order); a batch already loaded is not copied again."""
        if self._loaded is batch:
            return
        device = self.k.device
        self.guide_rows[:rows].copy_(torch.arange(rows, dtype=torch.int64, device=device))
        self.guided[:rows].fill_(False)
        self.kl[:rows].fill_(False)
        self.k[:rows].fill_(0.0)
        self.b[:rows].fill_(0.0)
        self.log_plausibility[:rows].fill_(-math.inf)
        guide = torch.arange(sampled, sampled + len(batch), dtype=torch.int64, device=device)  # [G]
        self.guide_rows.index_copy_(0, batch.rows, guide)
        self.guided.index_fill_(0, batch.rows, True)
        self.k.index_copy_(0, batch.rows, batch.k)
        self.b.index_copy_(0, batch.rows, batch.b)
        self.log_plausibility.index_copy_(0, batch.rows, batch.log_plausibility)
        if batch.kl_rows is not None:
            self.kl.index_fill_(0, batch.rows.index_select(0, batch.kl_rows), True)
        self._loaded = batch


def mix_in_graph(logits: torch.Tensor, inputs: GuidanceGraphInputs, with_kl: bool) -> torch.Tensor:
    """Mix every guided row of `logits` ([bs, V] float32, in place) with its guide row of the
    same tensor; `with_kl`: some row picks its alpha by kl_symmetry (a graph of its own, since
    the bisection costs a softmax per step). Fills and returns inputs.alpha[:bs] ([bs] float32)."""
    bs = logits.shape[0]
    guide = logits.index_select(0, inputs.guide_rows[:bs])  # [bs, V]
    lc = torch.log_softmax(logits, dim=-1)  # [bs, V]
    lg = torch.log_softmax(guide, dim=-1)  # [bs, V]
    diff = lg - lc  # [bs, V]
    k = inputs.k[:bs]  # [bs, 1]
    if with_kl:
        k = torch.where(inputs.kl[:bs], 1.0 - kl_symmetric_alpha(lc, diff), k)
    mixed = mix_logits(logits, lc, lg, diff, k, inputs.b[:bs], inputs.log_plausibility[:bs])  # [bs, V]
    logits.copy_(torch.where(inputs.guided[:bs], mixed, logits))
    alpha = inputs.alpha[:bs]
    alpha.copy_(1.0 - k.squeeze(1))
    return alpha
