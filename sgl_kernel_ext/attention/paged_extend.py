"""Extend (prefill with a cached prefix) attention over the paged KV cache.

A batch holds B requests, each with prefix_lens[b] positions already in the cache and
extend_lens[b] new tokens whose queries are concatenated in q from row q_starts[b]. The new
tokens' K/V have already been written into the cache, so every key and value (prefix and new)
is gathered through req_to_token; new token i of request b sits at position prefix_lens[b] + i
and attends causally to positions [0, prefix_lens[b] + i].

Grid (B, Hq, cdiv(max_extend_len, BLOCK_M)): a program takes BLOCK_M new tokens of one request
and one query head (programs past the request's extend_len exit at once; max_extend_len is a
host int that only sizes the grid) and runs a flash-attention loop over BLOCK_N key blocks with an
online float32 softmax in base 2, QK^T and PV on tl.dot. The key range splits in two: blocks that
every row of the tile may see (up to the tile's first query position) skip the causal mask and
all bounds checks; the remaining blocks up to the tile's last query position are masked; blocks
entirely above the diagonal are never visited.

Tiles are BLOCK_M x BLOCK_D queries and BLOCK_N x BLOCK_D keys and values; heads wider than
WIDE_HEAD_DIM (MLA's 576-wide latent rows, padded to 1024) take 32 x 32 tiles in one pipeline
stage: 64 x 64 tiles in two stages at that width exceed an H100's shared memory (227 KiB).

With a sliding window W (constexpr), query position p sees keys (p - W, p]: every visited block
is masked, and the walk starts at the block holding the tile's first query's first key. A logit
cap c (constexpr) maps each score s to c * tanh(s / c) before the mask and the softmax.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.triton_launch import launch, pdl_sync

from sgl_kernel_ext.attention.paged_decode import _dot, _soft_cap, cap_in_log2_units, dot_flags

BLOCK_M = 64  # query rows per program
BLOCK_N = 64  # key positions per inner step
NUM_WARPS = 4
NUM_STAGES = 2
WIDE_HEAD_DIM = 256  # BLOCK_D above this takes the wide tiles
WIDE_BLOCK_M = 32
WIDE_BLOCK_N = 32
WIDE_NUM_STAGES = 1
# Wide float32 heads (e.g. MLA's 576-wide latent rows, padded to 1024): 32 x 32 tiles ask for
# 260 KiB of shared memory on sm_90, past Hopper's 227 KiB; 16 x 16 take 129 KiB.
WIDE_FP32_BLOCK = 16
_LOG2E = 1.4426950408889634


@triton.jit
def _attend_block(
    acc, l, m, q, q_pos, block_start, seq_end, slots_row, kv_head_k_ptr, kv_head_v_ptr,
    stride_k_s, stride_k_d, stride_v_s, stride_v_d, d, live_d, qk_scale,
    BLOCK: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, CAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
):
    """One online-softmax step over key positions [block_start, block_start + BLOCK). Without
    CAUSAL the caller guarantees every position is below seq_end and visible to every row."""
    pos = block_start + tl.arange(0, BLOCK)
    if CAUSAL:
        live = pos < seq_end
        slots = tl.load(slots_row + pos, mask=live, other=0)
        kv_mask = live[:, None] & live_d[None, :]
    else:
        slots = tl.load(slots_row + pos)
        kv_mask = live_d[None, :]
    k = tl.load(kv_head_k_ptr + slots[:, None] * stride_k_s + d[None, :] * stride_k_d, mask=kv_mask, other=0.0)  # [N, D]
    scores = _dot(q, tl.trans(k), DOT_PRECISION, DOT_UPCAST) * qk_scale  # [M, N]
    if CAP > 0:
        scores = _soft_cap(scores, CAP)
    if CAUSAL:
        # Each row sees at least its own position and, without a window, position 0 was in its
        # first block, so m stays finite and exp2 never sees -inf - -inf.
        visible = pos[None, :] <= q_pos[:, None]
        if WINDOW > 0:
            visible = visible & (pos[None, :] > q_pos[:, None] - WINDOW)
        scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, axis=1))
    m_ref = m_new
    if WINDOW > 0:
        # A row whose window starts past this block has seen nothing yet: its weights stay 0.
        m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)
    alpha = tl.exp2(m - m_ref)
    p = tl.exp2(scores - m_ref[:, None])  # [M, N]
    l = l * alpha + tl.sum(p, axis=1)
    v = tl.load(kv_head_v_ptr + slots[:, None] * stride_v_s + d[None, :] * stride_v_d, mask=kv_mask, other=0.0)  # [N, D]
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_PRECISION, DOT_UPCAST)
    return acc, l, m_new


@triton.jit
def _extend_kernel(
    q_ptr,  # [N, Hq, D]
    k_ptr,  # [S, Hk, D]
    v_ptr,  # [S, Hk, D]
    out_ptr,  # [N, Hq, D]
    req_to_token_ptr,  # [R, C] int64 KV slots
    req_pool_indices_ptr,  # [B] int64
    q_starts_ptr,  # [B] int64
    prefix_lens_ptr,  # [B] int64
    extend_lens_ptr,  # [B] int64
    qk_scale,  # softmax scale * log2(e)
    stride_q_n, stride_q_h, stride_q_d,
    stride_k_s, stride_k_h, stride_k_d,
    stride_v_s, stride_v_h, stride_v_d,
    stride_o_n, stride_o_h, stride_o_d,
    stride_r2t,
    GROUP: tl.constexpr,  # query heads per KV head
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two >= 16
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WINDOW: tl.constexpr,  # sliding window, 0 for none
    CAP: tl.constexpr,  # logit cap in the scores' base-2 units, 0.0 for none
    DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    b = tl.program_id(0)
    head = tl.program_id(1)
    first_row = tl.program_id(2) * BLOCK_M
    extend_len = tl.load(extend_lens_ptr + b)
    if first_row >= extend_len:
        return
    prefix_len = tl.load(prefix_lens_ptr + b)
    q_start = tl.load(q_starts_ptr + b)
    rows = first_row + tl.arange(0, BLOCK_M)
    live_m = rows < extend_len
    d = tl.arange(0, BLOCK_D)
    live_d = d < HEAD_DIM
    q_mask = live_m[:, None] & live_d[None, :]
    q_offs = (q_start + rows)[:, None] * stride_q_n + head * stride_q_h + d[None, :] * stride_q_d
    q = tl.load(q_ptr + q_offs, mask=q_mask, other=0.0)  # [M, D]
    q_pos = prefix_len + rows  # [M] cache positions of the tile's queries

    kv_head = head // GROUP
    k_head_ptr = k_ptr + kv_head * stride_k_h
    v_head_ptr = v_ptr + kv_head * stride_v_h
    slots_row = req_to_token_ptr + tl.load(req_pool_indices_ptr + b) * stride_r2t
    # Whole blocks at or below the tile's first query position are visible to every row.
    unmasked_end = (prefix_len + first_row + 1) // BLOCK_N * BLOCK_N
    seq_end = prefix_len + tl.minimum(extend_len, first_row + BLOCK_M)  # past the tile's last query
    masked_start = unmasked_end
    if WINDOW > 0:
        unmasked_end = unmasked_end * 0
        masked_start = tl.maximum(prefix_len + first_row + 1 - WINDOW, 0) // BLOCK_N * BLOCK_N

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, unmasked_end, BLOCK_N):
        acc, l, m = _attend_block(
            acc, l, m, q, q_pos, start, seq_end, slots_row, k_head_ptr, v_head_ptr,
            stride_k_s, stride_k_d, stride_v_s, stride_v_d, d, live_d, qk_scale,
            BLOCK_N, False, WINDOW, CAP, DOT_PRECISION, DOT_UPCAST,
        )
    for start in range(masked_start, seq_end, BLOCK_N):
        acc, l, m = _attend_block(
            acc, l, m, q, q_pos, start, seq_end, slots_row, k_head_ptr, v_head_ptr,
            stride_k_s, stride_k_d, stride_v_s, stride_v_d, d, live_d, qk_scale,
            BLOCK_N, True, WINDOW, CAP, DOT_PRECISION, DOT_UPCAST,
        )
    if WINDOW > 0:
        l = tl.where(l > 0.0, l, 1.0)  # rows past the request's end may see no key in a window
    out = (acc / l[:, None]).to(out_ptr.dtype.element_ty)
    o_offs = (q_start + rows)[:, None] * stride_o_n + head * stride_o_h + d[None, :] * stride_o_d
    tl.store(out_ptr + o_offs, out, mask=q_mask)


def extend_tiles(block_d: int, element_size: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_stages) for a padded head width and the q/k/v element size in bytes."""
    if block_d > WIDE_HEAD_DIM and element_size >= 4:
        return WIDE_FP32_BLOCK, WIDE_FP32_BLOCK, WIDE_NUM_STAGES
    if block_d > WIDE_HEAD_DIM:
        return WIDE_BLOCK_M, WIDE_BLOCK_N, WIDE_NUM_STAGES
    return BLOCK_M, BLOCK_N, NUM_STAGES


def paged_extend_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    q_starts: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    max_extend_len: int,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    sliding_window: int | None = None,
    logit_cap: float | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int = NUM_WARPS,
    num_stages: int | None = None,
) -> torch.Tensor:
    """q [N, Hq, D] (any strides); k_buf, v_buf [S, Hk, D] -> out [N, Hq, D]. Rows
    q_starts[b] + i, i < extend_lens[b], attend to KV slots
    req_to_token[req_pool_indices[b], :prefix_lens[b] + i + 1] (the last sliding_window of them with
    a window; logit_cap soft-caps the scores); other rows of out are left as they were. max_extend_len (>= every extend_lens[b]) only sizes the grid.
    Tile sizes and stages default by the head width and dtype (see extend_tiles)."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_buf.shape[1]
    assert num_heads % num_kv_heads == 0 and k_buf.shape[2] == head_dim and q.dtype == k_buf.dtype
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)  # [N, Hq, D]
    assert out.shape == q.shape
    batch = req_pool_indices.shape[0]
    if batch == 0 or max_extend_len <= 0:
        return out
    block_d = max(16, triton.next_power_of_2(head_dim))
    tiles = extend_tiles(block_d, q.element_size())
    block_m, block_n = block_m or tiles[0], block_n or tiles[1]
    num_stages = num_stages or tiles[2]
    grid = (batch, num_heads, triton.cdiv(max_extend_len, block_m))
    launch(_extend_kernel, grid,
        q, k_buf, v_buf, out, req_to_token, req_pool_indices, q_starts, prefix_lens, extend_lens,
        scale * _LOG2E, *q.stride(), *k_buf.stride(), *v_buf.stride(), *out.stride(), req_to_token.stride(0),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_M=block_m, BLOCK_N=block_n, WINDOW=sliding_window or 0, CAP=cap_in_log2_units(logit_cap),
        **dot_flags(q.dtype), num_warps=num_warps, num_stages=num_stages, pdl=True,
    )
    return out
