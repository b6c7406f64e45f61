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
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from sgl_kernel_ext.sampling.murmur import column_hash, fmix32, mix_word, row_hash_state
from sgl_kernel_ext.triton_launch import launch, pdl_sync

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

    @triton.jit
    def _exp(x):
        return tl.exp(x.to(tl.float64)).to(tl.float32)

else:

    @triton.jit
    def _log(x):
        return libdevice.log(x)  # __nv_logf: torch's CUDA log

    @triton.jit
    def _log1p(x):
        return libdevice.log1p(x)  # __nv_log1pf: torch's CUDA log1p

    @triton.jit
    def _exp(x):
        return libdevice.exp(x)  # __nv_expf: torch's CUDA exp


# The row statistics are views at offsets that vary with the batch: unspecialised, so their alignment
# never compiles a new variant in the middle of serving.
@triton.jit(do_not_specialize=["temps_ptr", "thr_ptr", "lse_ptr", "vocab", "stride", "width", "key_b", "threshold"])
def _watermark_select_kernel(
    src_ptr,  # float32 rows of `stride`: each row's probabilities after every filter [W, V], or (FROM_STATS) the
    #           batch's processed logits [B, V], whose probabilities come from the sampler's row statistics
    rows_ptr,  # [W] int64 (FROM_STATS): each row's batch row
    temps_ptr,  # [B] float32 (FROM_STATS): each batch row's temperature
    thr_ptr,  # [B] float32 (FROM_STATS): the sampler's support threshold over logits / temperature
    lse_ptr,  # [B] float32 (FROM_STATS): the logsumexp of logits / temperature over the support
    active_ptr,  # [W] bool (HAS_ACTIVE): rows that are watermarked (others pick nothing)
    slots_ptr,  # [W] int64: each row's request slot
    tails_ptr,  # [R, width] int64, contiguous: each slot's last tokens, right-aligned, oldest first
    state_lengths_ptr,  # [R] int64: each slot's tokens in its tail
    windows_ptr,  # [W] int64: each row's context window
    keys_ptr,  # [W] int64: each row's key A
    best_score_ptr,  # [W, splits] float32 out
    best_id_ptr,  # [W, splits] int32 out
    best_p_ptr,  # [W, splits] float32 out: the split's largest probability
    ctx_ptr,  # [W] int64 out: each row's context hash in [0, 2**32)
    vocab,
    stride,
    width,
    key_b,
    threshold,
    FROM_STATS: tl.constexpr,
    HAS_ACTIVE: tl.constexpr,
    HAS_KEY_B: tl.constexpr,
    BLOCK: tl.constexpr,
    SPLIT_BLOCKS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    blocks = SPLIT_BLOCKS
    if HAS_ACTIVE:
        blocks = tl.where(tl.load(active_ptr + row), SPLIT_BLOCKS, 0)
    slot = tl.where(blocks > 0, tl.load(slots_ptr + row), 0)  # an inactive row's slot may be padding
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

    src_row = row
    if FROM_STATS:
        src_row = tl.load(rows_ptr + row)
        temperature = tl.load(temps_ptr + src_row)
        support_threshold = tl.load(thr_ptr + src_row)
        lse = tl.load(lse_ptr + src_row)
    best = tl.full([], float("-inf"), dtype=tl.float32)
    best_id = tl.zeros([], dtype=tl.int32)
    best_p = tl.zeros([], dtype=tl.float32)
    start = split * (SPLIT_BLOCKS * BLOCK)
    for block in range(0, blocks):
        cols = start + block * BLOCK + tl.arange(0, BLOCK)  # [BLOCK] int32
        if FROM_STATS:
            x = tl.load(src_ptr + src_row * stride + cols, mask=cols < vocab, other=float("-inf"))  # [BLOCK]
            scaled = tl.math.div_rn(x, temperature)
            probs = tl.where(scaled >= support_threshold, _exp(scaled - lse), 0.0)
        else:
            probs = tl.load(src_ptr + src_row * stride + cols, mask=cols < vocab, other=0.0)  # [BLOCK]
        block_p = tl.max(probs, axis=0)
        best_p = tl.maximum(best_p, block_p)
        if block_p > 0:
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
    tl.store(best_p_ptr + row * splits + split, best_p)


class SupportStats(NamedTuple):
    """The probabilities a sampling kernel drew from, as its per-row statistics: for watermark row
    w on batch row b = rows[w], p_t = exp(s_t - lse_kept[b]) where s_t = logits[b, t] /
    temperatures[b] >= threshold[b], else 0 (temperatures, threshold, lse_kept: [B] float32)."""

    rows: torch.Tensor  # [W] int64
    temperatures: torch.Tensor
    threshold: torch.Tensor
    lse_kept: torch.Tensor


def watermark_select_triton(
    src: torch.Tensor,
    slots: torch.Tensor,
    tails: torch.Tensor,
    state_lengths: torch.Tensor,
    windows: torch.Tensor,
    keys: torch.Tensor,
    key_b: Optional[int],
    threshold: int,
    stats: Optional[SupportStats] = None,
    active: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token [W] int64, context hash [W] int64, largest probability [W] float32) of each watermark
    row: argmax_t log(u_t) / p_t. Without `stats`, `src` holds the probabilities ([W, V] float32,
    contiguous; 0 outside the support); with them, `src` is the batch's processed logits ([B, V]
    float32, unit column stride) and the probabilities are never materialised. The row's context
    is the last min(state_lengths[slot], windows[row]) columns of tails[slot] ([R, H] int64).
    `active` ([W] bool, or None: every row): inactive rows pick nothing, and their slots are never
    read."""
    if not (src.dtype == torch.float32 and (src.stride(1) == 1 if stats is not None else src.is_contiguous())):
        raise ValueError("watermark_select_triton takes contiguous float32 probs [W, V], or float32 logits [B, V] "
                         "with unit column stride and their support statistics.")
    if not (tails.dtype == torch.int64 and tails.is_contiguous()):
        raise ValueError("the watermark kernels take contiguous int64 tails [R, H].")
    count, vocab = keys.shape[0], src.shape[1]
    splits = triton.cdiv(vocab, BLOCK * SPLIT_BLOCKS)
    best_score = torch.empty((count, splits), dtype=torch.float32, device=src.device)  # [W, S]
    best_id = torch.empty((count, splits), dtype=torch.int32, device=src.device)  # [W, S]
    best_p = torch.empty((count, splits), dtype=torch.float32, device=src.device)  # [W, S]
    ctx = torch.empty(count, dtype=torch.int64, device=src.device)  # [W]
    if count == 0:
        return torch.empty_like(ctx), ctx, best_p[:, 0]
    # Without statistics their pointers get placeholders, never read.
    rows, temperatures, support_threshold, lse_kept = (src,) * 4 if stats is None else stats
    launch(
        _watermark_select_kernel, (count, splits),
        src, rows, temperatures.reshape(-1), support_threshold, lse_kept,
        keys if active is None else active, slots, tails, state_lengths, windows, keys, best_score, best_id, best_p, ctx,
        vocab, src.stride(0), tails.shape[1], 0 if key_b is None else key_b, threshold,
        FROM_STATS=stats is not None, HAS_ACTIVE=active is not None, HAS_KEY_B=key_b is not None,
        BLOCK=BLOCK, SPLIT_BLOCKS=SPLIT_BLOCKS, num_warps=4, pdl=True,
    )
    # torch.argmax returns the first maximum: the lowest split, so the lowest id among ties.
    chosen = best_id.gather(1, best_score.argmax(dim=1, keepdim=True)).squeeze(1).to(torch.int64)  # [W]
    return chosen, ctx, best_p.amax(dim=1)


@triton.jit
def _live_slot(w, rows_ptr, active_ptr, slots_ptr, HAS_ACTIVE: tl.constexpr):
    """Watermarked row w's batch row, active flag and state slot (0 for an inactive row, whose
    slot may be padding)."""
    row = tl.load(rows_ptr + w)
    live = tl.full([], 1, tl.int1)
    if HAS_ACTIVE:
        live = tl.load(active_ptr + w)
    return row, live, tl.where(live, tl.load(slots_ptr + row), 0)


@triton.jit(do_not_specialize=["capacity", "max_probability"])
def _watermark_admit_kernel(
    rows_ptr,  # [W] int64: each watermark row's batch row
    active_ptr,  # [W] bool (HAS_ACTIVE): rows that are watermarked (others are never admitted)
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
    HAS_ACTIVE: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    w = tl.program_id(0)
    row, live, slot = _live_slot(w, rows_ptr, active_ptr, slots_ptr, HAS_ACTIVE)
    ctx = tl.load(ctx_ptr + w).to(tl.uint32).to(tl.int32, bitcast=True)
    count = tl.where(live, tl.load(counts_ptr + slot).to(tl.int32), 0)  # <= capacity <= 4096
    seen = tl.zeros([], dtype=tl.int32)
    for start in range(0, count, BLOCK):
        pos = start + tl.arange(0, BLOCK)
        recorded = tl.load(history_ptr + slot * capacity + pos, mask=pos < count, other=0)  # [BLOCK]
        seen += tl.sum(((recorded == ctx) & (pos < count)).to(tl.int32), axis=0)
    length = tl.minimum(tl.load(state_lengths_ptr + slot), tl.load(windows_ptr + w))
    row_max = tl.load(row_max_ptr + w)  # 0 on a row with no finite probability (NaN or all -inf logits)
    admitted = live & (length > 0) & (seen == 0) & (count < capacity) & (row_max > 0) & (row_max <= max_probability)
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
    active: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """[B] int64: chosen[w] on each admitted watermark row, -1 elsewhere. A row is admitted when its
    context is non-empty, not in its slot's history, the history has room, and 0 < row_max <=
    max_probability (a row without a finite probability, whose logits were NaN or all -inf, never is); an admitted context is appended to history / counts in place (one row per
    slot). `active` ([W] bool, or None: every row): inactive rows are never admitted."""
    forced = torch.full((batch_size,), -1, dtype=torch.int64, device=chosen.device)  # [B]
    if rows.numel():
        launch(
            _watermark_admit_kernel, (rows.numel(),),
            rows, rows if active is None else active, slots, chosen, ctx, row_max, state_lengths, windows, history,
            counts, forced, history.shape[1], max_probability, HAS_ACTIVE=active is not None, BLOCK=1024, num_warps=4,
            pdl=True,
        )
    return forced


@triton.jit
def _watermark_append_kernel(
    rows_ptr,  # [W] int64: each watermark row's batch row
    active_ptr,  # [W] bool (HAS_ACTIVE): rows that are watermarked (others leave their slot alone)
    slots_ptr,  # [B] int64: each batch row's request slot
    next_ids_ptr,  # [B] int64: each batch row's sampled token
    tails_ptr,  # [R, WIDTH] int64, contiguous
    state_lengths_ptr,  # [R] int64
    HAS_ACTIVE: tl.constexpr,
    WIDTH: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    w = tl.program_id(0)
    row, live, slot = _live_slot(w, rows_ptr, active_ptr, slots_ptr, HAS_ACTIVE)
    cols = tl.arange(0, BLOCK_H)  # [BLOCK_H]
    shifted = tl.load(tails_ptr + slot * WIDTH + cols + 1, mask=cols + 1 < WIDTH, other=0)
    tl.debug_barrier()  # every thread's load of the old tail before any store over it
    tail = tl.where(cols == WIDTH - 1, tl.load(next_ids_ptr + row), shifted)
    if live:  # an inactive row writes nothing: its stand-in slot 0 may be another row's
        tl.store(tails_ptr + slot * WIDTH + cols, tail, mask=cols < WIDTH)
        tl.store(state_lengths_ptr + slot, tl.minimum(tl.load(state_lengths_ptr + slot) + 1, WIDTH))


def watermark_append_triton(
    rows: torch.Tensor, slots: torch.Tensor, next_ids: torch.Tensor, tails: torch.Tensor, state_lengths: torch.Tensor,
    active: Optional[torch.Tensor] = None,
) -> None:
    """Shift each watermark row's slot tail (tails [R, H] int64) left by one, put the row's sampled id
    (next_ids [B]) last, and count it in state_lengths (at most H), in place. `active` ([W] bool,
    or None: every row): inactive rows change nothing."""
    if rows.numel():
        width = tails.shape[1]
        launch(
            _watermark_append_kernel, (rows.numel(),),
            rows, rows if active is None else active, slots, next_ids, tails, state_lengths,
            HAS_ACTIVE=active is not None, WIDTH=width, BLOCK_H=triton.next_power_of_2(width), num_warps=1, pdl=True,
        )
