"""RMSNorm, optionally fused with the residual add that precedes it."""

from __future__ import annotations

from types import ModuleType
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from sgl_kernel_ext.norm.rmsnorm_cpu import rmsnorm_cpu, rmsnorm_cpu_applies
from sglang.srt.layers.linear import ColumnParallelLinear, default_weight_loader, linear_gemv, make_param
from sglang.srt.layers.triton_kernels import triton_kernels


class RMSNorm(nn.Module):
    """unit_offset: the checkpoint stores w - 1 (Gemma), so the normalised x is scaled by (1 + w),
    in float32 before the cast back, as Gemma's reference does."""

    def __init__(
        self, hidden_size: int, eps: float = 1e-6, *, params_dtype: torch.dtype = torch.float32,
        unit_offset: bool = False,
    ) -> None:
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset
        self.weight = make_param((hidden_size,), params_dtype, default_weight_loader)

    def forward(
        self, x: torch.Tensor, residual: Optional[torch.Tensor] = None
    ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x [..., H]. With `residual`, normalises x + residual and also returns that sum as the
        next residual."""
        if self.unit_offset:
            return self._forward_unit_offset(x, residual)
        if rmsnorm_cpu_applies(x, self.weight) and (residual is None or residual.is_contiguous()):
            # One C call on CPU; the sum is written into `residual`, which nothing else holds.
            out = rmsnorm_cpu(x, self.weight, self.eps, residual)
            return out if residual is None else (out, residual)
        if x.is_cuda and _triton_takes(x, self.weight, residual):
            # One launch instead of ~6 (add, casts, norm, weight); the sum goes into `residual` as on CPU.
            out = triton_rmsnorm().rmsnorm_triton(x, self.weight, self.eps, residual)
            return out if residual is None else (out, residual)
        if residual is not None:
            x = x + residual
            residual = x
        # Normalised in float32, weight applied in the model dtype, as transformers does.
        # In place: normed is always a fresh tensor.
        out = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype).mul_(self.weight)
        return out if residual is None else (out, residual)

    def fused_linear(
        self, linear: ColumnParallelLinear, x: torch.Tensor, residual: Optional[torch.Tensor], silu_mul: bool = False
    ) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """This norm and the column-parallel linear after it in one skinny-matmul launch, the norm
        and its residual add in the matmul's prologue (gemv_triton's norm) -> (linear(norm(x +
        residual)) [N, out], x + residual [N, H]); without residual, x is normed and returned as the
        residual. With silu_mul, linear is gate | up and the first result silu(gate) * up
        [N, out / 2]. None where that kernel does not take these (then the caller runs the norm and
        the linear): a CUDA decode batch of a few rows (linear_gemv), no unit offset, a weight of
        x's dtype."""
        gemv = None if self.unit_offset else linear_gemv(linear, x, silu_mul)
        if gemv is None or not gemv.gemv_norm_takes(x, self.weight, residual):
            return None
        # A new tensor, not `residual` in place: every program of the launch reads all of it.
        residual_out = None if residual is None else torch.empty_like(residual)  # [N, H]
        out = gemv.gemv_triton(x, linear.weight, linear.bias, silu_mul=silu_mul, norm_weight=self.weight,
                               eps=self.eps, residual=residual, residual_out=residual_out)
        return out, x if residual_out is None else residual_out

    def _forward_unit_offset(
        self, x: torch.Tensor, residual: Optional[torch.Tensor]
    ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        if residual is not None:
            x = x + residual
            residual = x
        scale = 1.0 + self.weight.float()  # [H] float32
        out = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).mul_(scale).to(x.dtype)
        return out if residual is None else (out, residual)


def _triton_takes(x: torch.Tensor, weight: torch.Tensor, residual: Optional[torch.Tensor]) -> bool:
    kernel = triton_rmsnorm()
    return (
        kernel is not None
        and kernel.rmsnorm_triton_applies(x, weight)
        and (residual is None or (residual.is_contiguous() and residual.shape == x.shape and residual.dtype == x.dtype))
    )


def triton_rmsnorm() -> Optional[ModuleType]:
    return triton_kernels("norm.rmsnorm_triton")
