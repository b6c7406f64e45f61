"""Keyed Aaronson-Gumbel watermarking on CUDA: the selection (the function of the plain-torch
reference sglang.srt.sampling.watermarking.select.select_reference, bit for bit) and the state
update around it (the torch code of WatermarkState.force's admission and WatermarkState.append).

One program per (watermark row, split of the vocabulary). Each program hashes its row's context
(the last `length` tokens of the row's request slot in the state's right-aligned tails), picks the
key (key A, or under a dual key the per-context coin's choice of A or B), then walks its split in
blocks: u_t from the MurmurHash3 of (key, context hash, t), the float32 log u_t (direct below
2**31, log1p of the integer complement above), the score log(u_t) / p_t where p_t > 0, and the
best score with the lowest id among ties. Blocks whose probabilities are all 0 (outside a
top-k / top-p support) are skipped after loading them. A second step over the splits (torch
argmax, first maximum: the lowest split) gives the token. libdevice log / log1p and
round-to-nearest division are the functions torch's CUDA kernels use, so the float32 scores
equal the reference's. Nothing reads back to the host.

The admission kernel (one program per watermark row) checks the row's context hash against its
slot's history, applies the empty-context / full-history / entropy gates, records an admitted
context and writes the forced token; the append kernel shifts each slot's context tail by the
sampled id. Each replaces about a dozen small torch launches.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from sgl_kernel_ext.sampling.murmur import column_hash, fmix32, mix_word, row_hash_state
from sgl_kernel_ext.triton_launch import launch

BLOCK = 1024  # tokens per block
SPLIT_BLOCKS = 8  # blocks per program: 8192 tokens
_HALF = tl.constexpr(1 << 31)
_INV_TWO_32 = tl.constexpr(2.0**-32)  # exact: * 2**-32 equals / 2**32

if os.environ.get("TRITON_INTERPRET") == "1":
    # The interpreter has no libdevice: float64 forms rounded to float32 (log1p by Goldberg's
    # log(u) * x / (u - 1)), equal to torch's float32 functions up to their last-ulp rounding.

    @triton.jit
    def _log(x):
        return tl.log(x.to(tl.float64)).to(tl.float32)

    @triton.jit
    def _log1p(x):
        x64 = x.to(tl.float64)
        u = 1.0 + x64
        return tl.where(u == 1.0, x64, tl.log(u) * x64 / (u - 1.0)).to(tl.float32)

else:

    @triton.jit
    def _log(x):
        return libdevice.log(x)  # __nv_logf: torch's CUDA log

    @triton.jit
    def _log1p(x):
        return libdevice.log1p(x)  # __nv_log1pf: torch's CUDA log1p


@triton.jit(do_not_specialize=["vocab", "width", "key_b", "threshold"])
def _watermark_select_kernel(
    probs_ptr,  # [W, vocab] float32, contiguous: each row's probabilities after every filter
    slots_ptr,  # [W] int64: each row's request slot
    tails_ptr,  # [R, width] int64, contiguous: each slot's last tokens, right-aligned, oldest first
    state_lengths_ptr,  # [R] int64: each slot's tokens in its tail
    windows_ptr,  # [W] int64: each row's context window
    keys_ptr,  # [W] int64: each row's key A
    best_score_ptr,  # [W, splits] float32 out
    best_id_ptr,  # [W, splits] int32 out
    ctx_ptr,  # [W] int64 out: each row's context hash in [0, 2**32)
    vocab,
    width,
    key_b,
    threshold,
    HAS_KEY_B: tl.constexpr,
    BLOCK: tl.constexpr,
    SPLIT_BLOCKS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    slot = tl.load(slots_ptr + row)
    length = tl.minimum(tl.load(state_lengths_ptr + slot), tl.load(windows_ptr + row))
    ctx = tl.zeros([], dtype=tl.uint32)
    for col in range(0, width):
        word = tl.load(tails_ptr + slot * width + col)
        ctx = tl.where(length >= width - col, mix_word(ctx, word), ctx)
    ctx = fmix32(ctx, (4 * length).to(tl.uint32))
    ctx64 = ctx.to(tl.int64)
    key = tl.load(keys_ptr + row)
    if HAS_KEY_B:
        key_b = key_b.to(tl.int64)  # a small key arrives as a 32-bit scalar
        coin = mix_word(mix_word(tl.zeros([], dtype=tl.uint32), key), key >> 32)
        coin = mix_word(mix_word(coin, key_b), key_b >> 32)
        coin = fmix32(mix_word(coin, ctx64), 20)
        key = tl.where(coin.to(tl.int64) < threshold.to(tl.int64), key, key_b)
    state = row_hash_state(key, ctx64)
    if split == 0:
        tl.store(ctx_ptr + row, ctx64)

    best = tl.full([], float("-inf"), dtype=tl.float32)
    best_id = tl.zeros([], dtype=tl.int32)
    start = split * (SPLIT_BLOCKS * BLOCK)
    for block in range(0, SPLIT_BLOCKS):
        cols = start + block * BLOCK + tl.arange(0, BLOCK)  # [BLOCK] int32
        probs = tl.load(probs_ptr + row * vocab + cols, mask=cols < vocab, other=0.0)  # [BLOCK]
        if tl.max(probs, axis=0) > 0:
            hashed = column_hash(state, cols)  # [BLOCK] uint32
            lower = _log((hashed.to(tl.float32) + 0.5) * _INV_TWO_32)
            upper = _log1p(-(((~hashed).to(tl.float32) + 0.5) * _INV_TWO_32))  # ~h = 2**32 - 1 - h
            log_u = tl.where(hashed < _HALF, lower, upper)
            kept = probs > 0
            scores = tl.where(kept, tl.math.div_rn(log_u, tl.where(kept, probs, 1.0)), float("-inf"))  # [BLOCK]
            top = tl.max(scores, axis=0)
            top_id = tl.min(tl.where(scores == top, cols, vocab), axis=0)
            better = top > best
            best_id = tl.where(better, top_id, best_id)
            best = tl.where(better, top, best)
    tl.store(best_score_ptr + row * splits + split, best)
    tl.store(best_id_ptr + row * splits + split, best_id)


def watermark_select_triton(
    probs: torch.Tensor,
    slots: torch.Tensor,
    tails: torch.Tensor,
    state_lengths: torch.Tensor,
    windows: torch.Tensor,
    keys: torch.Tensor,
    key_b: Optional[int],
    threshold: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [W] int64, context hash [W] int64) of each watermark row: argmax_t log(u_t) / p_t
    over `probs` ([W, V] float32, contiguous; 0 outside the support). The row's context is the
    last min(state_lengths[slot], windows[row]) columns of tails[slot] ([R, H] int64)."""
    rows, vocab = probs.shape
    if not (probs.dtype == torch.float32 and probs.is_contiguous() and tails.dtype == torch.int64 and tails.is_contiguous()):
        raise ValueError("watermark_select_triton takes contiguous float32 probs [W, V] and int64 tails [R, H].")
    splits = triton.cdiv(vocab, BLOCK * SPLIT_BLOCKS)
    best_score = torch.empty((rows, splits), dtype=torch.float32, device=probs.device)  # [W, S]
    best_id = torch.empty((rows, splits), dtype=torch.int32, device=probs.device)  # [W, S]
    ctx = torch.empty(rows, dtype=torch.int64, device=probs.device)  # [W]
    if rows == 0:
        return torch.empty_like(ctx), ctx
    launch(
        _watermark_select_kernel, (rows, splits),
        probs, slots, tails, state_lengths, windows, keys, best_score, best_id, ctx,
        vocab, tails.shape[1], 0 if key_b is None else key_b, threshold,
        HAS_KEY_B=key_b is not None, BLOCK=BLOCK, SPLIT_BLOCKS=SPLIT_BLOCKS, num_warps=4,
    )
    # torch.argmax returns the first maximum: the lowest split, so the lowest id among ties.
    chosen = best_id.gather(1, best_score.argmax(dim=1, keepdim=True)).squeeze(1).to(torch.int64)  # [W]
    return chosen, ctx


@triton.jit(do_not_specialize=["capacity", "max_probability"])
def _watermark_admit_kernel(
    rows_ptr,  # [W] int64: each watermark row's batch row
    slots_ptr,  # [B] int64: each batch row's request slot
    chosen_ptr,  # [W] int64: the selected token
    ctx_ptr,  # [W] int64: the context hash in [0, 2**32)
    row_max_ptr,  # [W] float32: the largest filtered probability
    state_lengths_ptr,  # [R] int64
    windows_ptr,  # [W] int64
    history_ptr,  # [R, capacity] int32, contiguous: each slot's forced context hashes (their bits)
    counts_ptr,  # [R] int64: each slot's recorded contexts
    forced_ptr,  # [B] int64, -1 on entry: the forced token where the row is admitted
    capacity,
    max_probability,
    BLOCK: tl.constexpr,
):
    w = tl.program_id(0)
    row = tl.load(rows_ptr + w)
    slot = tl.load(slots_ptr + row)
    ctx = tl.load(ctx_ptr + w).to(tl.uint32).to(tl.int32, bitcast=True)
    count = tl.load(counts_ptr + slot).to(tl.int32)  # <= capacity <= 4096
    seen = tl.zeros([], dtype=tl.int32)
    for start in range(0, count, BLOCK):
        pos = start + tl.arange(0, BLOCK)
        recorded = tl.load(history_ptr + slot * capacity + pos, mask=pos < count, other=0)  # [BLOCK]
        seen += tl.sum(((recorded == ctx) & (pos < count)).to(tl.int32), axis=0)
    length = tl.minimum(tl.load(state_lengths_ptr + slot), tl.load(windows_ptr + w))
    admitted = (length > 0) & (seen == 0) & (count < capacity) & (tl.load(row_max_ptr + w) <= max_probability)
    if admitted:
        tl.store(history_ptr + slot * capacity + count, ctx)
        tl.store(counts_ptr + slot, count + 1)
        tl.store(forced_ptr + row, tl.load(chosen_ptr + w))


def watermark_admit_triton(
    rows: torch.Tensor,
    slots: torch.Tensor,
    chosen: torch.Tensor,
    ctx: torch.Tensor,
    row_max: torch.Tensor,
    state_lengths: torch.Tensor,
    windows: torch.Tensor,
    history: torch.Tensor,
    counts: torch.Tensor,
    batch_size: int,
    max_probability: float,
) -> torch.Tensor:
    """[B] int64: chosen[w] on each admitted watermark row, -1 elsewhere. A row is admitted when its
    context is non-empty, not in its slot's history, the history has room, and row_max <=
    max_probability; an admitted context is appended to history / counts in place (one row per slot)."""
    forced = torch.full((batch_size,), -1, dtype=torch.int64, device=chosen.device)  # [B]
    if rows.numel():
        launch(
            _watermark_admit_kernel, (rows.numel(),),
            rows, slots, chosen, ctx, row_max, state_lengths, windows, history, counts, forced,
            history.shape[1], max_probability, BLOCK=1024, num_warps=4,
        )
    return forced


@triton.jit
def _watermark_append_kernel(
    rows_ptr,  # [W] int64: each watermark row's batch row
    slots_ptr,  # [B] int64: each batch row's request slot
    next_ids_ptr,  # [B] int64: each batch row's sampled token
    tails_ptr,  # [R, WIDTH] int64, contiguous
    state_lengths_ptr,  # [R] int64
    WIDTH: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    row = tl.load(rows_ptr + tl.program_id(0))
    slot = tl.load(slots_ptr + row)
    cols = tl.arange(0, BLOCK_H)  # [BLOCK_H]
    shifted = tl.load(tails_ptr + slot * WIDTH + cols + 1, mask=cols + 1 < WIDTH, other=0)
    tl.debug_barrier()  # every thread's load of the old tail before any store over it
    tail = tl.where(cols == WIDTH - 1, tl.load(next_ids_ptr + row), shifted)
    tl.store(tails_ptr + slot * WIDTH + cols, tail, mask=cols < WIDTH)
    tl.store(state_lengths_ptr + slot, tl.minimum(tl.load(state_lengths_ptr + slot) + 1, WIDTH))


def watermark_append_triton(
    rows: torch.Tensor, slots: torch.Tensor, next_ids: torch.Tensor, tails: torch.Tensor, state_lengths: torch.Tensor
) -> None:
    """Shift each watermark row's slot tail (tails [R, H] int64) left by one, put the row's sampled id
    (next_ids [B]) last, and count it in state_lengths (at most H), in place."""
    if rows.numel():
        width = tails.shape[1]
        launch(
            _watermark_append_kernel, (rows.numel(),),
            rows, slots, next_ids, tails, state_lengths, WIDTH=width, BLOCK_H=triton.next_power_of_2(width), num_warps=1,
        )
