"""In-kernel MurmurHash3 x86-32 of (seed lo, seed hi, position, token id) and its Gumbel noise.

Bit-identical to the torch definition in murmur_reference.py (murmur_hash32 / hash_gumbel), whose
constants it takes: the same four blocks, initial state 0, length 16, and the same float64
transform of the hash, so a seeded row draws the same token whether the torch path or a Triton
kernel computed its noise.
"""

import triton
import triton.language as tl

from sgl_kernel_ext.sampling import murmur_reference as ref

_C1 = tl.constexpr(ref.C1)
_C2 = tl.constexpr(ref.C2)
_BODY_ADD = tl.constexpr(ref.BODY_ADD)
_FMIX1 = tl.constexpr(ref.FMIX1)
_FMIX2 = tl.constexpr(ref.FMIX2)
_LENGTH = tl.constexpr(ref.LENGTH)
_MASK32 = tl.constexpr(ref.MASK32)
_LOG_CLAMP_MAX = tl.constexpr(ref.LOG_CLAMP_MAX)
_LOG_CLAMP_MIN = tl.constexpr(ref.LOG_CLAMP_MIN)
_UINT32_MAX = tl.constexpr(ref.UINT32_MAX)


@triton.jit
def _rotl32(x, r: tl.constexpr):
    return (x << r) | (x >> (32 - r))


@triton.jit
def _mix_block(h, k):
    """One body step of MurmurHash3 x86-32 on uint32 values."""
    k = k * _C1
    k = _rotl32(k, 15)
    k = k * _C2
    h = _rotl32(h ^ k, 13)
    return h * 5 + _BODY_ADD


@triton.jit
def row_hash_state(seed, position):
    """Hash state after blocks 1-3 (seed lo, seed hi, position); seed and position are int64 scalars."""
    lo = (seed & _MASK32).to(tl.uint32)
    hi = ((seed >> 32) & _MASK32).to(tl.uint32)
    pos = (position & _MASK32).to(tl.uint32)
    h = _mix_block(tl.zeros_like(lo), lo)
    h = _mix_block(h, hi)
    return _mix_block(h, pos)


@triton.jit
def mix_word(h, word):
    """One body step on a uint32 state `h` with an int64 word (its low 32 bits are mixed)."""
    return _mix_block(h, (word & _MASK32).to(tl.uint32))


@triton.jit
def fmix32(h, length):
    """The finaliser of a uint32 state `h` after `length` bytes (uint32)."""
    h = h ^ length
    h = h ^ (h >> 16)
    h = h * _FMIX1
    h = h ^ (h >> 13)
    h = h * _FMIX2
    return h ^ (h >> 16)


@triton.jit
def column_hash(state, cols):
    """uint32 hash of each token id in `cols` for a row whose state is `state` (blocks 1-3 mixed)."""
    return fmix32(_mix_block(state, cols.to(tl.uint32)), _LENGTH)


@triton.jit
def hash_gumbel(state, cols):
    """Gumbel noise (float64) of each token id in `cols` for a row whose state is `state`."""
    h = column_hash(state, cols)
    u = h.to(tl.float64) / _UINT32_MAX
    log_u = tl.minimum(tl.maximum(tl.log(u), _LOG_CLAMP_MIN), _LOG_CLAMP_MAX)
    return -tl.log(-log_u)
