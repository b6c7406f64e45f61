"""RMSNorm (optionally fused with the residual add before it) on CPU with the C kernel in
rmsnorm_cpu.c, and its plain-torch reference."""

from __future__ import annotations

import ctypes
from typing import Optional

import torch

from sgl_kernel_ext.cpu_build import I64, PTR, load_kernel

_ARGTYPES = (PTR, PTR, PTR, PTR, ctypes.c_float, I64, I64, PTR, ctypes.c_int)


# (source, C function, argument types, result type): also built with -DPORTABLE_ONLY by the tests.
_KERNEL = ("norm/rmsnorm_cpu.c", "rmsnorm_f32", _ARGTYPES, None)


def _kernel() -> Optional[ctypes._CFuncPtr]:
    return load_kernel(*_KERNEL)


def rmsnorm_cpu_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel takes these tensors (float32, CPU, contiguous rows) and could be built."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.is_contiguous()
        and x.shape[-1] == weight.shape[0]
        and _kernel() is not None
    )


def rmsnorm_cpu(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """x [..., H] -> RMSNorm(x) * weight; with `residual` (same shape, contiguous, updated in
    place to residual + x) -> RMSNorm(residual + x) * weight."""
    if not rmsnorm_cpu_applies(x, weight):
        raise ValueError("rmsnorm_cpu takes contiguous float32 CPU x and weight of x's last size.")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype or not residual.is_contiguous()):
        raise ValueError("residual must be a contiguous tensor of x's shape and dtype.")
    hidden = x.shape[-1]
    out = torch.empty_like(x)
    res_ptr = None if residual is None else residual.data_ptr()
    _kernel()(
        x.data_ptr(), res_ptr, res_ptr, weight.contiguous().data_ptr(), eps, x.numel() // max(hidden, 1), hidden,
        out.data_ptr(), torch.get_num_threads(),
    )
    return out


def rmsnorm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """The same function in plain torch, as transformers' LlamaRMSNorm computes it."""
    if residual is not None:
        residual.add_(x)
        x = residual
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + eps)).to(x.dtype) * weight
