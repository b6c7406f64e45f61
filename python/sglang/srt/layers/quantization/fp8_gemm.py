"""FP8 W8A8 GEMMs on CUDA, and the rule that picks one for a layer and a row count.

Two kernels:
- torch._scaled_mm (cuBLAS / CUTLASS) with row-wise scales (activations per token, the weight
  per output channel) or block-wise ones (activations per token and group of 128 columns, the
  weight per 128x128 block);
- the Triton kernel of sgl_kernel_ext/gemm/fp8_block_triton.py: activations per token and
  group of 128 columns, weight scales per 128x128 block or per output channel.

The rule (docs/models.md, "Quantisation"): block-scaled weights run the Triton kernel below
BLOCKWISE_SCALED_MM_MIN_ROWS rows and torch._scaled_mm from there on. Per-channel (and
per-tensor) weights run the Triton kernel up to
ROWWISE_TRITON_MAX_ROWS rows and torch._scaled_mm above, or the Triton kernel where
_scaled_mm cannot take the shape (K or N not a multiple of 16) or the model is not bf16. benchmark/gpu_fp8_check.py
times both on Qwen3-8B's shapes and reports the threshold its measurements give.
"""

from __future__ import annotations

from typing import Optional

import torch

from sgl_kernel_ext.gemm.fp8_reference import FP8_DTYPE, FP8_MAX, GROUP

# Per-channel FP8 weights: batches of at most this many rows go to the Triton kernel, larger
# ones to torch._scaled_mm (0: always _scaled_mm where the shape allows).
ROWWISE_TRITON_MAX_ROWS = 0
# Block-scaled weights: batches of at least this many rows go to torch._scaled_mm's block-wise
# scaling (cuBLAS), smaller ones to the Triton kernel.
BLOCKWISE_SCALED_MM_MIN_ROWS = 17
# torch._scaled_mm's operands: K and N multiples of 16; M is padded to a multiple of 16.
SCALED_MM_MULTIPLE = 16


def scaled_mm_applies(n: int, k: int) -> bool:
    return n % SCALED_MM_MULTIPLE == 0 and k % SCALED_MM_MULTIPLE == 0


def rowwise_backend(m: int, n: int, k: int, dtype: torch.dtype = torch.bfloat16) -> str:
    """"triton" or "scaled_mm" for an [M, K] x [K, N] GEMM with a per-channel weight, in a
    model of `dtype` (row-wise _scaled_mm writes bf16 only)."""
    if m <= ROWWISE_TRITON_MAX_ROWS or not scaled_mm_applies(n, k) or dtype != torch.bfloat16:
        return "triton"
    return "scaled_mm"


def quantize_input(
    x: torch.Tensor, group: int, padded_rows: int, input_scale: Optional[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> codes [P, K] fp8, scales [P, ceil(K / group)] float32 (P = padded_rows;
    padding rows are zeros): per row and group, or the checkpoint's static input_scale."""
    from sgl_kernel_ext.gemm.fp8_block_triton import quantize_rows_fp8

    if input_scale is None:
        return quantize_rows_fp8(x, group, padded_rows)
    m, k = x.shape
    codes = torch.zeros((padded_rows, k), dtype=FP8_DTYPE, device=x.device)  # [P, K]
    codes[:m] = (x.float() / input_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    groups = -(-k // group)
    return codes, input_scale.float().reshape(1, 1).expand(padded_rows, groups).contiguous()


def scaled_mm_rowwise(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, input_scale: Optional[torch.Tensor]
) -> torch.Tensor:
    """x [M, K] -> [M, N] in x's dtype through torch._scaled_mm: weight [N, K] fp8 with
    weight_scale [N], activations per token (or the static input_scale)."""
    m, k = x.shape
    padded = -(-m // SCALED_MM_MULTIPLE) * SCALED_MM_MULTIPLE
    codes, scales = quantize_input(x, k, padded, input_scale)  # [P, K], [P, 1]
    out = torch._scaled_mm(
        codes, weight.t(), scale_a=scales, scale_b=weight_scale.view(1, -1), out_dtype=x.dtype
    )  # [P, N]
    return out[:m]


def triton_fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    scale_block: tuple[int, int],
    input_scale: Optional[torch.Tensor],
) -> torch.Tensor:
    """x [M, K] -> [M, N] in x's dtype through the Triton kernel (weight_scale [ceil(N / bn),
    ceil(K / bk)] for scale_block (bn, bk))."""
    from sgl_kernel_ext.gemm.fp8_block_triton import fp8_block_matmul

    codes, scales = quantize_input(x, GROUP, x.shape[0], input_scale)
    return fp8_block_matmul(codes, scales, weight, weight_scale, scale_block, x.dtype)


def scaled_mm_blockwise_applies(m: int, n: int, k: int, scale_block: tuple[int, int], dtype: torch.dtype) -> bool:
    """torch._scaled_mm with 1x128 activation and 128x128 weight scales: bf16 models, batches
    of at least BLOCKWISE_SCALED_MM_MIN_ROWS rows, N and K multiples of 128."""
    return (m >= BLOCKWISE_SCALED_MM_MIN_ROWS and tuple(scale_block) == (GROUP, GROUP) and dtype == torch.bfloat16
            and n % GROUP == 0 and k % GROUP == 0)


def scaled_mm_blockwise(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] -> [M, N] bf16 through torch._scaled_mm: weight [N, K] fp8 with 128x128 block
    scales [N / 128, K / 128], activations per token and group of 128 columns."""
    from sgl_kernel_ext.gemm.fp8_block_triton import quantize_rows_fp8

    m = x.shape[0]
    padded = -(-m // SCALED_MM_MULTIPLE) * SCALED_MM_MULTIPLE
    codes, scales = quantize_rows_fp8(x, GROUP, padded)  # [P, K], [P, K / 128]
    out = torch._scaled_mm(codes, weight.t(), scale_a=scales.t().contiguous().t(), scale_b=weight_scale.t(),
                           out_dtype=x.dtype)  # [P, N]; cuBLAS takes both scales outer-dimension-major
    return out[:m]
