"""Skinny matmul (a decode step's few rows times a weight) as one Triton kernel for CUDA.

y[M, N] = x[M, K] @ W[N, K]^T (+ bias), M <= GEMV_MAX_ROWS, for bf16 / fp16 weights. At a few
rows a linear only streams its weight; the library GEMM reads a Qwen3-0.6B layer's small weights
at 8-50% of the copy bandwidth at M = 1 (docs/gpu_engine.md). Each program here owns BLOCK_N
output columns for every row: it streams its [BLOCK_N, K] slice of W once, in [BLOCK_N, BLOCK_K]
tiles along K (contiguous, pipelined over NUM_STAGES), multiplies each by the rows' [M, BLOCK_K]
slice of x in float32, and sums along K only at the end (per-lane partial sums, one reduction).
There is no split over K, so no second pass and no atomics: the result depends on the shapes
only, and a row gives the same bits alone or batched with up to GEMV_MAX_ROWS - 1 others.

With silu_mul=True, W is a fused [2I, K] gate/up weight and the kernel writes silu(gate) * up
[M, I] directly: each program streams gate rows n and up rows I + n, rounds both results to the
output dtype, then applies the activation with the rounding points of the separate path
(activation/silu_mul_triton.py), so the fused and unfused paths give the same bits.

Tiles: gemv_tile(N, K) (measured on an H200: docs/gpu_engine.md).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.norm.rmsnorm_triton import round_to
from sgl_kernel_ext.triton_launch import launch

GEMV_MAX_ROWS = 4
GEMV_MAX_WEIGHT_ROWS = 16384
DTYPES = (torch.bfloat16, torch.float16)


@triton.jit
def _partial_dot(acc, x_ptr, w_ptr, rows, k0, m, live_m, K, stride_xm, stride_wn, BLOCK_K: tl.constexpr):
    """acc [M_PAD, BN, BK] += x[:, k0:k0+BK] * W[rows, k0:k0+BK] elementwise, in float32."""
    k = k0 + tl.arange(0, BLOCK_K)
    live_k = k < K
    w = tl.load(w_ptr + rows[:, None] * stride_wn + k[None, :], mask=live_k[None, :], other=0.0)  # [BN, BK]
    x = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :], mask=live_m[:, None] & live_k[None, :], other=0.0)
    return acc + x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]


@triton.jit
def _gemv_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N_W, K]: [N, K], or [2I, K] gate | up with SILU_MUL
    bias_ptr,  # [N_W] or a dummy
    y_ptr,  # [M, N]: N = I with SILU_MUL
    M, N, K,
    stride_xm, stride_wn, stride_ym,
    M_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU_MUL: tl.constexpr,
):
    dtype = y_ptr.dtype.element_ty
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    live_n = n < N
    n_safe = tl.where(live_n, n, 0).to(tl.int64)  # dead columns read row 0: no mask along N
    m = tl.arange(0, M_PAD)
    live_m = m < M
    acc = tl.zeros([M_PAD, BLOCK_N, BLOCK_K], tl.float32)
    up = tl.zeros([M_PAD, BLOCK_N, BLOCK_K], tl.float32)
    for k0 in tl.range(0, K, BLOCK_K):
        acc = _partial_dot(acc, x_ptr, w_ptr, n_safe, k0, m, live_m, K, stride_xm, stride_wn, BLOCK_K)
        if SILU_MUL:
            up = _partial_dot(up, x_ptr, w_ptr, N + n_safe, k0, m, live_m, K, stride_xm, stride_wn, BLOCK_K)
    y = tl.sum(acc, axis=2)  # [M_PAD, BN]
    if HAS_BIAS:
        y += tl.load(bias_ptr + n_safe).to(tl.float32)[None, :]
    y = round_to(y, dtype)
    if SILU_MUL:
        u = tl.sum(up, axis=2)
        if HAS_BIAS:
            u += tl.load(bias_ptr + N + n_safe).to(tl.float32)[None, :]
        silu = round_to(y / (1.0 + tl.exp(-y)), dtype)
        y = round_to(silu * round_to(u, dtype), dtype)
    tl.store(y_ptr + m[:, None] * stride_ym + n[None, :], y.to(dtype), mask=live_m[:, None] & live_n[None, :])


def gemv_tile(n: int, k: int, silu_mul: bool = False) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages) for an [n, k] weight (n output columns): four
    columns a program, so that even a 1024-wide output spreads over every SM, and K tiles of
    2-8 KiB per row block. The best of bench_gemv.py's sweep on an H200 at every Qwen3-0.6B shape
    (docs/gpu_engine.md); the stage count changes nothing measurable."""
    return 4, min(1024 if k >= 2048 else 512, triton.next_power_of_2(k)), 4, 1


def gemv_applies(x: torch.Tensor, weight: torch.Tensor, silu_mul: bool = False) -> bool:
    """Whether a linear's x @ weight^T goes to gemv_triton: on CUDA, for the inputs it takes, where
    it measured faster than the library GEMM (bench_gemv.py, H200): one row with a weight of up to
    GEMV_MAX_WEIGHT_ROWS rows (a vocabulary projection, or Qwen3-8B's 24576-row gate/up, streams faster
    through the library), and up to GEMV_MAX_ROWS rows where the output is no wider than the
    input."""
    if not (x.is_cuda and _takes(x, weight)):
        return False
    n, k = (weight.shape[0] // 2 if silu_mul else weight.shape[0]), weight.shape[1]
    return weight.shape[0] <= GEMV_MAX_WEIGHT_ROWS and (x.shape[0] == 1 or n <= k)


def _takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """bf16 / fp16, at most GEMV_MAX_ROWS rows, matching K, unit inner strides."""
    return (
        x.dim() == 2
        and 0 < x.shape[0] <= GEMV_MAX_ROWS
        and x.dtype == weight.dtype
        and weight.dtype in DTYPES
        and weight.dim() == 2
        and x.shape[1] == weight.shape[1]
        and x.stride(1) == 1
        and weight.stride(1) == 1
    )


def gemv_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    silu_mul: bool = False,
    tile: Optional[tuple[int, int, int, int]] = None,
) -> torch.Tensor:
    """x [M, K] @ weight [N_W, K]^T (+ bias [N_W]) -> [M, N_W] in x's dtype; with silu_mul,
    weight is gate | up [2I, K] and the result silu(gate) * up [M, I]."""
    if not _takes(x, weight):
        raise ValueError(f"gemv_triton takes [M <= {GEMV_MAX_ROWS}, K] @ [N, K]^T in bf16/fp16 with unit inner "
                         f"strides, got {tuple(x.shape)} and {tuple(weight.shape)}.")
    rows, k = x.shape
    n = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    block_n, block_k, warps, stages = tile or gemv_tile(n, k, silu_mul)
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)  # [M, N]
    launch(_gemv_kernel, (triton.cdiv(n, block_n),),
        x, weight, bias if bias is not None else weight, y, rows, n, k, x.stride(0), weight.stride(0), y.stride(0),
        M_PAD=triton.next_power_of_2(rows), BLOCK_N=block_n, BLOCK_K=block_k, HAS_BIAS=bias is not None,
        SILU_MUL=silu_mul, num_warps=warps, num_stages=stages,
    )
    return y
