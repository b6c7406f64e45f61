"""The attention layer: stores this step's K/V in the cache, then lets the step's backend attend."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from sglang.srt.model_executor.forward_batch_info import ForwardBatch


class Attention(nn.Module):
    """sliding_window=W: a query at position p attends to keys at positions > p - W (the last W
    positions, itself included); None attends to every earlier position. logit_cap=c: scores
    become c * tanh(scores / c) before the softmax. v_head_dim < head_dim (MLA): the values are
    the first v_head_dim entries of each key row (the cache holds one latent row per token,
    attended as key and value), and only the first v_head_dim entries of each output head are
    defined; None: v_head_dim = head_dim."""

    def __init__(
        self,
        layer_id: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scaling: float,
        *,
        sliding_window: Optional[int] = None,
        logit_cap: Optional[float] = None,
        v_head_dim: Optional[int] = None,
    ) -> None:
        super().__init__()
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {sliding_window}.")
        if logit_cap is not None and logit_cap <= 0:
            raise ValueError(f"logit_cap must be > 0, got {logit_cap}.")
        if v_head_dim is not None and not 0 < v_head_dim <= head_dim:
            raise ValueError(f"v_head_dim must be in [1, head_dim={head_dim}], got {v_head_dim}.")
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.v_head_dim = head_dim if v_head_dim is None else v_head_dim
        self.scaling = scaling
        self.sliding_window = sliding_window
        self.logit_cap = logit_cap

    def forward(
        self, q: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor], forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """q [N, Hq, D]; k, v [N, Hk, D], or None where the caller has already stored this step's
        K/V in the cache -> [N, Hq * D]."""
        if k is not None:
            forward_batch.kv_cache.set_kv(self.layer_id, forward_batch.out_cache_loc, k, v)
        if forward_batch.attention_split is not None:  # capturing piecewise graphs: attention runs between them
            out = forward_batch.attention_split(self, q)  # [N, Hq, D]
        else:
            out = forward_batch.attn_backend.forward(q, self, forward_batch)  # [N, Hq, D]
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)
