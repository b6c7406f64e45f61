"""Keyed Aaronson-Gumbel watermark selection on CUDA: the function of the plain-torch reference
sglang.srt.sampling.watermarking.select.select_reference, bit for bit.

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
    ctx = tl.zeros((), dtype=tl.uint32)
    for col in range(0, width):
        word = tl.load(tails_ptr + slot * width + col)
        ctx = tl.where(length >= width - col, mix_word(ctx, word), ctx)
    ctx = fmix32(ctx, (4 * length).to(tl.uint32))
    ctx64 = ctx.to(tl.int64)
    key = tl.load(keys_ptr + row)
    if HAS_KEY_B:
        key_b = key_b.to(tl.int64)  # a small key arrives as a 32-bit scalar
        coin = mix_word(mix_word(tl.zeros((), dtype=tl.uint32), key), key >> 32)
        coin = mix_word(mix_word(coin, key_b), key_b >> 32)
        coin = fmix32(mix_word(coin, ctx64), 20)
        key = tl.where(coin.to(tl.int64) < threshold.to(tl.int64), key, key_b)
    state = row_hash_state(key, ctx64)
    if split == 0:
        tl.store(ctx_ptr + row, ctx64)

    best = tl.full((), float("-inf"), dtype=tl.float32)
    best_id = tl.zeros((), dtype=tl.int32)
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
