"""Attention with torch SDPA over K/V gathered from the paged cache.

Decode gathers every request's K/V into one padded batch and runs one SDPA (a padded batch
reduces over the batch's longest length, so in batch-invariant mode each request attends on
its own instead); extend runs one SDPA per request, since prompt chunks differ widely in
length. The reference path, and the fallback of the cpu backend.

A layer's sliding window becomes a mask, built once per step for each window size the layers
use; a layer's logit cap replaces SDPA by the explicit softmax (SDPA has no soft-capping).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.batch_invariant import is_batch_invariant
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

if TYPE_CHECKING:
    from sglang.srt.layers.attention.attention_layer import Attention


class GatherWorkspace:
    """Reused destination of the per-layer K/V gathers: on CPU a fresh multi-MB tensor in every
    layer costs more in page faults than the copy itself. Grows, never shrinks."""

    def __init__(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.k = torch.empty((0, num_kv_heads, head_dim), dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)

    def take(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Two [rows, Hk, D] buffers, valid until the next step's take."""
        if rows > self.k.shape[0]:
            size = max(rows, 2 * self.k.shape[0])
            self.k = self.k.new_empty((size, *self.k.shape[1:]))
            self.v = torch.empty_like(self.k)
        return self.k[:rows], self.v[:rows]


@dataclass
class PaddedDecodeMetadata:
    kv_indices: torch.Tensor  # [B * L] int64 KV slots, padding -> slot 0
    max_len: int  # L
    mask: torch.Tensor  # [B, 1, 1, L] additive, model dtype: 0 = attend, -inf = padding
    k_out: torch.Tensor  # [B * L, Hk, D] gather destination, shared by the layers
    v_out: torch.Tensor
    seq_lens: torch.Tensor  # [B] int64
    window_masks: dict[int, torch.Tensor] = field(default_factory=dict)  # window -> mask as `mask`

    def mask_for(self, window: Optional[int]) -> torch.Tensor:
        """`mask`, also hiding the positions before each row's last `window`."""
        if window is None:
            return self.mask
        if window not in self.window_masks:
            pos = torch.arange(self.max_len, device=self.seq_lens.device)
            early = pos < (self.seq_lens - window).unsqueeze(1)  # [B, L] bool
            self.window_masks[window] = self.mask.masked_fill(early[:, None, None, :], float("-inf"))
        return self.window_masks[window]


@dataclass
class PerRequestMetadata:
    token_starts: list[int]  # offset of each request's first new token in the batch
    extend_lens: list[int]
    kv_indices: list[torch.Tensor]  # per request [S_i] int64 KV slots of positions [0, S_i)
    masks: list[Optional[torch.Tensor]]  # per request [n_i, S_i] bool; None = plain causal (no prefix)
    k_out: torch.Tensor  # [max S_i, Hk, D] gather destination, shared by requests and layers
    v_out: torch.Tensor
    prefix_lens: list[int]
    window_masks: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # window -> masks as `masks`

    def masks_for(self, window: Optional[int]) -> list[Optional[torch.Tensor]]:
        """`masks`, also hiding the keys at or before each query's position - `window`."""
        if window is None:
            return self.masks
        if window not in self.window_masks:
            self.window_masks[window] = [
                _prefix_causal_mask(prefix, n, slots.device, window)
                for prefix, n, slots in zip(self.prefix_lens, self.extend_lens, self.kv_indices)
            ]
        return self.window_masks[window]


class TorchNativeAttnBackend(AttentionBackend):
    def __init__(self, req_to_token: torch.Tensor, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        self.req_to_token = req_to_token  # [R, C] int64
        self.workspace = GatherWorkspace(num_kv_heads, head_dim, dtype, req_to_token.device)
        self.metadata: Optional[PaddedDecodeMetadata | PerRequestMetadata] = None

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        max_len = max(forward_batch.seq_lens_cpu)
        rows = self.req_to_token[forward_batch.req_pool_indices, :max_len]  # [B, L] int64
        if forward_batch.forward_mode.is_decode() and not is_batch_invariant():
            self.metadata = self._padded_decode_metadata(forward_batch, rows, max_len)
        else:
            self.metadata = self._per_request_metadata(forward_batch, rows, max_len)

    def _padded_decode_metadata(self, forward_batch: ForwardBatch, rows: torch.Tensor, max_len: int) -> PaddedDecodeMetadata:
        valid = torch.arange(max_len, device=rows.device) < forward_batch.seq_lens.unsqueeze(1)  # [B, L] bool
        # Padding reads the zeroed slot 0: stale slots could hold anything, and 0 * NaN is NaN.
        k_out, v_out = self.workspace.take(rows.numel())
        # Additive, built once for all layers: SDPA would convert a bool mask in every layer.
        bias = torch.zeros(valid.shape, dtype=k_out.dtype, device=rows.device).masked_fill_(~valid, float("-inf"))
        return PaddedDecodeMetadata(
            (rows * valid).view(-1), max_len, bias[:, None, None, :], k_out, v_out, forward_batch.seq_lens
        )

    def _per_request_metadata(self, forward_batch: ForwardBatch, rows: torch.Tensor, max_len: int) -> PerRequestMetadata:
        starts, kv_indices, masks = [], [], []
        start = 0
        for i, (prefix, n) in enumerate(zip(forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu)):
            starts.append(start)
            start += n
            kv_indices.append(rows[i, : prefix + n])
            masks.append(_prefix_causal_mask(prefix, n, rows.device) if prefix else None)
        k_out, v_out = self.workspace.take(max_len)
        return PerRequestMetadata(
            starts, forward_batch.extend_seq_lens_cpu, kv_indices, masks, k_out, v_out,
            forward_batch.extend_prefix_lens_cpu,
        )

    def forward_decode(
        self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, layer: "Attention", forward_batch: ForwardBatch
    ) -> torch.Tensor:
        meta = self.metadata
        if isinstance(meta, PerRequestMetadata):
            return self._per_request(q, k_buf, v_buf, layer, meta)
        batch = q.shape[0]
        shape = (batch, meta.max_len, layer.num_kv_heads, layer.head_dim)
        k = torch.index_select(k_buf, 0, meta.kv_indices, out=meta.k_out).view(shape).transpose(1, 2)  # [B, Hk, L, D]
        v = torch.index_select(v_buf, 0, meta.kv_indices, out=meta.v_out).view(shape).transpose(1, 2)  # [B, Hk, L, D]
        # The single query of each row, grouped under its KV head: GQA without repeating K/V.
        q = q.reshape(batch, layer.num_kv_heads, layer.num_heads // layer.num_kv_heads, layer.head_dim)  # [B, Hk, G, D]
        mask = meta.mask_for(layer.sliding_window)
        out = _attention(q, k, v, mask, layer.scaling, layer.logit_cap, enable_gqa=False)  # [B, Hk, G, D]
        return out.reshape(batch, layer.num_heads, layer.head_dim)

    def forward_extend(
        self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, layer: "Attention", forward_batch: ForwardBatch
    ) -> torch.Tensor:
        return self._per_request(q, k_buf, v_buf, layer, self.metadata)

    @staticmethod
    def _per_request(
        q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, layer: "Attention", meta: PerRequestMetadata
    ) -> torch.Tensor:
        outs = []
        masks = meta.masks_for(layer.sliding_window)
        for start, n, slots, mask in zip(meta.token_starts, meta.extend_lens, meta.kv_indices, masks):
            qi = q[start : start + n].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
            seq = slots.shape[0]
            ki = torch.index_select(k_buf, 0, slots, out=meta.k_out[:seq]).transpose(0, 1).unsqueeze(0)  # [1, Hk, S, D]
            vi = torch.index_select(v_buf, 0, slots, out=meta.v_out[:seq]).transpose(0, 1).unsqueeze(0)  # [1, Hk, S, D]
            o = _attention(qi, ki, vi, mask, layer.scaling, layer.logit_cap, enable_gqa=True)  # [1, Hq, n, D]
            outs.append(o[0].transpose(0, 1))  # [n, Hq, D]
        return torch.cat(outs)


def _prefix_causal_mask(prefix: int, n: int, device: torch.device, window: Optional[int] = None) -> torch.Tensor:
    """[n, prefix + n] bool: new token q sits at position prefix + q and sees keys up to it (and,
    with a window, after its position - window)."""
    key_pos = torch.arange(prefix + n, device=device).unsqueeze(0)
    query_pos = torch.arange(prefix, prefix + n, device=device).unsqueeze(1)
    visible = key_pos <= query_pos
    if window is not None:
        visible &= key_pos > query_pos - window
    return visible


def _attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], scale: float,
    logit_cap: Optional[float], *, enable_gqa: bool,
) -> torch.Tensor:
    """q [X, Hq, n, D]; k, v [X, Hk, S, D] (Hq == Hk unless enable_gqa); mask broadcastable to
    [X, Hq, n, S], bool (True = attend) or additive, None = causal -> [X, Hq, n, D]. With a logit
    cap the scores are capped before the softmax, in float32."""
    if logit_cap is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=enable_gqa
        )
    x, num_heads, n, d = q.shape
    num_kv_heads = k.shape[1]
    q = q.reshape(x, num_kv_heads, num_heads // num_kv_heads, n, d).float()  # [X, Hk, G, n, D]
    scores = torch.matmul(q, k.float().unsqueeze(2).transpose(-1, -2)) * scale  # [X, Hk, G, n, S]
    scores = torch.tanh(scores / logit_cap) * logit_cap
    if mask is None:
        mask = _prefix_causal_mask(0, n, q.device)  # [n, n]
    if mask.dim() == 4:
        mask = mask.unsqueeze(1)  # [X, 1, 1, n|1, S]: the group axis
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    else:
        scores = scores + mask
    out = torch.matmul(torch.softmax(scores, dim=-1), v.float().unsqueeze(2))  # [X, Hk, G, n, D]
    return out.reshape(x, num_heads, n, d).to(v.dtype)
