"""Counter-based hash noise for seeded sampling in plain torch: the one torch definition of it.

The hash of (seed, position, column) is MurmurHash3 x86-32 over four 32-bit blocks (seed low,
seed high, position, column) with initial state 0 and length 16. Each value depends only on its
own triple, so seeded rows are independent of batch layout. The Triton kernels (murmur.py)
compute the same bits in-kernel; sglang uses this module through sglang.srt.layers.utils.hash.

Everything runs on int64 tensors holding values in [0, 2**32). A product of two 32-bit
values does not fit in int64, so every multiplication by a 32-bit constant is split into
16-bit halves of the constant (see `_mul32_`). Blocks 1-3 do not depend on the column:
they are mixed once per row, and only the column block and the finaliser run at [n, m].

Columns are either shared by all rows ([m], e.g. the whole vocabulary) or given per row
([n, m], e.g. each row's top-k token ids); the hash of a (seed, position, column) triple is
the same either way.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

MASK32 = 0xFFFFFFFF
C1 = 0xCC9E2D51
C2 = 0x1B873593
BODY_ADD = 0xE6546B64
FMIX1 = 0x85EBCA6B
FMIX2 = 0xC2B2AE35
LENGTH = 16  # four 4-byte blocks
UINT32_MAX = float(2**32 - 1)
LOG_CLAMP_MAX = -(2.0**-32)
LOG_CLAMP_MIN = -torch.finfo(torch.float64).max

# Elements per row chunk on the CPU. The ~22 elementwise passes then hit cache (2 MiB per
# buffer) instead of streaming [n, m] through memory each time; much smaller chunks lose
# more to per-op overhead than they gain.
_CPU_CHUNK_ELEMENTS = 1 << 18


# ----------------------------------------------------------------------------------------
# Scalar reference (tests and documentation of the exact algorithm)
# ----------------------------------------------------------------------------------------


def _rotl32_int(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & MASK32


def murmur_hash32_scalar(seed: int, position: int, column: int) -> int:
    """MurmurHash3 x86-32 of the blocks (seed lo, seed hi, position, column); seed as uint64."""
    seed &= (1 << 64) - 1
    blocks = (seed & MASK32, seed >> 32, position & MASK32, column & MASK32)
    h = 0
    for k in blocks:
        k = (k * C1) & MASK32
        k = _rotl32_int(k, 15)
        k = (k * C2) & MASK32
        h = _rotl32_int(h ^ k, 13)
        h = (h * 5 + BODY_ADD) & MASK32
    h ^= LENGTH
    h ^= h >> 16
    h = (h * FMIX1) & MASK32
    h ^= h >> 13
    h = (h * FMIX2) & MASK32
    h ^= h >> 16
    return h


# ----------------------------------------------------------------------------------------
# Tensor implementation
# ----------------------------------------------------------------------------------------


def _mul32_(x: torch.Tensor, c: int, scratch: torch.Tensor) -> torch.Tensor:
    """x = x * c mod 2**32 in place, for x in [0, 2**32) and a 32-bit constant c.

    x * c = (x * c_hi) << 16 + x * c_lo. Only the low 16 bits of x * c_hi survive the
    shift mod 2**32, so (x & 0xFFFF) * (c_hi << 16) < 2**48 gives that term exactly, and
    x * c_lo < 2**48: no intermediate leaves int64.
    """
    torch.bitwise_and(x, 0xFFFF, out=scratch)
    scratch.mul_((c >> 16) << 16)
    torch.add(scratch, x, alpha=c & 0xFFFF, out=x)
    return x.bitwise_and_(MASK32)


def _rotl32_(x: torch.Tensor, r: int, scratch: torch.Tensor) -> torch.Tensor:
    """x = rotl32(x, r) in place without the final mask (bits above 31 stay set).

    Callers that only multiply/add afterwards can defer the mask: mod 2**32 arithmetic
    does not care about the high bits.
    """
    torch.bitwise_right_shift(x, 32 - r, out=scratch)
    x.bitwise_left_shift_(r)
    return x.bitwise_or_(scratch)


def _scramble_block(k: torch.Tensor) -> torch.Tensor:
    """The per-block k-scramble: k*C1, rotl 15, k*C2. k in [0, 2**32); returns a new tensor."""
    k = k.clone()
    scratch = torch.empty_like(k)
    _mul32_(k, C1, scratch)
    _rotl32_(k, 15, scratch).bitwise_and_(MASK32)
    return _mul32_(k, C2, scratch)


def _mix_into_(h: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """Body step after `h ^= k`: h = rotl(h, 13) * 5 + 0xE6546B64 (mod 2**32), in place."""
    _rotl32_(h, 13, scratch)
    return h.mul_(5).add_(BODY_ADD).bitwise_and_(MASK32)


def _xorshift_(h: torch.Tensor, shift: int, scratch: torch.Tensor) -> torch.Tensor:
    torch.bitwise_right_shift(h, shift, out=scratch)
    return h.bitwise_xor_(scratch)


def _row_state(seed: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Hash state after blocks 1-3 (seed lo, seed hi, position). [n] -> [n, 1] int64."""
    # & on int64 reads the two's complement bits, so a negative seed acts as seed + 2**64.
    blocks = (
        seed & MASK32,
        (seed >> 32) & MASK32,
        positions.to(torch.int64) & MASK32,
    )
    h = torch.zeros_like(seed)  # [n] int64
    scratch = torch.empty_like(seed)
    for k in blocks:
        h.bitwise_xor_(_scramble_block(k))
        _mix_into_(h, scratch)
    return h.unsqueeze(1)  # [n, 1]


def _finish_(
    out: torch.Tensor, row_state: torch.Tensor, col_block: torch.Tensor, scratch: torch.Tensor
) -> None:
    """Column block and finaliser for one row chunk, written into `out` ([r, m] int64)."""
    torch.bitwise_xor(row_state, col_block, out=out)  # [r, 1] ^ ([1, m] | [r, m]) -> [r, m]
    _mix_into_(out, scratch)
    out.bitwise_xor_(LENGTH)
    _xorshift_(out, 16, scratch)
    _mul32_(out, FMIX1, scratch)
    _xorshift_(out, 13, scratch)
    _mul32_(out, FMIX2, scratch)
    _xorshift_(out, 16, scratch)


def _row_chunks(n: int, m: int, device: torch.device) -> Iterator[slice]:
    """Row slices to process at once: the whole batch on accelerators, cache-sized on CPU."""
    rows = n if device.type != "cpu" else max(1, _CPU_CHUNK_ELEMENTS // max(m, 1))
    for start in range(0, n, rows):
        yield slice(start, min(start + rows, n))


def _check_shapes(seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor) -> None:
    assert seed.dim() == 1, f"seed must be 1-D, got shape {tuple(seed.shape)}"
    assert positions.shape == seed.shape, (
        f"seed {tuple(seed.shape)} and positions {tuple(positions.shape)} must match"
    )
    assert col_indices.dim() == 1 or (
        col_indices.dim() == 2 and col_indices.shape[0] == seed.shape[0]
    ), f"col_indices must be [m] or [n, m], got {tuple(col_indices.shape)} for n={seed.shape[0]}"


def _hash_chunks(
    seed: torch.Tensor,
    positions: torch.Tensor,
    col_indices: torch.Tensor,
    out: torch.Tensor | None = None,
) -> Iterator[tuple[slice, torch.Tensor]]:
    """Yield (row slice, hashes [r, m] int64) per chunk.

    With `out` ([n, m] int64) the hashes are written there; otherwise one chunk buffer is
    reused, so a consumer must read each chunk before advancing.
    """
    device = seed.device
    row_state = _row_state(seed.to(torch.int64), positions.to(device))  # [n, 1] int64
    cols = col_indices.to(device, torch.int64) & MASK32
    shared_cols = cols.dim() == 1
    col_block = _scramble_block(cols)  # [m] or [n, m] int64
    if shared_cols:
        col_block = col_block.unsqueeze(0)  # [1, m]
    n, m = seed.shape[0], col_indices.shape[-1]
    chunks = list(_row_chunks(n, m, device))
    chunk_rows = max((sl.stop - sl.start for sl in chunks), default=0)
    scratch = torch.empty((chunk_rows, m), dtype=torch.int64, device=device)  # [r, m]
    buf = torch.empty_like(scratch) if out is None else None
    for sl in chunks:
        r = sl.stop - sl.start
        target = out[sl] if buf is None else buf[:r]
        _finish_(target, row_state[sl], col_block if shared_cols else col_block[sl], scratch[:r])
        yield sl, target


def murmur_hash32(
    seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor
) -> torch.Tensor:
    """uint32 hashes of (seed[i], positions[i], column) as int64 [n, m] in [0, 2**32).

    seed: [n] int64 (read as uint64 two's complement), positions: [n] int,
    col_indices: [m] int shared by all rows, or [n, m] int per row.
    """
    _check_shapes(seed, positions, col_indices)
    n, m = seed.shape[0], col_indices.shape[-1]
    out = torch.empty((n, m), dtype=torch.int64, device=seed.device)  # [n, m] int64
    for _ in _hash_chunks(seed, positions, col_indices, out=out):
        pass
    return out


def _to_gumbel_(u: torch.Tensor) -> torch.Tensor:
    """u -> -log(-clamp(log u)) in place (float64)."""
    u.log_().clamp_(min=LOG_CLAMP_MIN, max=LOG_CLAMP_MAX)
    return u.neg_().log_().neg_()


def _float_noise(
    seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor, gumbel: bool
) -> torch.Tensor:
    _check_shapes(seed, positions, col_indices)
    n, m = seed.shape[0], col_indices.shape[-1]
    out = torch.empty((n, m), dtype=torch.float64, device=seed.device)  # [n, m] float64
    for sl, h in _hash_chunks(seed, positions, col_indices):
        # Copy to float64 before dividing: int64 / float would promote to float32.
        u = out[sl].copy_(h).div_(UINT32_MAX)
        if gumbel:
            _to_gumbel_(u)  # while the chunk is still in cache
    return out


def hash_uniform(
    seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor
) -> torch.Tensor:
    """hash / (2**32 - 1) as float64 [n, m]; both 0 and 1 are reachable."""
    return _float_noise(seed, positions, col_indices, gumbel=False)


def hash_gumbel(
    seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor
) -> torch.Tensor:
    """Gumbel noise -log(-log u) as float64 [n, m], finite everywhere.

    log u is clamped into [-float64_max, -2**-32], so u = 1 gives ~22.18 instead of +inf
    and u = 0 gives a very negative finite value instead of -inf.
    """
    return _float_noise(seed, positions, col_indices, gumbel=True)
