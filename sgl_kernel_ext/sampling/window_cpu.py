"""The CPU sampler's thresholds and inverse-CDF draw on a descending top-W window with the C
kernels in window_cpu.c: the same values (NaN payloads and zero signs aside) as the torch code they replace
(support._support_in_torch and sampling_ops.inverse_cdf_draw_torch, their references), in two
calls instead of ~60 small ops."""

from __future__ import annotations

import ctypes
from typing import Optional

import torch

from sgl_kernel_ext.cpu_build import I64, PTR, load_kernel

_SOURCE = "sampling/window_cpu.c"
# (source, C function, argument types, result type)
_THRESHOLDS = (_SOURCE, "window_thresholds_f32", (PTR, PTR, I64, I64, I64, PTR, PTR, PTR, PTR, PTR), None)
_DRAW = (_SOURCE, "window_draw_f32", (PTR, PTR, PTR, PTR, I64, I64, PTR), None)


def _thresholds_kernel() -> Optional[ctypes._CFuncPtr]:
    return load_kernel(*_THRESHOLDS)


def _draw_kernel() -> Optional[ctypes._CFuncPtr]:
    return load_kernel(*_DRAW)


def window_cpu_applies(vals: torch.Tensor) -> bool:
    """CPU float32 [B, W] values and a built kernel."""
    return vals.device.type == "cpu" and vals.dtype == torch.float32 and vals.dim() == 2 and _draw_kernel() is not None


def _row_param(t: Optional[torch.Tensor], dtype: torch.dtype, rows: int) -> Optional[torch.Tensor]:
    if t is None:
        return None
    t = t.to(dtype).contiguous()
    if t.shape != (rows,):
        raise ValueError(f"per-row parameters must have shape [{rows}], got {list(t.shape)}.")
    return t


def _ptr(t: Optional[torch.Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def window_thresholds_cpu(
    vals: torch.Tensor,
    probs: Optional[torch.Tensor],
    vocab: int,
    top_ks: torch.Tensor,
    top_ps: Optional[torch.Tensor],
    log_min_ps: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """vals [B, W] descending; probs [B, W] float32 full-softmax mass at the window's columns (with
    top_ps), top_ks [B], top_ps [B] or None (no top-p), log_min_ps [B] or None (no min-p).
    -> (threshold [B, 1] float32, exact [B] bool), as support._support_in_torch."""
    rows, width = vals.shape
    vals = vals.contiguous()
    top_ks = _row_param(top_ks, torch.int32, rows)
    top_ps, log_min_ps = _row_param(top_ps, torch.float32, rows), _row_param(log_min_ps, torch.float32, rows)
    if top_ps is not None:
        probs = probs.to(torch.float32).contiguous()
        if probs.shape != vals.shape:
            raise ValueError("probs must have the window's shape.")
    threshold = torch.empty(rows, 1, dtype=torch.float32)
    exact = torch.empty(rows, dtype=torch.bool)
    _thresholds_kernel()(
        vals.data_ptr(), _ptr(probs if top_ps is not None else None), rows, width, vocab, top_ks.data_ptr(), _ptr(top_ps),
        _ptr(log_min_ps), threshold.data_ptr(), exact.data_ptr(),
    )
    return threshold, exact


def window_draw_cpu(values: torch.Tensor, threshold: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """values [B, N] float32, threshold [B, 1], u [B, 1] in (0, 1] -> column [B] int64, as
    sampling_ops.inverse_cdf_draw_torch. The weights exp(v - row max) are torch's (its exp sets
    their bits); the masking, running sums and search are here."""
    rows, width = values.shape
    values = values.contiguous()
    weights = torch.exp(values - values.amax(dim=-1, keepdim=True)).contiguous()  # [B, N]
    threshold = threshold.to(torch.float32).reshape(rows).contiguous()
    u = u.to(torch.float32).reshape(rows).contiguous()
    col = torch.empty(rows, dtype=torch.int64)
    _draw_kernel()(values.data_ptr(), weights.data_ptr(), threshold.data_ptr(), u.data_ptr(), rows, width, col.data_ptr())
    return col
