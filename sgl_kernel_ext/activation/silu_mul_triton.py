"""The MLP activation silu(gate) * up of the fused gate/up projection as one Triton kernel for
CUDA, writing [N, I] without the torch path's temporaries.

Elementwise, so batch-invariant and capturable in a CUDA graph. Numerics follow the torch path
(activation.reference.silu_mul_reference): silu in float32, rounded to the model dtype, times
up, rounded again.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.triton_launch import launch, pdl_sync

from sgl_kernel_ext.norm.rmsnorm_triton import DTYPES, round_to

BLOCK = 1024


@triton.jit
def _silu_mul_kernel(
    gate_up_ptr,  # [N, 2I]
    out_ptr,  # [N, I]
    stride_gate_up,
    stride_out,
    inter,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    dtype = out_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = cols < inter
    gate_row = gate_up_ptr + row * stride_gate_up
    gate = tl.load(gate_row + cols, mask=live, other=0.0).to(tl.float32)
    up = tl.load(gate_row + inter + cols, mask=live, other=0.0).to(tl.float32)
    silu = round_to(gate / (1.0 + tl.exp(-gate)), dtype)  # torch's formula; -> -0 as gate -> -inf
    tl.store(out_ptr + row * stride_out + cols, round_to(silu * up, dtype).to(dtype), mask=live)


def silu_mul_triton_applies(gate_up: torch.Tensor) -> bool:
    """Whether the kernel takes this tensor: CUDA, a float dtype, [N, 2I] with unit column stride."""
    return (
        gate_up.is_cuda
        and gate_up.dtype in DTYPES
        and gate_up.dim() == 2
        and gate_up.shape[1] % 2 == 0
        and gate_up.stride(1) == 1
    )


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [N, 2I] (gate | up, unit column stride) -> silu(gate) * up [N, I] in its dtype."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.stride(1) != 1:
        raise ValueError(f"silu_mul_triton takes [N, 2I] with unit column stride, got {tuple(gate_up.shape)}.")
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((rows, inter), dtype=gate_up.dtype, device=gate_up.device)  # [N, I]
    if rows and inter:
        grid = (rows, triton.cdiv(inter, BLOCK))
        launch(_silu_mul_kernel, grid, gate_up, out, gate_up.stride(0), out.stride(0), inter, BLOCK=BLOCK, num_warps=4,
               pdl=True)
    return out
