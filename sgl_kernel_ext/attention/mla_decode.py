"""Split-KV decode attention for multi-head latent attention (DeepSeek-V2/V3) over the paged
compressed KV cache.

Each cached row holds a token's latent c_kv [R] (R = kv_lora_rank) followed by its rotated rope key
k_rope [P]; each query row is the absorbed query [q_nope W_UK (R) | q_rope (P)]. The one latent
row serves every head as its key and, through its first R values, as its value:
    score[h, t] = (q_nope[h] . c_kv[t] + q_rope[h] . k_rope[t]) * scale
    out[h]      = sum_t softmax_t(score[h]) c_kv[t]                         [R]

Stage 1, grid (B, cdiv(H, BLOCK_H), NUM_SPLITS): a program takes BLOCK_H heads of one request and
one contiguous chunk of its positions (cut as in paged_decode: whole BLOCK_N blocks, derived from
seq_len inside the kernel). Each block of BLOCK_N latent rows is loaded once and serves all
BLOCK_H heads: q.k is two tl.dot calls, [BLOCK_H, R] x [R, BLOCK_N] and [BLOCK_H, P] x [P, BLOCK_N]
(the R + P split keeps each tile at its own power-of-two width instead of padding R + P = 576 to
1024), and p.v reuses the c_kv tile. Online softmax in float32, base 2. Stage 2 is paged_decode's
merge kernel over the R-wide partials.

With out and workspace given the launch neither allocates nor syncs (CUDA-graph capturable). With
one split a request's result depends on its own length alone (the batch-invariant mode).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.attention.paged_decode import (
    _LN2,
    _LOG2E,
    NUM_WARPS,
    _dot,
    _merge_kernel,
    default_num_kv_splits,
    dot_flags,
)
from sgl_kernel_ext.triton_launch import launch, pdl_sync

BLOCK_H = 16  # heads per program (tl.dot needs >= 16 rows)
BLOCK_N = 32  # latent rows per inner step
MLA_NUM_WARPS = 4
MLA_NUM_STAGES = 2


@triton.jit
def _mla_split_kernel(
    q_ptr,  # [B, H, R + P], unit last stride
    kv_ptr,  # [S, 1, R + P], unit last stride
    req_to_token_ptr,  # [Rq, C] int64 KV slots
    req_pool_indices_ptr,  # [B] int64
    seq_lens_ptr,  # [B] int64
    partial_ptr,  # [>=B, H, >=NUM_SPLITS, R] float32
    lse_ptr,  # [>=B, H, >=NUM_SPLITS] float32
    qk_scale,  # softmax scale * log2(e)
    stride_q_b, stride_q_h,
    stride_kv_s,
    stride_r2t,
    stride_p_b, stride_p_h, stride_p_s, stride_p_d,
    stride_l_b, stride_l_h, stride_l_s,
    NUM_HEADS: tl.constexpr,
    RANK: tl.constexpr,  # R: the latent (and value) width
    RANK_PAD: tl.constexpr,  # R rounded up to a power of two
    ROPE: tl.constexpr,  # P
    ROPE_PAD: tl.constexpr,  # P rounded up to a power of two >= 16
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    b = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = tl.program_id(2)
    live_h = heads < NUM_HEADS
    r = tl.arange(0, RANK_PAD)
    p = tl.arange(0, ROPE_PAD)
    live_r = r < RANK
    live_p = p < ROPE
    q_rows = q_ptr + b * stride_q_b + heads[:, None] * stride_q_h
    q_nope = tl.load(q_rows + r[None, :], mask=live_h[:, None] & live_r[None, :], other=0.0)  # [BH, R]
    q_rope = tl.load(q_rows + RANK + p[None, :], mask=live_h[:, None] & live_p[None, :], other=0.0)  # [BH, P]

    seq_len = tl.load(seq_lens_ptr + b)
    # Whole blocks per split, so a block never straddles two splits.
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    slots_row = req_to_token_ptr + tl.load(req_pool_indices_ptr + b) * stride_r2t

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, RANK_PAD], tl.float32)
    for block_start in range(start, end, BLOCK_N):
        pos = block_start + tl.arange(0, BLOCK_N)
        live = pos < end
        rows = kv_ptr + tl.load(slots_row + pos, mask=live, other=0)[:, None] * stride_kv_s
        c_kv = tl.load(rows + r[None, :], mask=live[:, None] & live_r[None, :], other=0.0)  # [N, R]
        k_rope = tl.load(rows + RANK + p[None, :], mask=live[:, None] & live_p[None, :], other=0.0)  # [N, P]
        scores = _dot(q_nope, tl.trans(c_kv), DOT_PRECISION, DOT_UPCAST)
        scores += _dot(q_rope, tl.trans(k_rope), DOT_PRECISION, DOT_UPCAST)
        scores = tl.where(live[None, :], scores * qk_scale, float("-inf"))  # [BH, N]
        # Every block has a live position, so m_new is finite and no exp sees -inf - -inf.
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp2(m - m_new)
        weights = tl.exp2(scores - m_new[:, None])  # [BH, N]
        l = l * alpha + tl.sum(weights, axis=1)
        acc = acc * alpha[:, None] + _dot(weights.to(c_kv.dtype), c_kv, DOT_PRECISION, DOT_UPCAST)
        m = m_new

    # An empty split (past the request's end) leaves l = 0: zeros and lse = -inf, never NaN.
    has = l > 0.0
    l_safe = tl.where(has, l, 1.0)
    lse = tl.where(has, (m + tl.log2(l_safe)) * _LN2, float("-inf"))
    p_offs = b * stride_p_b + heads[:, None] * stride_p_h + split * stride_p_s + r[None, :] * stride_p_d
    tl.store(partial_ptr + p_offs, acc / l_safe[:, None], mask=live_h[:, None] & live_r[None, :])
    tl.store(lse_ptr + b * stride_l_b + heads * stride_l_h + split * stride_l_s, lse, mask=live_h)


def mla_decode_workspace(batch: int, num_heads: int, num_kv_splits: int, kv_lora_rank: int,
                         device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial [B, H, S, R] float32, lse [B, H, S] float32) for mla_decode_attention."""
    partial = torch.empty((batch, num_heads, num_kv_splits, kv_lora_rank), dtype=torch.float32, device=device)  # [B, H, S, R]
    lse = torch.empty((batch, num_heads, num_kv_splits), dtype=torch.float32, device=device)  # [B, H, S]
    return partial, lse


def _check(q: torch.Tensor, kv_buf: torch.Tensor, out: torch.Tensor, workspace, num_kv_splits: int, rank: int) -> None:
    batch, num_heads, width = q.shape
    partial, lse = workspace
    assert kv_buf.shape[1] == 1 and kv_buf.shape[2] == width and 0 < rank < width and q.dtype == kv_buf.dtype
    assert q.stride(2) == 1 and kv_buf.stride(2) == 1
    assert out.shape == (batch, num_heads, rank)
    assert 1 <= num_kv_splits <= partial.shape[2] and num_kv_splits <= lse.shape[2]
    assert partial.shape[0] >= batch and lse.shape[0] >= batch and partial.shape[1] == lse.shape[1] == num_heads
    assert partial.shape[3] >= rank and partial.dtype == lse.dtype == torch.float32


def mla_decode_attention(
    q: torch.Tensor,
    kv_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    kv_lora_rank: int,
    out: torch.Tensor | None = None,
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
    num_kv_splits: int | None = None,
    *,
    block_h: int = BLOCK_H,
    block_n: int = BLOCK_N,
    num_warps: int = MLA_NUM_WARPS,
    num_stages: int = MLA_NUM_STAGES,
) -> torch.Tensor:
    """q [B, H, R + P] (unit last stride); kv_buf [S, 1, R + P] latent rows -> out [B, H, R] (any
    strides; q's dtype unless the caller's out says otherwise), R = kv_lora_rank. Request b attends
    to its rows req_to_token[req_pool_indices[b], :seq_lens[b]]; seq_lens[b] == 0 gives zeros.
    num_kv_splits defaults to the workspace's split count, else default_num_kv_splits(B, 1)."""
    batch, num_heads, width = q.shape
    if num_kv_splits is None:
        num_kv_splits = workspace[1].shape[2] if workspace is not None else default_num_kv_splits(batch, 1)
    if out is None:
        out = torch.empty((batch, num_heads, kv_lora_rank), dtype=q.dtype, device=q.device)  # [B, H, R]
    if workspace is None:
        workspace = mla_decode_workspace(batch, num_heads, num_kv_splits, kv_lora_rank, q.device)
    _check(q, kv_buf, out, workspace, num_kv_splits, kv_lora_rank)
    if batch == 0:
        return out
    partial, lse = workspace
    rope = width - kv_lora_rank
    rank_pad = triton.next_power_of_2(kv_lora_rank)
    launch(_mla_split_kernel, (batch, triton.cdiv(num_heads, block_h), num_kv_splits),
        q, kv_buf, req_to_token, req_pool_indices, seq_lens, partial, lse, scale * _LOG2E,
        q.stride(0), q.stride(1), kv_buf.stride(0), req_to_token.stride(0), *partial.stride(), *lse.stride(),
        NUM_HEADS=num_heads, RANK=kv_lora_rank, RANK_PAD=rank_pad, ROPE=rope,
        ROPE_PAD=max(16, triton.next_power_of_2(rope)), BLOCK_H=block_h, BLOCK_N=block_n, NUM_SPLITS=num_kv_splits,
        **dot_flags(q.dtype), num_warps=num_warps, num_stages=num_stages, pdl=True,
    )
    launch(_merge_kernel, (batch, num_heads),
        partial, lse, out, *partial.stride(), *lse.stride(), *out.stride(),
        HEAD_DIM=kv_lora_rank, BLOCK_D=rank_pad, NUM_SPLITS=num_kv_splits,
        SPLITS_PAD=max(2, triton.next_power_of_2(num_kv_splits)), num_warps=NUM_WARPS, pdl=True,
    )
    return out
