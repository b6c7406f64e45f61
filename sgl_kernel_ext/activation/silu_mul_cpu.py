"""SiLU(gate) * up on CPU with the C kernel in silu_mul_cpu.c: the MLP activation of the
int8-activation mode (--cpu-int8-activations), whose whole decode step runs in C. The exact
mode keeps torch's SiLU (reference.silu_mul_reference), whose bits the C exp does not reproduce."""

from __future__ import annotations

import ctypes
from typing import Optional

import torch

from sgl_kernel_ext.cpu_build import I64, PTR, load_kernel

# (source, C function, argument types, result type): also built with -DPORTABLE_ONLY by the tests.
_KERNEL = ("activation/silu_mul_cpu.c", "silu_mul_f32", (PTR, I64, I64, PTR, ctypes.c_int), None)


def _kernel() -> Optional[ctypes._CFuncPtr]:
    return load_kernel(*_KERNEL)


def silu_mul_cpu_available() -> bool:
    return _kernel() is not None


def silu_mul_cpu(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [N, 2I] float32 CPU (gate | up) -> SiLU(gate) * up [N, I]."""
    if gate_up.dtype != torch.float32 or gate_up.device.type != "cpu" or gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError("silu_mul_cpu takes a float32 CPU tensor [N, 2I].")
    gate_up = gate_up.contiguous()
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    act = torch.empty(rows, inter, dtype=torch.float32)
    _kernel()(gate_up.data_ptr(), rows, inter, act.data_ptr(), torch.get_num_threads())
    return act
