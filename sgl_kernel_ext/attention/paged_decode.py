"""Split-KV ("flash-decoding") decode attention over the paged KV cache.

Decode has one query token per request, so one program per (request, KV head) gives only
B x Hk programs: at small batch most SMs sit idle while each program walks the whole context.
Here every request's positions are cut into NUM_SPLITS contiguous chunks that run in parallel;
each chunk yields its softmax-normalised partial output o_s and log-sum-exp lse_s, and a second
small kernel merges them exactly:

    out = sum_s exp(lse_s - M) * o_s / sum_s exp(lse_s - M),    M = max_s lse_s

Stage 1, grid (B, Hk, NUM_SPLITS): one program serves the GROUP = Hq / Hk query heads sharing a KV
head, so each gathered K/V block is loaded once per group. The head rows are padded to at least
16 so QK^T and PV go through tl.dot (tensor cores); the softmax runs online in float32, in base 2
(the scale is pre-multiplied by log2(e)). The chunk length is derived from seq_len inside the
kernel and rounded up to whole BLOCK_N blocks, so the launch does no host-side length math and
reads no tensor on the host: the grid depends only on (B, Hk, NUM_SPLITS) and, with caller-given
workspace and output, nothing is allocated, so the call can be captured in a CUDA graph. Chunks
past the end of a short request (every chunk of a seq_len-0 padding row) see no positions,
touch neither req_to_token nor the cache, and report lse = -inf.

Stage 2, grid (B, Hq): merges the chunks, skipping empty ones without reading their partials;
a row with no positions at all comes out as zeros. With one split (large batches) stage 1 writes
the output itself and stage 2 is not launched: the merge of one split is its partial, to the bit.

A request's result depends only on its own length and NUM_SPLITS, so with a fixed split count
(default_num_kv_splits of the largest batch) it does not change with its batch-mates.

A sliding window W (a constexpr: one per layer, so a captured graph holds it) cuts the splits
from the request's last W positions instead of all of them; a logit cap c (constexpr) maps each
score s to c * tanh(s / c) before the softmax.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.triton_launch import launch, pdl_sync

BLOCK_N = 64  # KV positions per inner step
NUM_WARPS = 4
NUM_STAGES = 3
# Three stages of [BLOCK_N, D] K and V tiles take 96 KiB of shared memory at 256-byte head rows
# (bf16 x 128): wider rows (fp32 KV, 256-wide heads) pipeline two stages, within the ~100 KiB of
# GPUs before Hopper's 228 KiB.
STAGE3_MAX_ROW_BYTES = 256
MAX_KV_SPLITS = 16
_LOG2E = 1.4426950408889634
_LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # Triton's CPU interpreter multiplies bfloat16 tensors as their raw uint16 bits; compiled
    # code never takes this branch.
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _soft_cap(x, CAP: tl.constexpr):
    """CAP * tanh(x / CAP), from one exp of a non-positive argument (no overflow at any x)."""
    e = tl.exp(-2.0 * tl.abs(x) / CAP)
    t = (1.0 - e) / (1.0 + e)
    return CAP * tl.where(x < 0, -t, t)


def cap_in_log2_units(logit_cap: float | None) -> float:
    """The CAP constexpr of kernels whose scores are in base-2 units (scale * log2 e): capping
    commutes with the scaling when the cap is scaled alike. 0.0 for no cap."""
    return 0.0 if logit_cap is None else logit_cap * _LOG2E


def dot_flags(dtype: torch.dtype) -> dict:
    """The DOT_PRECISION / DOT_UPCAST constexprs for a kernel whose tl.dot inputs have `dtype`."""
    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    # fp32 inputs would otherwise go through TF32 on the tensor cores (~1e-3 error).
    precision = "ieee" if dtype == torch.float32 else "tf32"
    return {"DOT_PRECISION": precision, "DOT_UPCAST": interpret and dtype == torch.bfloat16}


@triton.jit
def _split_kernel(
    q_ptr,  # [B, Hq, D]
    k_ptr,  # [S, Hk, D]
    v_ptr,  # [S, Hk, D]
    req_to_token_ptr,  # [R, C] int64 KV slots
    req_pool_indices_ptr,  # [B] int64
    seq_lens_ptr,  # [B] int64
    partial_ptr,  # [>=B, Hq, >=NUM_SPLITS, D] float32
    lse_ptr,  # [>=B, Hq, >=NUM_SPLITS] float32
    out_ptr,  # [B, Hq, D]: written here when NUM_SPLITS == 1
    qk_scale,  # softmax scale * log2(e)
    stride_q_b, stride_q_h, stride_q_d,
    stride_k_s, stride_k_h, stride_k_d,
    stride_v_s, stride_v_h, stride_v_d,
    stride_r2t,
    stride_p_b, stride_p_h, stride_p_s, stride_p_d,
    stride_l_b, stride_l_h, stride_l_s,
    stride_o_b, stride_o_h, stride_o_d,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # >= 16 for tl.dot
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two >= 16
    BLOCK: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    WINDOW: tl.constexpr,  # sliding window, 0 for none
    CAP: tl.constexpr,  # logit cap in the scores' base-2 units, 0.0 for none
    DOT_PRECISION: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, BLOCK_D)
    live_g = g < GROUP
    live_d = d < HEAD_DIM
    q_heads = kv_head * GROUP + g
    q_offs = b * stride_q_b + q_heads[:, None] * stride_q_h + d[None, :] * stride_q_d
    q = tl.load(q_ptr + q_offs, mask=live_g[:, None] & live_d[None, :], other=0.0)  # [G, D]

    seq_len = tl.load(seq_lens_ptr + b)
    first = seq_len * 0  # the first position the query sees
    if WINDOW > 0:
        first = tl.maximum(seq_len - WINDOW, 0)
    # Whole blocks per split, so a block never straddles two splits.
    split_len = tl.cdiv(tl.cdiv(seq_len - first, NUM_SPLITS), BLOCK) * BLOCK
    start = first + split * split_len
    end = tl.minimum(start + split_len, seq_len)
    slots_row = req_to_token_ptr + tl.load(req_pool_indices_ptr + b) * stride_r2t

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
    for block_start in range(start, end, BLOCK):
        pos = block_start + tl.arange(0, BLOCK)
        live = pos < end
        slots = tl.load(slots_row + pos, mask=live, other=0)
        kv_mask = live[:, None] & live_d[None, :]
        k = tl.load(k_ptr + slots[:, None] * stride_k_s + kv_head * stride_k_h + d[None, :] * stride_k_d,
                    mask=kv_mask, other=0.0)  # [N, D]
        scores = _dot(q, tl.trans(k), DOT_PRECISION, DOT_UPCAST) * qk_scale  # [G, N]
        if CAP > 0:
            scores = _soft_cap(scores, CAP)
        scores = tl.where(live[None, :], scores, float("-inf"))
        # Every block has a live position, so m_new is finite and no exp sees -inf - -inf.
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])  # [G, N]
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + slots[:, None] * stride_v_s + kv_head * stride_v_h + d[None, :] * stride_v_d,
                    mask=kv_mask, other=0.0)  # [N, D]
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_PRECISION, DOT_UPCAST)
        m = m_new

    # An empty split (past the request's end) leaves l = 0: zeros and lse = -inf, never NaN.
    has = l > 0.0
    l_safe = tl.where(has, l, 1.0)
    mask = live_g[:, None] & live_d[None, :]
    if NUM_SPLITS == 1:
        # The merge of one split is its partial (weight exp(0) = 1, total 1): written directly,
        # the same bits, and no merge launch.
        o_offs = b * stride_o_b + q_heads[:, None] * stride_o_h + d[None, :] * stride_o_d
        tl.store(out_ptr + o_offs, (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        lse = tl.where(has, (m + tl.log2(l_safe)) * _LN2, float("-inf"))
        p_offs = b * stride_p_b + q_heads[:, None] * stride_p_h + split * stride_p_s + d[None, :] * stride_p_d
        tl.store(partial_ptr + p_offs, acc / l_safe[:, None], mask=mask)
        tl.store(lse_ptr + b * stride_l_b + q_heads * stride_l_h + split * stride_l_s, lse, mask=live_g)


@triton.jit
def _merge_kernel(
    partial_ptr,  # [>=B, Hq, >=NUM_SPLITS, D] float32
    lse_ptr,  # [>=B, Hq, >=NUM_SPLITS] float32
    out_ptr,  # [B, Hq, D]
    stride_p_b, stride_p_h, stride_p_s, stride_p_d,
    stride_l_b, stride_l_h, stride_l_s,
    stride_o_b, stride_o_h, stride_o_d,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    b = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, BLOCK_D)
    live_d = d < HEAD_DIM
    lse = tl.load(lse_ptr + b * stride_l_b + head * stride_l_h + s * stride_l_s,
                  mask=s < NUM_SPLITS, other=float("-inf"))  # [S]
    live_s = lse > float("-inf")
    m = tl.max(lse, axis=0)
    m = tl.where(m > float("-inf"), m, 0.0)  # all splits empty: weights 0, not NaN
    w = tl.exp(lse - m)  # [S], 0 for empty splits
    # Empty splits' partials are never read: the workspace may hold anything there.
    p_offs = b * stride_p_b + head * stride_p_h + s[:, None] * stride_p_s + d[None, :] * stride_p_d
    partial = tl.load(partial_ptr + p_offs, mask=live_s[:, None] & live_d[None, :], other=0.0)  # [S, D]
    total = tl.sum(w, axis=0)
    out = tl.sum(w[:, None] * partial, axis=0) / tl.where(total > 0.0, total, 1.0)  # [D]
    out = out.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + b * stride_o_b + head * stride_o_h + d * stride_o_d, out, mask=live_d)


def default_num_kv_splits(max_batch: int, num_kv_heads: int, sm_count: int = 132) -> int:
    """A fixed split count giving stage 1 about two waves of programs over `sm_count` SMs at
    `max_batch` requests, within [1, MAX_KV_SPLITS]."""
    programs_per_split = max(1, max_batch * num_kv_heads)
    return max(1, min(MAX_KV_SPLITS, triton.cdiv(2 * sm_count, programs_per_split)))


def decode_workspace(
    batch: int, num_heads: int, num_kv_splits: int, head_dim: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial_out [B, Hq, S, D] float32, lse [B, Hq, S] float32) for paged_decode_attention; one
    allocated for the largest batch serves every smaller one."""
    shape = (batch, num_heads, num_kv_splits, head_dim)
    partial = torch.empty(shape, dtype=torch.float32, device=device)  # [B, Hq, S, D] float32
    lse = torch.empty((batch, num_heads, num_kv_splits), dtype=torch.float32, device=device)  # [B, Hq, S] float32
    return partial, lse


def _check(q: torch.Tensor, k_buf: torch.Tensor, out: torch.Tensor, workspace, num_kv_splits: int) -> None:
    batch, num_heads, head_dim = q.shape
    partial, lse = workspace
    assert num_heads % k_buf.shape[1] == 0 and k_buf.shape[2] == head_dim and q.dtype == k_buf.dtype
    assert out.shape == q.shape
    assert 1 <= num_kv_splits <= partial.shape[2] and num_kv_splits <= lse.shape[2]
    assert partial.shape[0] >= batch and lse.shape[0] >= batch and partial.shape[1] == lse.shape[1] == num_heads
    assert partial.shape[3] == head_dim and partial.dtype == lse.dtype == torch.float32


def paged_decode_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
    num_kv_splits: int | None = None,
    *,
    sliding_window: int | None = None,
    logit_cap: float | None = None,
    block_n: int = BLOCK_N,
    num_warps: int = NUM_WARPS,
    num_stages: Optional[int] = None,
) -> torch.Tensor:
    """q [B, Hq, D] (any strides); k_buf, v_buf [S, Hk, D] -> out [B, Hq, D] (q's dtype unless the
    caller's out says otherwise). Request b attends to its KV slots
    req_to_token[req_pool_indices[b], :seq_lens[b]] (the last sliding_window of them with a
    window; logit_cap soft-caps the scores); seq_lens[b] == 0 gives zeros.

    num_kv_splits defaults to the workspace's split count, else default_num_kv_splits(B, Hk).
    With out and workspace given this neither allocates nor syncs (CUDA-graph capturable)."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_buf.shape[1]
    if num_kv_splits is None:
        num_kv_splits = workspace[1].shape[2] if workspace is not None else default_num_kv_splits(batch, num_kv_heads)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)  # [B, Hq, D]
    if workspace is None:
        workspace = decode_workspace(batch, num_heads, num_kv_splits, head_dim, q.device)
    _check(q, k_buf, out, workspace, num_kv_splits)
    if batch == 0:
        return out
    partial, lse = workspace
    if num_stages is None:
        num_stages = NUM_STAGES if head_dim * k_buf.element_size() <= STAGE3_MAX_ROW_BYTES else 2
    group = num_heads // num_kv_heads
    block_d = max(16, triton.next_power_of_2(head_dim))
    launch(_split_kernel, (batch, num_kv_heads, num_kv_splits),
        q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, partial, lse, out, scale * _LOG2E,
        *q.stride(), *k_buf.stride(), *v_buf.stride(), req_to_token.stride(0),
        *partial.stride(), *lse.stride(), *out.stride(),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK=block_n, NUM_SPLITS=num_kv_splits, WINDOW=sliding_window or 0, CAP=cap_in_log2_units(logit_cap),
        **dot_flags(q.dtype),
        num_warps=num_warps, num_stages=num_stages, pdl=True,
    )
    if num_kv_splits == 1:
        return out
    launch(_merge_kernel, (batch, num_heads),
        partial, lse, out, *partial.stride(), *lse.stride(), *out.stride(),
        HEAD_DIM=head_dim, BLOCK_D=block_d, NUM_SPLITS=num_kv_splits,
        SPLITS_PAD=max(2, triton.next_power_of_2(num_kv_splits)), num_warps=NUM_WARPS, pdl=True,
    )
    return out
