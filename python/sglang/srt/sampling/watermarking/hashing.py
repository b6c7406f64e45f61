"""The watermark hash on the device, batched over rows (int64 tensors holding uint32 values).

token_hash(key, context_hash, t) is MurmurHash3 x86-32 of (key lo, key hi, context hash, t),
length 16: the seeded sampler's hash with the context hash in the position's place, so it is
sgl_kernel_ext.sampling.murmur_reference.murmur_hash32 (and the Triton kernels' in-kernel hash).
The context hash and the dual-key coin hash a variable number of words; they are defined here,
per row, and match detector.py's scalar functions bit for bit.
"""

from __future__ import annotations

from typing import Sequence

import torch

from sgl_kernel_ext.sampling.murmur_reference import murmur_hash32

_MASK32 = 0xFFFFFFFF
_TWO_32 = 4294967296.0


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """x * c mod 2**32 for x in [0, 2**32): split c into 16-bit halves so nothing leaves int64."""
    return ((x & 0xFFFF) * ((c >> 16) << 16) + x * (c & 0xFFFF)) & _MASK32


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def _mix(h: torch.Tensor, word: torch.Tensor) -> torch.Tensor:
    k = _mul32(_rotl32(_mul32(word & _MASK32, 0xCC9E2D51), 15), 0x1B873593)
    return (_mul32(_rotl32(h ^ k, 13), 5) + 0xE6546B64) & _MASK32


def _fmix(h: torch.Tensor, length: torch.Tensor | int) -> torch.Tensor:
    h = h ^ length
    h = _mul32(h ^ (h >> 16), 0x85EBCA6B)
    h = _mul32(h ^ (h >> 13), 0xC2B2AE35)
    return h ^ (h >> 16)


def murmur_words(words: Sequence[torch.Tensor]) -> torch.Tensor:
    """[W] int64: MurmurHash3 x86-32 (seed 0) of each row's words (each [W] int64), length 4 * len(words)."""
    h = torch.zeros_like(words[0])
    for word in words:
        h = _mix(h, word)
    return _fmix(h, 4 * len(words))


def context_hashes(tails: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[W] int64 hash of each row's context: the last `lengths[i]` columns of `tails` ([W, H] int64,
    right-aligned, oldest first); a row of length 0 hashes the empty context."""
    width = tails.shape[1]
    h = torch.zeros(tails.shape[0], dtype=torch.int64, device=tails.device)  # [W]
    for col in range(width):
        used = lengths >= width - col  # [W] bool: this column is inside the row's context
        h = torch.where(used, _mix(h, tails[:, col]), h)
    return _fmix(h, 4 * lengths.to(torch.int64))


def token_hashes(keys: torch.Tensor, ctx_hashes: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[W, V] int64 token hash of every token id for each row's (key [W] int64, context hash [W])."""
    return murmur_hash32(keys, ctx_hashes, torch.arange(vocab_size, device=keys.device))


def key_coins(keys_a: torch.Tensor, keys_b: torch.Tensor, ctx_hashes: torch.Tensor) -> torch.Tensor:
    """[W] int64 dual-key coin of (key A, key B, context hash)."""
    return murmur_words((keys_a & _MASK32, (keys_a >> 32) & _MASK32, keys_b & _MASK32, (keys_b >> 32) & _MASK32, ctx_hashes))


def log_uniform(hashed: torch.Tensor) -> torch.Tensor:
    """float32 log u for u = (hash + 0.5) / 2**32: directly below 2**31, and above it as
    log1p(-(2**32 - hash - 0.5) / 2**32) from the integer complement, which keeps the values
    near u = 1 distinct in float32."""
    lower = torch.log((hashed.to(torch.float32) + 0.5) / _TWO_32)
    upper = torch.log1p(-((_MASK32 - hashed).to(torch.float32) + 0.5) / _TWO_32)
    return torch.where(hashed < (1 << 31), lower, upper)
