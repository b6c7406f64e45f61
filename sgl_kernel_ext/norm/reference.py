"""Plain-torch references for the norm kernels: the exact math of the model's torch path
(python/sglang/srt/layers/layernorm.py), against which the kernels are tested."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def rmsnorm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """x [..., H] -> RMSNorm(x) * weight in x's dtype. With `residual` (x's shape and dtype),
    residual <- x + residual in place and the sum is normalised instead.

    The sum is rounded to the model dtype, the statistics are float32, the normalised value is
    rounded to the model dtype and then multiplied by the weight in the model dtype (as
    transformers' LlamaRMSNorm does)."""
    if residual is not None:
        residual.copy_(x + residual)
        x = residual
    return F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype).mul_(weight)
