"""FP8 weights times a few unquantised rows (W8A16) as a Triton GEMV, for decode-sized batches.

At a handful of rows a linear layer only streams its weight: the W8A8 path's activation
quantisation launch and its tensor-core tiles padded to 16 rows add work without saving any
weight reads. Each program here takes BLOCK_N output columns, streams their FP8 codes in
[BLOCK_N, BLOCK_K] tiles, scales each tile by its weight scale and multiplies it by the rows in
float32 with no rounding of the activations. No host synchronisation: CUDA graphs capture it.
Numbers: fp8_gemv_reference (x in float32 times the dequantised weight).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.gemm.fp8_reference import dequantize_weight
from sgl_kernel_ext.triton_launch import launch

# Rows up to which the GEMV serves (every row shares each weight load; more rows, more registers).
GEMV_MAX_ROWS = 4
BLOCK_N = 16
BLOCK_K = 128


@triton.jit
def _fp8_gemv_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K] fp8
    s_ptr,  # [ceil(N / SCALE_N), ceil(K / SCALE_K)] float32
    out_ptr,  # [M, N]
    M,
    N,
    K,
    stride_x,
    stride_w,
    stride_s,
    stride_out,
    SCALE_N: tl.constexpr,
    SCALE_K: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    cols = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    col_live = cols < N
    rows = tl.arange(0, ROWS)
    row_live = rows < M
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_live = ks < K
        w = tl.load(w_ptr + cols[:, None] * stride_w + ks[None, :], mask=col_live[:, None] & k_live[None, :], other=0.0)
        s = tl.load(s_ptr + (cols // SCALE_N) * stride_s + k0 // SCALE_K, mask=col_live, other=0.0)  # [BN]
        w = w.to(tl.float32) * s[:, None]  # [BN, BK]
        x = tl.load(x_ptr + rows[:, None] * stride_x + ks[None, :], mask=row_live[:, None] & k_live[None, :], other=0.0)
        acc += tl.sum(x.to(tl.float32)[:, None, :] * w[None, :, :], axis=2)  # [ROWS, BN]
    out = out_ptr + rows[:, None] * stride_out + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_live[:, None] & col_live[None, :])


def fp8_gemv_applies(x: torch.Tensor, scale_block: tuple[int, int]) -> bool:
    """At most GEMV_MAX_ROWS rows, and K tiles that never straddle two weight-scale columns."""
    return x.shape[0] <= GEMV_MAX_ROWS and scale_block[1] % BLOCK_K == 0


def fp8_gemv(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, scale_block: tuple[int, int]
) -> torch.Tensor:
    """x [M, K] (M <= GEMV_MAX_ROWS, unit column stride), weight [N, K] fp8, weight_scale
    [ceil(N / bn), ceil(K / bk)] for scale_block (bn, bk) with bk a multiple of BLOCK_K (per
    output row: (1, K rounded up to it)) -> [M, N] in x's dtype."""
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)  # [M, N]
    if m == 0 or n == 0:
        return out
    rows = triton.next_power_of_2(m)
    launch(_fp8_gemv_kernel, (triton.cdiv(n, BLOCK_N),), x, weight, weight_scale, out, m, n, k, x.stride(0),
           weight.stride(0), weight_scale.stride(0), out.stride(0), SCALE_N=scale_block[0], SCALE_K=scale_block[1],
           ROWS=rows, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=4, num_stages=4)
    return out


def fp8_gemv_reference(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, scale_block: tuple[int, int]
) -> torch.Tensor:
    """x [M, K] in float32 times the dequantised weight [N, K] -> [M, N] in x's dtype."""
    return (x.float() @ dequantize_weight(weight, weight_scale, scale_block).t()).to(x.dtype)
