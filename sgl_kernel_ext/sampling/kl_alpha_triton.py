"""The kl_symmetry alpha of guided rows in one Triton kernel (reference: kl_alpha_reference.py).

One program per row runs every bisection step. A step is one streaming pass over the row: per
lane an online softmax of x = lc + (1 - mid) diff carrying its max m and Σ exp(x - m) diff,
combined across lanes at the end. Only the sign of that sum decides the step (the softmax's
normaliser is positive), so the kernel needs neither the normaliser nor a division. The row's two
float32 inputs are read once per step instead of the reference's softmax, product and sum
passes over [K, V] per step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.sampling.kl_alpha_reference import KL_BISECTION_STEPS
from sgl_kernel_ext.triton_launch import launch, pdl_sync

# One program per row at a time: wide tiles keep enough loads in flight (H200 sweep, docs/benchmarks.md).
BLOCK = 8192
NUM_WARPS = 32
_NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _kl_gap_sign_pass(lc_row, diff_row, w, V, BLOCK: tl.constexpr):
    """Σ_v q_v diff_v scaled by the positive normaliser, for q = softmax(lc + w diff) (ruled-out
    and guide-excluded tokens carry no mass; infinite diffs count as 0)."""
    m = tl.full((BLOCK,), _NEG_INF, tl.float32)
    t = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        live = offs < V
        a = tl.load(lc_row + offs, mask=live, other=_NEG_INF)
        d = tl.load(diff_row + offs, mask=live, other=0.0)
        x = tl.where(a == _NEG_INF, _NEG_INF, a + w * d)
        d = tl.where(tl.abs(d) < float("inf"), d, 0.0)
        m_new = tl.maximum(m, x)
        finite = m_new > _NEG_INF
        keep = tl.where(finite, tl.exp(m - m_new), 0.0)
        e = tl.where(finite, tl.exp(x - m_new), 0.0)
        t = t * keep + e * d
        m = m_new
    top = tl.max(m, axis=0)
    lane = tl.where(m > _NEG_INF, tl.exp(m - top), 0.0)
    return tl.sum(t * lane, axis=0)


@triton.jit(do_not_specialize=["V"])
def _kl_alpha_kernel(lc_ptr, diff_ptr, stride, out_ptr, V, STEPS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_sync(PDL)
    row = tl.program_id(0).to(tl.int64)
    lc_row = lc_ptr + row * stride
    diff_row = diff_ptr + row * stride
    lo = 0.0
    hi = 1.0
    for _ in range(STEPS):
        mid = (lo + hi) * 0.5
        above = _kl_gap_sign_pass(lc_row, diff_row, 1.0 - mid, V, BLOCK) > 0.0  # the root lies at a larger a
        lo = tl.where(above, mid, lo)
        hi = tl.where(above, hi, mid)
    tl.store(out_ptr + row, (lo + hi) * 0.5)


def kl_alpha_triton(lc: torch.Tensor, diff: torch.Tensor, block: int = BLOCK, num_warps: int = NUM_WARPS) -> torch.Tensor:
    """What kl_alpha_reference computes: [K, 1] float32 alphas of rows `lc`, `diff` ([K, V]
    float32). `block` / `num_warps`: the tile (benchmark/bench_kl_alpha.py sweeps them)."""
    K, V = lc.shape
    lc, diff = lc.contiguous(), diff.contiguous()
    out = torch.empty(K, 1, dtype=torch.float32, device=lc.device)
    if K > 0:
        launch(_kl_alpha_kernel, (K,), lc, diff, lc.stride(0), out, V, STEPS=KL_BISECTION_STEPS, BLOCK=block,
               num_warps=num_warps, pdl=True)
    return out
