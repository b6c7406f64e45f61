"""The watermark's token of each watermark row: argmax_t log(u_t) / p_t over the row's filtered
probabilities, ties to the lowest id, u_t from hashing.token_hashes.

select_reference is the plain definition (the whole vocabulary in int64). select_tokens is what the
sampler runs, with the same result bit for bit: with kernels (CUDA) the Triton kernel
(sgl_kernel_ext/sampling/watermark_triton.py, context hash and key choice fused in); on the CPU
the hash of only the support's descending window when it holds every kept token (top-k / top-p
rows), else the vocabulary's hash in int32 arithmetic over cache-sized row chunks.
"""

from __future__ import annotations

from typing import Optional

import torch

from sgl_kernel_ext.sampling.murmur_reference import C1, C2, murmur_hash32
from sgl_kernel_ext.sampling.support import Support
from sglang.srt.sampling.watermarking.hashing import context_hashes, key_coins, log_uniform, token_hashes

_TWO_32 = 4294967296.0
# Elements per CPU chunk: the int32 hash's ~20 passes then stay in cache.
_CPU_CHUNK_ELEMENTS = 1 << 16


def row_keys(keys: torch.Tensor, key_b: Optional[int], threshold: int, ctx: torch.Tensor) -> torch.Tensor:
    """[W] int64: key A ([W] int64), or under a dual key B where the context's coin is >= threshold."""
    if key_b is None:
        return keys
    other = torch.full_like(keys, key_b)
    return torch.where(key_coins(keys, other, ctx) < threshold, keys, other)


def select_reference(probs: torch.Tensor, keys: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
    """[W] int64 token of each row: probs [W, V] float32 (0 outside the support), keys and
    context hashes [W] int64."""
    scores = log_uniform(token_hashes(keys, ctx, probs.shape[1])) / probs  # [W, V]
    return torch.where(probs > 0, scores, torch.full_like(scores, float("-inf"))).argmax(dim=1)


def select_window(probs: torch.Tensor, keys: torch.Tensor, ctx: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """select_reference when every token with p > 0 is among `ids` ([W, K] int64 token ids per row)."""
    window_probs = probs.gather(1, ids)  # [W, K]
    scores = log_uniform(murmur_hash32(keys, ctx, ids)) / window_probs  # [W, K]
    scores = torch.where(window_probs > 0, scores, torch.full_like(scores, float("-inf")))
    top = scores.amax(dim=1, keepdim=True)  # [W, 1]
    return torch.where(scores == top, ids, torch.full_like(ids, probs.shape[1])).amin(dim=1)


def _signed32(c: int) -> int:
    return c - (1 << 32) if c >= (1 << 31) else c


def _shr32(x: torch.Tensor, r: int) -> torch.Tensor:
    """Logical right shift of int32 bits (torch's >> is arithmetic)."""
    return (x >> r) & ((1 << (32 - r)) - 1)


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return (x << r) | _shr32(x, 32 - r)


def _as_int32(x: torch.Tensor) -> torch.Tensor:
    """uint32 values in int64 -> the int32 with the same bits."""
    return torch.where(x >= (1 << 31), x - (1 << 32), x).to(torch.int32)


def _scramble32(k: torch.Tensor) -> torch.Tensor:
    """A block's k * C1, rotl 15, * C2 in int32 (products wrap mod 2**32 in two's complement)."""
    return _rotl32(k * _signed32(C1), 15) * _signed32(C2)


def _mix_scrambled32(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The body step after the scramble: rotl(h ^ k, 13) * 5 + 0xE6546B64 in int32."""
    return _rotl32(h ^ k, 13) * 5 + _signed32(0xE6546B64)


def _hash_columns32_(h: torch.Tensor, state: torch.Tensor, col_block: torch.Tensor, scratch: torch.Tensor) -> None:
    """h ([r, V] int32) = the token hashes of rows with blocks 1-3 mixed into `state` ([r, 1]) and
    scrambled token blocks `col_block` ([V]), in place over preallocated buffers (a fresh
    [r, V] tensor per pass would cost more than the pass)."""
    torch.bitwise_xor(state, col_block, out=h)
    _rotl32_(h, 13, scratch)
    h.mul_(5).add_(_signed32(0xE6546B64)).bitwise_xor_(16)
    for shift, factor in ((16, 0x85EBCA6B), (13, 0xC2B2AE35), (16, None)):
        torch.bitwise_right_shift(h, shift, out=scratch)
        h.bitwise_xor_(scratch.bitwise_and_((1 << (32 - shift)) - 1))
        if factor is not None:
            h.mul_(_signed32(factor))


def _rotl32_(x: torch.Tensor, r: int, scratch: torch.Tensor) -> None:
    torch.bitwise_right_shift(x, 32 - r, out=scratch)
    x.bitwise_left_shift_(r).bitwise_or_(scratch.bitwise_and_((1 << r) - 1))


def select_full_cpu(probs: torch.Tensor, keys: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
    """select_reference over the whole vocabulary, in int32 over cache-sized row chunks."""
    rows, vocab = probs.shape
    state = torch.zeros(rows, dtype=torch.int32)  # [W]: blocks 1-3 (key lo, key hi, context hash)
    for word in (keys & 0xFFFFFFFF, (keys >> 32) & 0xFFFFFFFF, ctx):
        state = _mix_scrambled32(state, _scramble32(_as_int32(word)))
    col_block = _scramble32(torch.arange(vocab, dtype=torch.int32))  # [V] each token id's block
    step = max(1, _CPU_CHUNK_ELEMENTS // max(vocab, 1))
    shape = (min(step, rows), vocab)
    h, scratch = torch.empty(shape, dtype=torch.int32), torch.empty(shape, dtype=torch.int32)  # [r, V]
    low, upper = torch.empty(shape, dtype=torch.float32), torch.empty(shape, dtype=torch.float32)  # [r, V]
    keep = torch.empty(shape, dtype=torch.bool)  # [r, V]
    chosen = torch.empty(rows, dtype=torch.int64)  # [W]
    for start in range(0, rows, step):
        r = min(step, rows - start)
        hb, sb, lb, ub, kb, p = h[:r], scratch[:r], low[:r], upper[:r], keep[:r], probs[start : start + r]
        _hash_columns32_(hb, state[start : start + r, None], col_block, sb)
        # log_uniform: below 2**31 the hash, above it its complement to 2**32 - 1 (the bitwise not).
        torch.bitwise_right_shift(hb, 31, out=sb)
        ub.copy_(sb.bitwise_xor_(hb)).add_(0.5).div_(_TWO_32)
        torch.log(ub, out=lb)
        ub.neg_().log1p_()
        torch.ge(hb, 0, out=kb)
        torch.where(kb, lb, ub, out=lb)
        torch.gt(p, 0, out=kb)
        lb.div_(p).masked_fill_(kb.logical_not_(), float("-inf"))
        chosen[start : start + r] = lb.argmax(dim=1)
    return chosen


def select_tokens(
    probs: torch.Tensor,
    support: Optional[Support],
    slots: torch.Tensor,
    tails: torch.Tensor,
    state_lengths: torch.Tensor,
    windows: torch.Tensor,
    keys: torch.Tensor,
    key_b: Optional[int],
    threshold: int,
    kernel: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token [W] int64, context hash [W] int64, largest probability [W] float32) of each
    watermark row. probs [W, V] float32 after
    every filter; support the filter's window when one ran (None: the whole vocabulary); the row's
    context is the last min(state_lengths[slot], windows[row]) columns of tails[slot] ([R, H]);
    `kernel`: through the Triton kernel (CUDA, or the interpreter in tests)."""
    if kernel:
        from sgl_kernel_ext.sampling.watermark_triton import watermark_select_triton

        return watermark_select_triton(probs.contiguous(), slots, tails, state_lengths, windows, keys, key_b, threshold)
    lengths = torch.minimum(state_lengths.index_select(0, slots), windows)  # [W]
    ctx = context_hashes(tails.index_select(0, slots), lengths)  # [W] int64
    keys = row_keys(keys, key_b, threshold, ctx)
    if probs.device.type != "cpu":
        chosen = select_reference(probs, keys, ctx)
    elif support is not None and support.window_draws():  # every kept token is in the window
        chosen = select_window(probs, keys, ctx, support.idx)
    else:
        chosen = select_full_cpu(probs, keys, ctx)
    return chosen, ctx, probs.amax(dim=1)
