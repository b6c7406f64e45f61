"""The attention layer: stores this step's K/V in the cache, then lets the step's backend attend."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from sglang.srt.model_executor.forward_batch_info import ForwardBatch


class Attention(nn.Module):
    def __init__(
        self,
        layer_id: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scaling: float,
        *,
        sliding_window: Optional[int] = None,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scaling = scaling
        # A query at position p attends keys at positions > p - sliding_window. The backends attend
        # to the whole sequence, which equals that while no sequence is longer than the window.
        self.sliding_window = sliding_window

    def forward(
        self, q: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor], forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """q [N, Hq, D]; k, v [N, Hk, D], or None where the caller has already stored this step's
        K/V in the cache -> [N, Hq * D]."""
        capturing = forward_batch.attention_split is not None  # piecewise graphs: no real sequences
        window = self.sliding_window
        if window is not None and not capturing and max(forward_batch.seq_lens_cpu) > window:
            raise NotImplementedError(
                f"Sliding-window attention over sequences longer than the window ({self.sliding_window})."
            )
        if k is not None:
            forward_batch.kv_cache.set_kv(self.layer_id, forward_batch.out_cache_loc, k, v)
        if forward_batch.attention_split is not None:  # capturing piecewise graphs: attention runs between them
            out = forward_batch.attention_split(self, q)  # [N, Hq, D]
        else:
            out = forward_batch.attn_backend.forward(q, self, forward_batch)  # [N, Hq, D]
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)
