"""Batch-invariant decode attention over the paged KV cache.

One program per (request, KV head) walks the request's KV positions in fixed BLOCK_N blocks from
position 0, with an online softmax: the reduction order depends only on the request's own
length, never on its batch-mates (no padding to the batch's longest, no split-KV heuristic
keyed on the batch size). Used by --enable-deterministic-inference on CUDA, where a per-request
SDPA loop would launch batch x layers kernels per step. A sliding window W starts the walk at
the request's position seq_len - W (still a function of its own length alone); a logit cap c
maps each score s to c * tanh(s / c); both are constexprs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.attention.paged_decode import _soft_cap
from sgl_kernel_ext.triton_launch import launch, pdl_sync

BLOCK_N = 64


@triton.jit
def _decode_attention_kernel(
    q_ptr,  # [B, Hq, D]
    k_ptr,  # [S, Hk, D]
    v_ptr,  # [S, Hk, D]
    req_to_token_ptr,  # [R, C] int64 KV slots
    req_pool_indices_ptr,  # [B] int64
    seq_lens_ptr,  # [B] int64
    out_ptr,  # [B, Hq, D]
    scale,
    stride_q_b,
    stride_q_h,
    stride_kv_s,
    stride_kv_h,
    stride_r2t,
    stride_o_b,
    stride_o_h,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    WINDOW: tl.constexpr,  # sliding window, 0 for none
    CAP: tl.constexpr,  # logit cap, 0.0 for none
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    live_g = g < GROUP
    q_heads = kv_head * GROUP + g
    q = tl.load(q_ptr + b * stride_q_b + q_heads[:, None] * stride_q_h + d[None, :], mask=live_g[:, None], other=0.0)
    q = q.to(tl.float32) * scale  # [G, D]
    seq_len = tl.load(seq_lens_ptr + b)
    slots_row = req_to_token_ptr + tl.load(req_pool_indices_ptr + b) * stride_r2t
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    first = seq_len * 0  # the first position the query sees
    if WINDOW > 0:
        first = tl.maximum(seq_len - WINDOW, 0)
    for start in range(first, seq_len, BLOCK):
        pos = start + tl.arange(0, BLOCK)
        live = pos < seq_len
        slots = tl.load(slots_row + pos, mask=live, other=0)
        kv_offs = slots[:, None] * stride_kv_s + kv_head * stride_kv_h + d[None, :]
        k = tl.load(k_ptr + kv_offs, mask=live[:, None], other=0.0).to(tl.float32)  # [N, D]
        v = tl.load(v_ptr + kv_offs, mask=live[:, None], other=0.0).to(tl.float32)  # [N, D]
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [G, N]
        if CAP > 0:
            scores = _soft_cap(scores, CAP)
        scores = tl.where(live[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        p = tl.exp(scores - m_new[:, None])  # [G, N]
        alpha = tl.exp(m - m_new)
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    # A request of no tokens (a padding row) leaves l = 0: zeros, as paged_decode gives, not NaN.
    out = acc / tl.where(l > 0.0, l, 1.0)[:, None]
    tl.store(out_ptr + b * stride_o_b + q_heads[:, None] * stride_o_h + d[None, :], out, mask=live_g[:, None])


def decode_attention_triton(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    sliding_window: int | None = None,
    logit_cap: float | None = None,
) -> torch.Tensor:
    """q [B, Hq, D]; k_buf, v_buf [S, Hk, D] -> [B, Hq, D] in q's dtype. Each request attends to its
    KV slots req_to_token[req_pool_indices[b], :seq_lens[b]] (the last sliding_window of them with
    a window; logit_cap soft-caps the scores); seq_lens[b] == 0 gives zeros."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_buf.shape[1]
    group = num_heads // num_kv_heads
    out = torch.empty((batch, num_heads, head_dim), dtype=torch.float32, device=q.device)  # [B, Hq, D]
    launch(_decode_attention_kernel, (batch, num_kv_heads),
        q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, out, scale,
        q.stride(0), q.stride(1), k_buf.stride(0), k_buf.stride(1), req_to_token.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=max(2, triton.next_power_of_2(group)), HEAD_DIM=head_dim, BLOCK=BLOCK_N,
        WINDOW=sliding_window or 0, CAP=0.0 if logit_cap is None else float(logit_cap), pdl=True,
    )
    return out.to(q.dtype)
