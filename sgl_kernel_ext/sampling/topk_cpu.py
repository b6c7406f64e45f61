"""The k largest values of each row on CPU with the C kernel in topk_cpu.c (descending; NaN
first; among equal values the lower column first), and its plain-torch reference."""

from __future__ import annotations

import ctypes
from typing import Optional

import torch

from sgl_kernel_ext.cpu_build import I64, PTR, load_kernel

# (source, C function, argument types, result type): also built with -DPORTABLE_ONLY by the tests.
_KERNEL = ("sampling/topk_cpu.c", "topk_f32", (PTR, I64, I64, I64, PTR, PTR, ctypes.c_int), None)


def _kernel() -> Optional[ctypes._CFuncPtr]:
    return load_kernel(*_KERNEL)


def topk_cpu_applies(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and _kernel() is not None


def topk_cpu(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, N] float32 CPU -> (values [B, k] float32, indices [B, k] int64), as topk_reference."""
    if not topk_cpu_applies(x) or not 1 <= k <= x.shape[1]:
        raise ValueError("topk_cpu takes a float32 CPU tensor [B, N] and 1 <= k <= N.")
    x = x.contiguous()
    rows = x.shape[0]
    vals = torch.empty(rows, k, dtype=torch.float32)
    idx = torch.empty(rows, k, dtype=torch.int64)
    _kernel()(x.data_ptr(), rows, x.shape[1], k, vals.data_ptr(), idx.data_ptr(), torch.get_num_threads())
    return vals, idx


def topk_reference(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A stable descending sort (NaN first, ties by column), cut to k."""
    vals, idx = torch.sort(x, dim=-1, descending=True, stable=True)
    return vals[:, :k], idx[:, :k]
