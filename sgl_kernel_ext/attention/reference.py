"""Plain-torch decode attention over the paged KV cache: the function the Triton (CUDA) and C
(CPU) kernels compute, for their tests."""

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
