"""Skinny matmul (a decode step's few rows times a weight) as one Triton kernel for CUDA.

y[M, N] = x[M, K] @ W[N, K]^T (+ bias), M <= GEMV_MAX_ROWS, for bf16 / fp16 weights. At a few
rows a linear only streams its weight; the library GEMM reads a Qwen3-0.6B layer's small weights
at 8-50% of the copy bandwidth at M = 1 (docs/gpu_engine.md). Each program here owns BLOCK_N
output columns for every row: it streams its [BLOCK_N, K] slice of W once, in [BLOCK_N, BLOCK_K]
tiles along K (contiguous), multiplies each by the rows' [M, BLOCK_K]
slice of x in float32, and sums along K only at the end (per-lane partial sums, one reduction).
There is no split over K, so no second pass and no atomics: the result depends on the shapes
only, and a row gives the same bits alone or batched with up to GEMV_MAX_ROWS - 1 others.

With silu_mul=True, W is a fused [2I, K] gate/up weight and the kernel writes silu(gate) * up
[M, I] directly: each program streams gate rows n and up rows I + n, rounds both results to the
output dtype, then applies the activation with the rounding points of the separate path
(activation/silu_mul_triton.py), so the fused and unfused paths give the same bits.

With norm_weight, x is first RMS-normed (with the residual add before it) in the kernel's
prologue, so that a decoder layer's norm and the linear after it are one launch: every program
computes each row's h = round(x + residual) (or h = x) and its rstd with rmsnorm_triton's formulas
(float32 sum of squares over the whole row, one block of up to NORM_MAX_BLOCK lanes; IEEE division
and square root), then in its K loop multiplies round(round(h * rstd) * w) instead of x, h
recomputed from the x / residual tiles (a few KiB, L2-resident). The products are those of
rmsnorm_triton followed by the plain kernel; only the order of the row sum may differ, which can
move rstd by a float32 ulp and, rarely, an output by one ulp of the model dtype. Program 0 alone
writes h to residual_out, a separate tensor, since the other programs still read the residual.

Under PDL (sgl_kernel_ext/triton_launch.py) each program loads its first weight tile before it
waits for the kernel ahead of it, so the weight must not be written by the kernel launched just
before the call on the same stream (a model's weights are written at load, long before a step);
everything else is read after the wait.

Tiles: gemv_tile(N, K) (measured on an H200: docs/gpu_engine.md).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.norm.rmsnorm_triton import round_to
from sgl_kernel_ext.triton_launch import launch, pdl_sync

GEMV_MAX_ROWS = 4
GEMV_MAX_WEIGHT_ROWS = 16384
DTYPES = (torch.bfloat16, torch.float16)
# Lanes of the norm prologue's row block: a row up to this wide is summed in one tl.sum, as
# rmsnorm_triton sums it; a wider one in blocks of this many lanes, per lane, then once.
NORM_MAX_BLOCK = 8192


@triton.jit
def _weight_tile(w_ptr, rows, k, live_k, stride_wn):
    """W[rows, k], [BN, BK] in the weight's dtype (dead k read as 0)."""
    return tl.load(w_ptr + rows[:, None] * stride_wn + k[None, :], mask=live_k[None, :], other=0.0)


@triton.jit
def _dot_tile(acc, x, w):
    """acc [M_PAD, BN, BK] += x [M_PAD, BK] (float32) * w [BN, BK] elementwise, in float32."""
    return acc + x[:, None, :] * w.to(tl.float32)[None, :, :]


@triton.jit
def _row_rstd(x_ptr, res_ptr, res_out_ptr, cols, written, K, eps, k_f,
              DTYPE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, NORM_BLOCK: tl.constexpr):
    """1 / sqrt(mean(h^2) + eps) of one row's h = round(x + residual) (or x), with rmsnorm_triton's
    rounding; the row's first `written` columns of h also go to res_out. cols: K, or 0 for a
    padding row (masks by scalar counts: the interpreter cannot splat a scalar boolean)."""
    sq = tl.zeros([NORM_BLOCK], tl.float32)
    for k0 in tl.range(0, K, NORM_BLOCK):
        k = k0 + tl.arange(0, NORM_BLOCK)
        h = tl.load(x_ptr + k, mask=k < cols, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            h = round_to(h + tl.load(res_ptr + k, mask=k < cols, other=0.0).to(tl.float32), DTYPE)
            tl.store(res_out_ptr + k, h.to(DTYPE), mask=k < written)
        sq += h * h
    mean_sq = tl.math.div_rn(tl.sum(sq, axis=0), k_f)
    return tl.math.div_rn(1.0, tl.sqrt_rn(mean_sq + eps))


@triton.jit
def _x_tile(x_ptr, res_ptr, norm_w_ptr, rstd, m, live_m, k, live_k, K, stride_xm,
            DTYPE: tl.constexpr, HAS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """The rows' input at columns k, [M_PAD, BK] in float32: x, or with HAS_NORM the normed
    round(round(h * rstd) * w)."""
    live = live_m[:, None] & live_k[None, :]
    h = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :], mask=live, other=0.0).to(tl.float32)
    if HAS_NORM:
        if HAS_RESIDUAL:
            res = tl.load(res_ptr + m[:, None] * K + k[None, :], mask=live, other=0.0).to(tl.float32)
            h = round_to(h + res, DTYPE)
        w = tl.load(norm_w_ptr + k, mask=live_k, other=0.0).to(tl.float32)
        h = round_to(round_to(h * rstd[:, None], DTYPE) * w[None, :], DTYPE)
    return h


@triton.jit
def _gemv_kernel(
    x_ptr,  # [M, K]
    res_ptr,  # [M, K] contiguous with HAS_RESIDUAL, else a dummy
    res_out_ptr,  # [M, K] contiguous with HAS_RESIDUAL (x + residual, program 0 writes it), else a dummy
    norm_w_ptr,  # [K] with HAS_NORM, else a dummy
    w_ptr,  # [N_W, K]: [N, K], or [2I, K] gate | up with SILU_MUL
    bias_ptr,  # [N_W] or a dummy
    y_ptr,  # [M, N]: N = I with SILU_MUL
    M, N, K,
    stride_xm, stride_wn, stride_ym,
    eps,
    k_f,  # float(K): an int argument equal to 1 would be specialised to a constant
    M_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NORM_BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU_MUL: tl.constexpr,
    HAS_NORM: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    PDL: tl.constexpr,
):
    dtype = y_ptr.dtype.element_ty
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    live_n = n < N
    n_safe = tl.where(live_n, n, 0).to(tl.int64)  # dead columns read row 0: no mask along N
    m = tl.arange(0, M_PAD)
    live_m = m < M
    # The first K tile of the weight is loaded before pdl_sync (the module docstring's contract).
    k = tl.arange(0, BLOCK_K)
    live_k = k < K
    w_first = _weight_tile(w_ptr, n_safe, k, live_k, stride_wn)  # [BN, BK]
    u_first = w_first
    if SILU_MUL:
        u_first = _weight_tile(w_ptr, N + n_safe, k, live_k, stride_wn)
    pdl_sync(PDL)
    rstd = tl.zeros([M_PAD], tl.float32)
    if HAS_NORM:
        for i in tl.static_range(M_PAD):
            cols = tl.where(i < M, K, 0)
            written = tl.where(tl.program_id(0) == 0, cols, 0)  # program 0 alone writes x + residual
            row_rstd = _row_rstd(x_ptr + i * stride_xm, res_ptr + i * K, res_out_ptr + i * K, cols, written,
                                 K, eps, k_f, dtype, HAS_RESIDUAL, NORM_BLOCK)
            rstd = tl.where(m == i, row_rstd, rstd)
    xt = _x_tile(x_ptr, res_ptr, norm_w_ptr, rstd, m, live_m, k, live_k, K, stride_xm, dtype, HAS_NORM, HAS_RESIDUAL)
    acc = _dot_tile(tl.zeros([M_PAD, BLOCK_N, BLOCK_K], tl.float32), xt, w_first)
    up = tl.zeros([M_PAD, BLOCK_N, BLOCK_K], tl.float32)
    if SILU_MUL:
        up = _dot_tile(up, xt, u_first)
    for k0 in tl.range(BLOCK_K, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        live_k = k < K
        xt = _x_tile(x_ptr, res_ptr, norm_w_ptr, rstd, m, live_m, k, live_k, K, stride_xm, dtype, HAS_NORM,
                     HAS_RESIDUAL)
        acc = _dot_tile(acc, xt, _weight_tile(w_ptr, n_safe, k, live_k, stride_wn))
        if SILU_MUL:
            up = _dot_tile(up, xt, _weight_tile(w_ptr, N + n_safe, k, live_k, stride_wn))
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


def gemv_tile(n: int, k: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages) for an [n, k] weight (n output columns): four
    columns a program, so that even a 1024-wide output spreads over every SM, and K tiles of
    2-8 KiB per row block. The best of bench_gemv.py's sweep on an H200 at every Qwen3-0.6B shape
    (docs/gpu_engine.md); the stage count changes nothing measurable."""
    return 4, min(1024 if k >= 2048 else 512, triton.next_power_of_2(k)), 4, 1


def gemv_applies(x: torch.Tensor, weight: torch.Tensor, silu_mul: bool = False) -> bool:
    """Whether a linear's x @ weight^T goes to gemv_triton: on CUDA, where gemv_rule holds."""
    return x.is_cuda and gemv_rule(x, weight, silu_mul)


def gemv_rule(x: torch.Tensor, weight: torch.Tensor, silu_mul: bool = False) -> bool:
    """The inputs the kernel takes where it measured faster than the library GEMM (bench_gemv.py,
    H200), on any device: one row with a weight of up to GEMV_MAX_WEIGHT_ROWS rows (a vocabulary
    projection, or Qwen3-8B's 24576-row gate/up, streams faster through the library), and up to
    GEMV_MAX_ROWS rows where the output is no wider than the input."""
    if not _takes(x, weight):
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


def gemv_norm_takes(x: torch.Tensor, norm_weight: torch.Tensor, residual: Optional[torch.Tensor] = None) -> bool:
    """Whether the norm prologue takes these, for an x [M, K] gemv_triton takes: a contiguous norm
    weight [K] in x's dtype; a residual contiguous, of x's shape and dtype."""
    return (
        norm_weight.shape == (x.shape[1],)
        and norm_weight.dtype == x.dtype
        and norm_weight.is_contiguous()
        and (residual is None or (residual.shape == x.shape and residual.dtype == x.dtype and residual.is_contiguous()))
    )


def _check_norm(
    x: torch.Tensor, norm_weight: Optional[torch.Tensor], residual: Optional[torch.Tensor],
    residual_out: Optional[torch.Tensor],
) -> None:
    if norm_weight is None:
        if residual is not None or residual_out is not None:
            raise ValueError("gemv_triton adds a residual only before its norm: residual needs norm_weight.")
        return
    if not gemv_norm_takes(x, norm_weight, residual):
        raise ValueError("gemv_triton's norm takes a contiguous weight [K] and residual [M, K] in x's dtype.")
    if (residual is None) != (residual_out is None):
        raise ValueError("gemv_triton writes x + residual to residual_out: give both or neither.")
    if residual_out is not None:
        separate = residual_out.data_ptr() not in (x.data_ptr(), residual.data_ptr())
        if not (separate and gemv_norm_takes(x, norm_weight, residual_out)):
            raise ValueError("residual_out must be a contiguous [M, K] tensor in x's dtype, apart from x and residual.")


def gemv_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    silu_mul: bool = False,
    tile: Optional[tuple[int, int, int, int]] = None,
    norm_weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    residual: Optional[torch.Tensor] = None,
    residual_out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """x [M, K] @ weight [N_W, K]^T (+ bias [N_W]) -> [M, N_W] in x's dtype; with silu_mul,
    weight is gate | up [2I, K] and the result silu(gate) * up [M, I].

    With norm_weight [K], the matmul takes RMSNorm(h) * norm_weight (rmsnorm_triton's numerics)
    instead of x, h = x + residual with residual [M, K], else x; h is written to residual_out
    [M, K] (a tensor apart from x and residual, which stay unchanged)."""
    if not _takes(x, weight):
        raise ValueError(f"gemv_triton takes [M <= {GEMV_MAX_ROWS}, K] @ [N, K]^T in bf16/fp16 with unit inner "
                         f"strides, got {tuple(x.shape)} and {tuple(weight.shape)}.")
    _check_norm(x, norm_weight, residual, residual_out)
    rows, k = x.shape
    n = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    block_n, block_k, warps, stages = tile or gemv_tile(n, k)
    norm_block = min(triton.next_power_of_2(k), NORM_MAX_BLOCK) if norm_weight is not None else 1
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)  # [M, N]
    launch(_gemv_kernel, (triton.cdiv(n, block_n),),
        x, _or(residual, x), _or(residual_out, x), _or(norm_weight, x), weight, _or(bias, weight), y,
        rows, n, k, x.stride(0), weight.stride(0), y.stride(0), eps, float(k),
        M_PAD=triton.next_power_of_2(rows), BLOCK_N=block_n, BLOCK_K=block_k, NORM_BLOCK=norm_block,
        HAS_BIAS=bias is not None, SILU_MUL=silu_mul, HAS_NORM=norm_weight is not None,
        HAS_RESIDUAL=residual is not None, num_warps=warps, num_stages=stages, pdl=True,
    )
    return y


def _or(t: Optional[torch.Tensor], dummy: torch.Tensor) -> torch.Tensor:
    """t, or a dummy for a pointer the kernel does not read."""
    return dummy if t is None else t
