"""The sampling kernels' function in plain torch (sample.py's sample_triton and greedy_triton):
support.py's rule and its hash-Gumbel draw, and what both return."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgl_kernel_ext.sampling.support import NEG_INF, compute_support, draw_seeded


@dataclass
class SampleResult:
    ids: torch.Tensor  # [B] int64, -1 on invalid rows
    invalid: torch.Tensor  # [B] bool
    lse: torch.Tensor  # [B] float32, logsumexp of the scaled row
    lse_kept: torch.Tensor  # [B] float32, logsumexp of the scaled row over the kept tokens
    threshold: torch.Tensor  # [B] float32, scaled-logit threshold of the support


def sample_reference(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    log_min_ps: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
) -> SampleResult:
    """The same function in plain torch: support.py's rule (min-p from log_min_ps, as the kernel
    takes it) and its hash-Gumbel draw."""
    B, V = logits.shape
    scaled = logits / temperatures.reshape(B, 1)  # [B, V] float32
    greedy_ids, invalid = greedy_reference(logits)
    safe = torch.where(invalid.unsqueeze(1), torch.zeros_like(scaled), scaled)
    support = compute_support(
        safe, top_ks, top_ps, window=None, need_top_p=True, need_min_p=True, log_min_ps=log_min_ps
    )
    drawn = draw_seeded(safe, support, seeds, positions)
    greedy = (top_ks <= 1).unsqueeze(1)  # [B, 1]; greedy rows keep everything
    threshold = torch.where(greedy, torch.full_like(support.threshold, NEG_INF), support.threshold)  # [B, 1]
    ids = torch.where(greedy.squeeze(1), greedy_ids, drawn)
    ids = torch.where(invalid, torch.full_like(ids, -1), ids)
    kept = torch.where(scaled >= threshold, scaled, torch.full_like(scaled, NEG_INF))
    return SampleResult(
        ids=ids,
        invalid=invalid,
        lse=torch.logsumexp(scaled, dim=-1),
        lse_kept=torch.logsumexp(kept, dim=-1),
        threshold=threshold.squeeze(1),
    )


def greedy_reference(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    invalid = ~torch.isfinite(logits.amax(dim=-1))  # [B] bool; amax propagates NaN
    ids = torch.where(invalid, torch.full_like(invalid, -1, dtype=torch.int64), logits.argmax(dim=-1))
    return ids, invalid
