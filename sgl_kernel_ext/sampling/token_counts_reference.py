"""Plain-torch reference of sgl_kernel_ext.sampling.token_counts (and the CPU path): no Triton."""

from __future__ import annotations

import torch


def token_counts_add_reference(
    ids: torch.Tensor, counts: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor, width: int
) -> None:
    """What the kernel computes, in plain torch (the CPU path)."""
    tok = tokens.to(dtype=torch.int64).reshape(-1, 1)  # [B, 1]
    valid = tok >= 0  # [B, 1]; also keeps -1 from matching the -1 padding
    match = (ids[:, :width] == tok) & valid  # [B, width]
    counts[:, :width].add_(match)
    is_new = valid & ~match.any(dim=1, keepdim=True)  # [B, 1]
    # Rows without a new token write -1/0 into their first free slot, which already holds that.
    ids.scatter_(1, lengths, torch.where(is_new, tok, -1))
    counts.scatter_(1, lengths, is_new.to(torch.float32))
    lengths.add_(is_new)
