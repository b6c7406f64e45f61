"""Plain-torch reference of gemv_triton: the optional RMSNorm before it as rmsnorm_reference
computes it, the matmul in float32, rounded once to the model dtype (where the library GEMM
rounds), and the fused activation with silu_mul_reference's rounding."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sgl_kernel_ext.activation.reference import silu_mul_reference
from sgl_kernel_ext.norm.reference import rmsnorm_reference


def gemv_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    silu_mul: bool = False,
    norm_weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    residual: Optional[torch.Tensor] = None,
    residual_out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """x [M, K] @ weight [N_W, K]^T (+ bias) -> [M, N_W] in x's dtype; with silu_mul, silu(gate) *
    up [M, N_W / 2] of the gate | up halves. With norm_weight [K], the matmul takes the RMSNorm of
    x + residual (of x without residual), the sum written to residual_out."""
    if norm_weight is not None:
        if residual is not None:
            residual_out.copy_(residual)
        x = rmsnorm_reference(x, norm_weight, eps, None if residual is None else residual_out)  # [M, K]
    y = F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)  # [M, N_W]
    return silu_mul_reference(y) if silu_mul else y
