"""Plain-torch reference of the one-shot all-reduce: every rank's tensor added in rank order,
in float32, rounded once to the input dtype (the kernel's arithmetic), so every rank holds the
same bits whatever the batch size."""

from __future__ import annotations

import torch


def rank_ordered_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """parts: one tensor per rank (same shape and dtype) -> their sum, added rank 0 first."""
    total = parts[0].float()
    for part in parts[1:]:
        total = total + part.float()
    return total.to(parts[0].dtype)
