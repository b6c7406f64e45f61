"""FP8 (e4m3) W8A8 linear layers in plain torch: the reference the kernels are checked against.

A weight is FP8 codes [N, K] and float32 scales in one of two layouts:
- rows: scale [N], W[n, k] = scale[n] * code[n, k] (per-channel; a per-tensor scale is one value
  repeated over the rows);
- blocks: scale [ceil(N / bn), ceil(K / bk)], W[n, k] = scale[n // bn, k // bk] * code[n, k]
  (the 128x128 `weight_scale_inv` of DeepSeek-V3 / Qwen3-FP8 checkpoints).
Activations are quantised per row, in groups of `group` columns (one scale per row and group;
group >= K: one scale per token), or with one static scale.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
# Smallest scale: a row of zeros quantises to zeros instead of dividing by zero.
MIN_SCALE = 1e-12
# Activation columns per scale in the block-scaled W8A8 linear (the Triton kernel's K tile).
GROUP = 128


def quantize_rows_reference(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> codes [M, K] fp8, scales [M, ceil(K / group)] float32 (max |x| / 448 per group)."""
    m, k = x.shape
    groups = math.ceil(k / group)
    padded = torch.zeros(m, groups * group, dtype=torch.float32, device=x.device)
    padded[:, :k] = x.float()
    blocks = padded.view(m, groups, group)  # [M, G, group]
    scales = (blocks.abs().amax(dim=-1) / FP8_MAX).clamp(min=MIN_SCALE)  # [M, G]
    codes = (blocks / scales[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return codes.view(m, -1)[:, :k].contiguous(), scales


def quantize_static_reference(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] with one activation scale (a checkpoint's `input_scale`) -> codes [M, K] fp8."""
    return (x.float() / scale.float()).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def quantize_weight_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> codes [N, K] fp8, scale [N] float32: per output channel."""
    codes, scales = quantize_rows_reference(weight, weight.shape[1])
    return codes, scales[:, 0].contiguous()


def quantize_weight_blocks(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> codes [N, K] fp8, scale [ceil(N / bn), ceil(K / bk)] float32."""
    bn, bk = block
    n, k = weight.shape
    rows, cols = math.ceil(n / bn), math.ceil(k / bk)
    padded = torch.zeros(rows * bn, cols * bk, dtype=torch.float32, device=weight.device)
    padded[:n, :k] = weight.float()
    tiles = padded.view(rows, bn, cols, bk)
    scale = (tiles.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=MIN_SCALE)  # [rows, cols]
    codes = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return codes.view(rows * bn, cols * bk)[:n, :k].contiguous(), scale


def expand_scale(scale: torch.Tensor, shape: tuple[int, int], block: Optional[tuple[int, int]]) -> torch.Tensor:
    """The scale of every element of a [N, K] weight: [N, K] float32."""
    n, k = shape
    if block is None:
        return scale.float().reshape(n, 1).expand(n, k)
    bn, bk = block
    return scale.float().repeat_interleave(bn, 0).repeat_interleave(bk, 1)[:n, :k]


def dequantize_weight(
    codes: torch.Tensor, scale: torch.Tensor, block: Optional[tuple[int, int]], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """codes [N, K] fp8 -> W [N, K] in `dtype` (products taken in float32)."""
    return (codes.float() * expand_scale(scale, tuple(codes.shape), block)).to(dtype)


def fp8_linear_reference(
    x: torch.Tensor,
    codes: torch.Tensor,
    scale: torch.Tensor,
    block: Optional[tuple[int, int]],
    group: int,
    bias: Optional[torch.Tensor] = None,
    input_scale: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """x [M, K] -> [M, N] in x's dtype: x quantised (per group, or with the static input_scale)
    and dequantised, times the dequantised weight, in float32."""
    if input_scale is None:
        x_codes, x_scales = quantize_rows_reference(x, group)
        x_dq = x_codes.float() * x_scales.repeat_interleave(group, 1)[:, : x.shape[1]]
    else:
        x_dq = quantize_static_reference(x, input_scale).float() * input_scale.float()
    out = x_dq @ dequantize_weight(codes, scale, block).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
