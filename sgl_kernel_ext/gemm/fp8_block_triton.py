"""FP8 W8A8 linear layers as Triton kernels: activations quantised per token and group of 128
columns, times FP8 weights with block scales (128x128, or one scale per output row).

Two launches per linear: `quantize_rows_fp8` (codes and one float32 scale per row and group),
then `fp8_block_matmul`, which takes one K tile of 128 columns at a time and scales its partial
product by the tile's activation scale and weight scale before accumulating in float32. No
host synchronisation, so both run inside CUDA graphs. The numbers follow
fp8_reference.fp8_linear_reference (the tests compare them).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.gemm.fp8_reference import FP8_DTYPE, FP8_MAX, GROUP, MIN_SCALE
from sgl_kernel_ext.triton_launch import launch, pdl_sync

QUANT_CHUNK = 1024  # columns a quantisation program reads at a time


@triton.jit
def _quantize_rows_kernel(
    x_ptr,  # [M, K]
    codes_ptr,  # [M_padded, K] fp8
    scales_ptr,  # [M_padded, G] float32
    rows,
    cols,
    stride_x,
    stride_codes,
    stride_scales,
    group,
    FMAX: tl.constexpr,
    SMIN: tl.constexpr,
    CHUNK: tl.constexpr,
    PDL: tl.constexpr,
):
    """One program per (row, group): max |x| / 448 over the group, then the codes. Rows past
    `rows` (padding) get zero codes and the smallest scale."""
    pdl_sync(PDL)
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    start = g * group
    live_row = (row + tl.zeros((CHUNK,), dtype=tl.int64)) < rows  # [CHUNK], all one value
    amax = tl.zeros((CHUNK,), dtype=tl.float32)
    for offset in range(0, group, CHUNK):
        c = start + offset + tl.arange(0, CHUNK)
        mask = live_row & (c < cols) & (c < start + group)
        x = tl.load(x_ptr + row * stride_x + c, mask=mask, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, axis=0) / FMAX, SMIN)
    tl.store(scales_ptr + row * stride_scales + g, scale)
    for offset in range(0, group, CHUNK):
        c = start + offset + tl.arange(0, CHUNK)
        mask = live_row & (c < cols) & (c < start + group)
        x = tl.load(x_ptr + row * stride_x + c, mask=mask, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(x / scale, -FMAX), FMAX)
        tl.store(codes_ptr + row * stride_codes + c, q.to(codes_ptr.dtype.element_ty), mask=(c < cols) & (c < start + group))


def quantize_rows_fp8(x: torch.Tensor, group: int, padded_rows: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (unit column stride) -> codes [P, K] fp8, scales [P, ceil(K / group)] float32,
    P = padded_rows or M; rows past M are zeros."""
    m, k = x.shape
    p = m if padded_rows is None else padded_rows
    groups = triton.cdiv(k, group)
    codes = torch.empty((p, k), dtype=FP8_DTYPE, device=x.device)  # [P, K]
    scales = torch.empty((p, groups), dtype=torch.float32, device=x.device)  # [P, G]
    if p and k:
        chunk = min(QUANT_CHUNK, triton.next_power_of_2(group))
        launch(_quantize_rows_kernel, (p, groups), x, codes, scales, m, k, x.stride(0), codes.stride(0),
               scales.stride(0), group, FMAX=FP8_MAX, SMIN=MIN_SCALE, CHUNK=chunk, num_warps=4, pdl=True)
    return codes, scales


@triton.jit
def _fp8_block_matmul_kernel(
    a_ptr,  # [M, K] fp8 activations
    a_scale_ptr,  # [M, ceil(K / BLOCK_K)] float32
    b_ptr,  # [N, K] fp8 weight
    b_scale_ptr,  # [ceil(N / SCALE_N), ceil(K / SCALE_K)] float32
    bias_ptr,  # [N]
    c_ptr,  # [M, N]
    M,
    N,
    K,
    stride_a,
    stride_a_scale,
    stride_b,
    stride_b_scale,
    stride_c,
    SCALE_N: tl.constexpr,
    SCALE_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    live_m, live_n = offs_m < M, offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        k = kt * BLOCK_K + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_a + k[None, :], mask=live_m[:, None] & (k[None, :] < K), other=0.0)
        b = tl.load(b_ptr + offs_n[None, :] * stride_b + k[:, None], mask=live_n[None, :] & (k[:, None] < K), other=0.0)
        a_s = tl.load(a_scale_ptr + offs_m * stride_a_scale + kt, mask=live_m, other=0.0)  # [BLOCK_M]
        b_s = tl.load(b_scale_ptr + (offs_n // SCALE_N) * stride_b_scale + (kt * BLOCK_K) // SCALE_K,
                      mask=live_n, other=0.0)  # [BLOCK_N]
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=live_n, other=0.0).to(tl.float32)[None, :]
    c = c_ptr + offs_m[:, None] * stride_c + offs_n[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=live_m[:, None] & live_n[None, :])


def _tiles(m: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) by row count: narrow N tiles for decode-sized
    batches, so that the grid still covers the GPU."""
    if m <= 16:
        return 16, 32, 4, 4
    if m <= 64:
        return 32, 64, 4, 4
    return 64, 128, 8, 3


def fp8_block_matmul(
    codes: torch.Tensor,
    scales: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    scale_block: tuple[int, int],
    out_dtype: torch.dtype,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """codes [M, K] fp8 with scales [M, ceil(K / 128)] (quantize_rows_fp8, group 128), weight
    [N, K] fp8 with weight_scale [ceil(N / bn), ceil(K / bk)] for scale_block (bn, bk), bk a
    multiple of 128 -> [M, N] in out_dtype."""
    m, k = codes.shape
    n = weight.shape[0]
    bn, bk = scale_block
    if bk % GROUP:
        raise ValueError(f"fp8_block_matmul needs weight-scale blocks of a multiple of {GROUP} columns, got {bk}.")
    out = torch.empty((m, n), dtype=out_dtype, device=codes.device)  # [M, N]
    if m == 0 or n == 0:
        return out
    block_m, block_n, warps, stages = _tiles(m)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    launch(
        _fp8_block_matmul_kernel, grid, codes, scales, weight, weight_scale, out if bias is None else bias, out,
        m, n, k, codes.stride(0), scales.stride(0), weight.stride(0), weight_scale.stride(0), out.stride(0),
        SCALE_N=bn, SCALE_K=bk, HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=GROUP,
        num_warps=warps, num_stages=stages, pdl=True,
    )
    return out


def fp8_linear_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    scale_block: tuple[int, int],
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """x [M, K] -> x W^T (+ bias) [M, N] in x's dtype; W = fp8 weight [N, K] x weight_scale
    in blocks of scale_block (per output row: (1, K rounded up to 128))."""
    codes, scales = quantize_rows_fp8(x, GROUP)
    return fp8_block_matmul(codes, scales, weight, weight_scale, scale_block, x.dtype, bias)

