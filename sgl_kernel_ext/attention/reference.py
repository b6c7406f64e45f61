"""Plain-torch decode and extend attention over the paged KV cache: the functions the Triton (CUDA)
and C (CPU) kernels compute, for their tests."""

from __future__ import annotations

import torch


def decode_attention_reference(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [B, Hq, D]; k_buf, v_buf [S, Hk, D] -> [B, Hq, D] in q's dtype. Each request attends to its
    KV slots req_to_token[req_pool_indices[b], :seq_lens[b]], one request at a time, float32 softmax."""
    group = q.shape[1] // k_buf.shape[1]
    outs = []
    for b in range(q.shape[0]):
        slots = req_to_token[req_pool_indices[b], : int(seq_lens[b])]
        k = k_buf[slots].float().repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v_buf[slots].float().repeat_interleave(group, dim=1)  # [L, Hq, D]
        weights = torch.softmax(torch.einsum("hd,lhd->hl", q[b].float() * scale, k), dim=-1)  # [Hq, L]
        outs.append(torch.einsum("hl,lhd->hd", weights, v))  # [Hq, D]
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
) -> torch.Tensor:
    """q [N, Hq, D] (the new tokens of every request, request b's from row q_starts[b]); k_buf,
    v_buf [S, Hk, D] already holding the new tokens' K/V -> [N, Hq, D] in q's dtype (rows of no
    request are zero). New token i of request b is at position prefix_lens[b] + i and attends to
    KV slots req_to_token[req_pool_indices[b], :prefix_lens[b] + i + 1], float32 softmax."""
    group = q.shape[1] // k_buf.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)  # [N, Hq, D]
    for b in range(req_pool_indices.shape[0]):
        prefix, extend, start = int(prefix_lens[b]), int(extend_lens[b]), int(q_starts[b])
        slots = req_to_token[req_pool_indices[b], : prefix + extend]
        k = k_buf[slots].float().repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v_buf[slots].float().repeat_interleave(group, dim=1)  # [L, Hq, D]
        scores = torch.einsum("ehd,lhd->hel", q[start : start + extend].float() * scale, k)  # [Hq, E, L]
        q_pos = prefix + torch.arange(extend, device=q.device)
        visible = torch.arange(prefix + extend, device=q.device)[None, :] <= q_pos[:, None]  # [E, L]
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        out[start : start + extend] = torch.einsum("hel,lhd->ehd", weights, v)
    return out.to(q.dtype)
