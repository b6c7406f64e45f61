"""RMSNorm (optionally fused with the residual add before it) as one Triton kernel for CUDA,
and `round_to`, the rounding helper the other fused layer kernels share.

One program per row: a row's statistics never depend on other rows, so the result is
batch-invariant, and the launch is capturable in a CUDA graph (no host reads). Numerics follow
the torch path (norm.reference.rmsnorm_reference): the residual sum is rounded to the model
dtype, mean(x^2) and the scaling are float32 (IEEE division and square root, so the only
difference from torch is the order of the row sum), the normalised value is rounded to the
model dtype, then multiplied by the weight and rounded again.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.triton_launch import launch, pdl_sync

# A row is held in registers as one block; wider rows (no current model) take the torch path.
MAX_HIDDEN = 32768
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """float32 x -> x rounded to nearest-even in DTYPE, kept in float32, so that a kernel
    rounds where torch's model-dtype ops round. bfloat16 is rounded with integer ops because
    the interpreter (TRITON_INTERPRET=1) truncates on a float32 -> bfloat16 cast; the GPU's
    cast of the already-rounded value is then exact either way."""
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
        return tl.where(x == x, rounded, x)  # NaN payloads could carry into the sign bit
    elif DTYPE == tl.float16:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x


@triton.jit
def _rmsnorm_kernel(
    x_ptr,  # [N, H]
    res_ptr,  # [N, H], read and rewritten when HAS_RESIDUAL
    w_ptr,  # [H]
    out_ptr,  # [N, H]
    stride_x,
    stride_res,
    stride_out,
    hidden,
    hidden_f,  # float(hidden): an int argument equal to 1 would be specialised to a constant
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    dtype = out_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    live = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=live, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + row * stride_res + cols, mask=live, other=0.0).to(tl.float32)
        x = round_to(x + res, dtype)  # torch adds two model-dtype tensors with one rounding
        tl.store(res_ptr + row * stride_res + cols, x.to(dtype), mask=live)
    mean_sq = tl.math.div_rn(tl.sum(x * x, axis=0), hidden_f)
    # IEEE square root and division: Triton's plain `/` is approximate on the GPU.
    rstd = tl.math.div_rn(1.0, tl.sqrt_rn(mean_sq + eps))
    w = tl.load(w_ptr + cols, mask=live, other=0.0).to(tl.float32)
    out = round_to(round_to(x * rstd, dtype) * w, dtype)
    tl.store(out_ptr + row * stride_out + cols, out.to(dtype), mask=live)


def rmsnorm_triton_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel takes these tensors: CUDA, float dtypes, x with unit stride along the
    last dimension, contiguous weight [H], H at most MAX_HIDDEN."""
    return (
        x.is_cuda
        and x.dtype in DTYPES
        and weight.dtype in DTYPES
        and x.dim() >= 1
        and x.stride(-1) == 1
        and weight.shape == (x.shape[-1],)
        and weight.is_contiguous()
        and 0 < x.shape[-1] <= MAX_HIDDEN
    )


def rmsnorm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """x [..., H] -> RMSNorm(x) * weight in x's dtype. With `residual` (x's shape and dtype,
    contiguous), residual <- x + residual in place and the sum is normalised instead."""
    hidden = x.shape[-1]
    if weight.shape != (hidden,) or not weight.is_contiguous() or x.stride(-1) != 1 or not 0 < hidden <= MAX_HIDDEN:
        raise ValueError(f"rmsnorm_triton takes x [..., H] (unit last stride, 0 < H <= {MAX_HIDDEN}), weight [H].")
    bad_residual = residual is not None and (
        residual.shape != x.shape or residual.dtype != x.dtype or not residual.is_contiguous()
    )
    if bad_residual:
        raise ValueError("residual must be a contiguous tensor of x's shape and dtype.")
    x2d = x.reshape(-1, hidden)  # [N, H], a view unless x's leading dimensions are strided
    res2d = x2d if residual is None else residual.view(-1, hidden)  # [N, H]; not read without residual
    out = torch.empty(x2d.shape, dtype=x.dtype, device=x.device)  # [N, H]
    if out.shape[0]:
        block = triton.next_power_of_2(hidden)
        launch(_rmsnorm_kernel, (out.shape[0],),
            x2d, res2d, weight, out, x2d.stride(0), res2d.stride(0), out.stride(0), hidden, float(hidden), eps,
            HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=_num_warps(block), pdl=True,
        )
    return out.view(x.shape)


def _num_warps(block: int) -> int:
    # About 8 values per thread: enough loads in flight without spilling wide rows.
    return max(1, min(16, block // 256))
