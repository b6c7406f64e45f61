"""Plain-torch decode and extend attention over the paged KV cache: the functions the Triton (CUDA)
and C (CPU) kernels compute, for their tests.

sliding_window=W: a query at position p attends to keys at positions > p - W (None: all of
[0, p]). logit_cap=c: each scaled score s becomes c * tanh(s / c) before the softmax."""

from __future__ import annotations

from typing import Optional

import torch


def _weights(scores: torch.Tensor, visible: torch.Tensor, logit_cap: Optional[float]) -> torch.Tensor:
    """scores [..., L] float32 (scaled), visible broadcastable bool -> softmax weights [..., L]."""
    if logit_cap is not None:
        scores = torch.tanh(scores / logit_cap) * logit_cap
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)


def _visible(q_pos: torch.Tensor, num_keys: int, sliding_window: Optional[int]) -> torch.Tensor:
    """q_pos [E] -> [E, num_keys] bool: causal, and within the window where there is one."""
    key_pos = torch.arange(num_keys, device=q_pos.device)[None, :]
    visible = key_pos <= q_pos[:, None]
    if sliding_window is not None:
        visible &= key_pos > q_pos[:, None] - sliding_window
    return visible


def decode_attention_reference(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    sliding_window: Optional[int] = None,
    logit_cap: Optional[float] = None,
) -> torch.Tensor:
    """q [B, Hq, D]; k_buf, v_buf [S, Hk, D] -> [B, Hq, D] in q's dtype. Each request's query sits
    at position seq_lens[b] - 1 and attends to its KV slots req_to_token[req_pool_indices[b],
    :seq_lens[b]] (the last sliding_window of them with a window), one request at a time, float32
    softmax."""
    group = q.shape[1] // k_buf.shape[1]
    outs = []
    for b in range(q.shape[0]):
        seq_len = int(seq_lens[b])
        slots = req_to_token[req_pool_indices[b], :seq_len]
        k = k_buf[slots].float().repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v_buf[slots].float().repeat_interleave(group, dim=1)  # [L, Hq, D]
        scores = torch.einsum("hd,lhd->hl", q[b].float() * scale, k)  # [Hq, L]
        visible = _visible(torch.tensor([seq_len - 1], device=q.device), seq_len, sliding_window)  # [1, L]
        outs.append(torch.einsum("hl,lhd->hd", _weights(scores, visible, logit_cap), v))  # [Hq, D]
    return torch.stack(outs).to(q.dtype)


def extend_attention_reference(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    q_starts: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    scale: float,
    *,
    sliding_window: Optional[int] = None,
    logit_cap: Optional[float] = None,
) -> torch.Tensor:
    """q [N, Hq, D] (the new tokens of every request, request b's from row q_starts[b]); k_buf,
    v_buf [S, Hk, D] already holding the new tokens' K/V -> [N, Hq, D] in q's dtype (rows of no
    request are zero). New token i of request b is at position prefix_lens[b] + i and attends to
    KV slots req_to_token[req_pool_indices[b], :prefix_lens[b] + i + 1] (the last sliding_window
    of them with a window), float32 softmax."""
    group = q.shape[1] // k_buf.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)  # [N, Hq, D]
    for b in range(req_pool_indices.shape[0]):
        prefix, extend, start = int(prefix_lens[b]), int(extend_lens[b]), int(q_starts[b])
        slots = req_to_token[req_pool_indices[b], : prefix + extend]
        k = k_buf[slots].float().repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v_buf[slots].float().repeat_interleave(group, dim=1)  # [L, Hq, D]
        scores = torch.einsum("ehd,lhd->hel", q[start : start + extend].float() * scale, k)  # [Hq, E, L]
        q_pos = prefix + torch.arange(extend, device=q.device)
        visible = _visible(q_pos, prefix + extend, sliding_window)  # [E, L]
        out[start : start + extend] = torch.einsum("hel,lhd->ehd", _weights(scores, visible, logit_cap), v)
    return out.to(q.dtype)


def mla_decode_reference(
    q: torch.Tensor,
    kv_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    kv_lora_rank: int,
) -> torch.Tensor:
    """Multi-head latent attention decode: q [B, H, R + P] absorbed queries; kv_buf [S, 1, R + P]
    latent rows (c_kv [R], then k_rope [P]) -> [B, H, R] in q's dtype. Each head scores every row
    of its request's slots req_to_token[req_pool_indices[b], :seq_lens[b]] as its key and sums
    their first R values (c_kv) as its value, float32 softmax."""
    outs = []
    for b in range(q.shape[0]):
        rows = kv_buf[req_to_token[req_pool_indices[b], : int(seq_lens[b])], 0].float()  # [L, R + P]
        weights = torch.softmax(q[b].float() @ rows.T * scale, dim=-1)  # [H, L]
        outs.append(weights @ rows[:, :kv_lora_rank])  # [H, R]
    return torch.stack(outs).to(q.dtype)
