"""Plain-torch reference of gemv_triton: the matmul in float32, rounded once to the model dtype
(where the library GEMM rounds), and the fused activation with silu_mul_reference's rounding."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sgl_kernel_ext.activation.reference import silu_mul_reference


def gemv_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *, silu_mul: bool = False
) -> torch.Tensor:
    """x [M, K] @ weight [N_W, K]^T (+ bias) -> [M, N_W] in x's dtype; with silu_mul, silu(gate) *
    up [M, N_W / 2] of the gate | up halves."""
    y = F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)  # [M, N_W]
    return silu_mul_reference(y) if silu_mul else y
