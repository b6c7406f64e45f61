"""The RMSNorms of Qwen3-Next: zero-centred (the weight is stored as w, applied as 1 + w) and the
gated form after Gated DeltaNet (normalise, weight, times SiLU of a gate)."""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers.batch_invariant import pointwise
from sglang.srt.layers.linear import default_weight_loader, make_param


class ZeroCenteredRMSNorm(nn.Module):
    """x / rms(x) * (1 + w), in float32, cast back to x's dtype."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, params_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.eps = eps
        self.weight = make_param((hidden_size,), params_dtype, default_weight_loader)

    def forward(
        self, x: torch.Tensor, residual: Optional[torch.Tensor] = None
    ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x [..., H]. With `residual`, normalises x + residual and also returns that sum as the
        next residual."""
        if residual is not None:
            x = x + residual
            residual = x
        out = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).mul_(1.0 + self.weight.float()).to(x.dtype)
        return out if residual is None else (out, residual)


class GatedRMSNorm(nn.Module):
    """x / rms(x) * w (w applied in x's dtype) * silu(gate), over the last dim."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, params_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.eps = eps
        self.weight = make_param((hidden_size,), params_dtype, default_weight_loader)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x, gate [..., D] -> [..., D] in x's dtype."""
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype) * self.weight
        return (normed.float() * pointwise(F.silu, gate.float())).to(x.dtype)
