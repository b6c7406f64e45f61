"""A grammar's packed vocab bitmask applied to logits: the plain-torch definition and the CPU C
kernel (bitmask_cpu.c). Layout (xgrammar's and llguidance's): [B, ceil(V / 32)] int32, bit
`t % 32` of word `t // 32` set when token t is allowed; tokens past 32 * W are masked."""

from __future__ import annotations

import ctypes
from typing import Optional

import torch

from sgl_kernel_ext.cpu_build import I64, PTR, load_kernel

# (source, C function, argument types, result type).
_KERNEL = ("sampling/bitmask_cpu.c", "apply_token_bitmask_f32", (PTR, PTR, I64, I64, I64, I64, ctypes.c_int), None)


def _kernel() -> Optional[ctypes._CFuncPtr]:
    return load_kernel(*_KERNEL)


def apply_token_bitmask_reference(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place: logits [B, V] float get -inf wherever bitmask [B, W] int32 has a 0 bit."""
    batch, vocab = logits.shape
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)  # [32]
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().reshape(batch, -1)  # [B, 32 W]
    if allowed.shape[1] < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]), value=False)
    logits.masked_fill_(~allowed[:, :vocab], float("-inf"))


def apply_token_bitmask_cpu_applies(logits: torch.Tensor, bitmask: torch.Tensor) -> bool:
    """Whether the C kernel takes these tensors (float32 CPU logits with unit column stride, a
    contiguous int32 CPU bitmask of the same rows) and could be built."""
    return (
        logits.device.type == "cpu"
        and logits.dtype == torch.float32
        and logits.dim() == 2
        and logits.stride(1) == 1
        and bitmask.device.type == "cpu"
        and bitmask.dtype == torch.int32
        and bitmask.is_contiguous()
        and bitmask.shape[0] == logits.shape[0]
        and _kernel() is not None
    )


def apply_token_bitmask_cpu(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """apply_token_bitmask_reference with the C kernel (see apply_token_bitmask_cpu_applies)."""
    if not apply_token_bitmask_cpu_applies(logits, bitmask):
        raise ValueError("apply_token_bitmask_cpu takes float32 CPU logits [B, V] and a contiguous int32 CPU bitmask [B, W].")
    rows, vocab = logits.shape
    _kernel()(logits.data_ptr(), bitmask.data_ptr(), rows, vocab, logits.stride(0), bitmask.shape[1], torch.get_num_threads())
