"""Plain-torch reference for the activation kernels: the model's torch path (LlamaMLP)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [N, 2I] (gate | up) -> silu(gate) * up [N, I] in gate_up's dtype: silu rounded to
    the model dtype, then the product rounded again."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)
