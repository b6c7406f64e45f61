"""Plain-torch sampling primitives shared by every backend.

The support-set rule (top-k with ties kept, joint top-p, min-p, as one threshold in scaled-logit
space) and the seeded hash-Gumbel draw are defined once, in sgl_kernel_ext.sampling.support, the
definition the Triton kernels are tested against; they are re-exported here. This module adds
the unseeded draw: one inverse-CDF draw per row from the sampler's generator.
"""

from __future__ import annotations

from typing import Optional

import torch

from sgl_kernel_ext.sampling.support import (
    NEG_INF,
    Support,
    compute_support,
    draw_seeded,
    draw_seeded_in_window,
    min_p_threshold,
)
from sgl_kernel_ext.sampling.window_cpu import window_cpu_applies, window_draw_cpu

__all__ = [
    "NEG_INF",
    "Support",
    "compute_support",
    "draw_seeded",
    "draw_seeded_in_window",
    "draw_unseeded",
    "draw_unseeded_in_window",
    "inverse_cdf_draw",
    "inverse_cdf_draw_torch",
    "min_p_threshold",
    "uniform_open_closed",
]


def uniform_open_closed(rows: int, device: torch.device, generator: Optional[torch.Generator]) -> torch.Tensor:
    """[rows, 1] float32 in (0, 1]: never 0, so an inverse-CDF draw never lands on a masked token."""
    return 1.0 - torch.rand(rows, 1, device=device, generator=generator)


def inverse_cdf_draw(values: torch.Tensor, threshold: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Column index [B] drawn with probability ∝ exp(value) among columns with value >= threshold
    (values [B, N], threshold and u [B, 1]); on the CPU the C kernel, with the same columns."""
    if window_cpu_applies(values):
        return window_draw_cpu(values, threshold, u)
    return inverse_cdf_draw_torch(values, threshold, u)


def inverse_cdf_draw_torch(values: torch.Tensor, threshold: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """inverse_cdf_draw in torch ops: the CUDA path, and the C kernel's reference."""
    vmax = values.amax(dim=-1, keepdim=True)
    weights = torch.where(values >= threshold, torch.exp(values - vmax), torch.zeros_like(values))
    cdf = torch.cumsum(weights, dim=-1)  # [B, N], non-decreasing
    target = u * cdf[:, -1:]
    # The first column whose cdf reaches target > 0 has positive weight, so it is kept.
    col = torch.searchsorted(cdf, target, right=False).clamp_(max=values.shape[1] - 1)
    # A parallel scan (CUDA) need not be exactly monotonic across zero-weight columns; never
    # return one: fall back to the most likely kept token (a ~1e-7 event).
    kept = weights.gather(1, col) > 0
    return torch.where(kept, col, weights.argmax(dim=-1, keepdim=True)).squeeze(1)


def draw_unseeded(
    scaled: torch.Tensor,
    support: Optional[Support],
    generator: Optional[torch.Generator],
    u: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Token ids [B] int64 from the filtered softmax, one uniform per row (`u` [B, 1] if given)."""
    if u is None:
        u = uniform_open_closed(scaled.shape[0], scaled.device, generator)
    if support is None:
        return inverse_cdf_draw(scaled, torch.full_like(u, NEG_INF), u)
    if support.window_draws():
        # CPU only: the check is free there, and the draw then stays inside the small window.
        return draw_unseeded_in_window(support, u)
    return inverse_cdf_draw(scaled, support.threshold, u)


def draw_unseeded_in_window(support: Support, u: torch.Tensor) -> torch.Tensor:
    """draw_unseeded when `support.window_draws()`: the same token for the same u, from the window."""
    col = inverse_cdf_draw(support.vals, support.threshold, u)
    return support.idx.gather(1, col.unsqueeze(1)).squeeze(1)
