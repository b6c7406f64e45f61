"""In-kernel MurmurHash3 x86-32 of (seed lo, seed hi, position, token id) and its Gumbel noise.

Bit-identical to python/sglang/srt/layers/utils/hash.py (murmur_hash32 / hash_gumbel): the same
four blocks, initial state 0, length 16, and the same float64 transform of the hash, so a seeded
row draws the same token whether the CPU reference or a Triton kernel computed its noise.
"""

import triton
import triton.language as tl

_LOG_CLAMP_MAX = tl.constexpr(-(2.0**-32))
_LOG_CLAMP_MIN = tl.constexpr(-1.7976931348623157e308)
_UINT32_MAX = tl.constexpr(4294967295.0)


@triton.jit
def _rotl32(x, r: tl.constexpr):
    return (x << r) | (x >> (32 - r))


@triton.jit
def _mix_block(h, k):
    """One body step of MurmurHash3 x86-32 on uint32 values."""
    k = k * 0xCC9E2D51
    k = _rotl32(k, 15)
    k = k * 0x1B873593
    h = _rotl32(h ^ k, 13)
    return h * 5 + 0xE6546B64


@triton.jit
def row_hash_state(seed, position):
    """Hash state after blocks 1-3 (seed lo, seed hi, position); seed and position are int64 scalars."""
    lo = (seed & 0xFFFFFFFF).to(tl.uint32)
    hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    pos = (position & 0xFFFFFFFF).to(tl.uint32)
    h = _mix_block(tl.zeros_like(lo), lo)
    h = _mix_block(h, hi)
    return _mix_block(h, pos)


@triton.jit
def hash_gumbel(state, cols):
    """Gumbel noise (float64) of each token id in `cols` for a row whose state is `state`."""
    h = _mix_block(state, cols.to(tl.uint32))
    h = h ^ 16
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    h = h ^ (h >> 16)
    u = h.to(tl.float64) / _UINT32_MAX
    log_u = tl.minimum(tl.maximum(tl.log(u), _LOG_CLAMP_MIN), _LOG_CLAMP_MAX)
    return -tl.log(-log_u)
