"""Plain-torch reference of sgl_kernel_ext.sampling.kl_alpha_triton (and the CPU path): no Triton.

The kl_symmetry alpha of a guided row (sglang.srt.sampling.guidance): the a in [0, 1] with
E_q[lg - lc] = 0 for q = softmax(a lc + (1 - a) lg), i.e. KL(q || pc) = KL(q || pg). That
expectation falls monotonically in a, so bisection of [0, 1] finds it.
"""

from __future__ import annotations

import math

import torch

KL_BISECTION_TOL = 1e-4
# Halvings of [0, 1] until the midpoint is within KL_BISECTION_TOL of the root.
KL_BISECTION_STEPS = math.ceil(math.log2(1.0 / KL_BISECTION_TOL))


def kl_alpha_reference(lc: torch.Tensor, diff: torch.Tensor) -> torch.Tensor:
    """[K, 1] float32: per row the a in [0, 1] with E_q[diff] = 0, q = softmax(lc + (1 - a) diff)
    (`lc` [K, V] the main log-probs, `diff` [K, V] = lg - lc), by KL_BISECTION_STEPS batched
    bisection steps. Tokens the main context rules out carry no mass in q, and tokens the guide
    rules out none at any a < 1."""
    lo = torch.zeros(lc.shape[0], 1, dtype=torch.float32, device=lc.device)
    hi = torch.ones_like(lo)
    ruled_out = lc == -math.inf  # [K, V]
    finite = torch.where(torch.isfinite(diff), diff, torch.zeros_like(diff))  # -inf tokens carry no mass in q
    for _ in range(KL_BISECTION_STEPS):
        mid = (lo + hi) * 0.5
        q = torch.softmax((lc + (1.0 - mid) * diff).masked_fill(ruled_out, -math.inf), dim=-1)  # [K, V]
        gap = (q * finite).sum(dim=-1, keepdim=True)  # KL(q||pc) - KL(q||pg)
        above = gap > 0  # the root lies at a larger a
        lo = torch.where(above, mid, lo)
        hi = torch.where(above, hi, mid)
    return (lo + hi) * 0.5
