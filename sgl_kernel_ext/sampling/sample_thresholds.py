"""Device functions of the sampling kernels' row pass (sample.py): bounds on the top-k / top-p
thresholds from the chunk pass's block maxima, the gather of the candidates above the cut, the
exact thresholds (pairwise over candidate tiles, by bisection over float keys, or over the full
row) and the hash-Gumbel draw over the kept candidates."""

from __future__ import annotations

import triton
import triton.language as tl

from sgl_kernel_ext.sampling.murmur import hash_gumbel

@triton.jit
def _count_at_least(bs, bs2, tau):
    return tl.sum((bs >= tau).to(tl.int32) + (bs2 >= tau).to(tl.int32), 0)


@triton.jit
def _mass_at_least(bs, ws, bs2, ws2, tau):
    return tl.sum(tl.where(bs >= tau, ws, 0.0) + tl.where(bs2 >= tau, ws2, 0.0), 0)


# The bounds come from the scaled block maxima and runners-up ([NBP] each in bs, bs2; -inf where
# absent): distinct elements of the row. Each is the largest value tested by bisection between a
# floor (at most BOUND_RANGE below the max M) and M where they show the filter's condition, -inf
# where they do not.


@triton.jit
def _search_floor(bs, M, BOUND_RANGE: tl.constexpr):
    """Where a bound's bisection starts: the lowest finite block maximum, or BOUND_RANGE below the
    max if that is higher. A row whose block maxima lie within a few hundredths of each other (a
    near-flat distribution) is then searched at that scale, not in steps of BOUND_RANGE / 2**steps."""
    lowest = tl.min(tl.where(bs > float("-inf"), bs, M), 0)
    return tl.maximum(lowest, M - BOUND_RANGE)


@triton.jit
def _top_k_bound(bs, bs2, k, M, BOUND_RANGE: tl.constexpr, BOUND_STEPS: tl.constexpr):
    """At least k of them at or above it: so at least k elements, and the k-th largest is not below.
    Searched from _search_floor, or from BOUND_RANGE below M where fewer than k lie above that."""
    floor = _search_floor(bs, M, BOUND_RANGE)
    lo = tl.where(_count_at_least(bs, bs2, floor) >= k, floor, M - BOUND_RANGE)
    hi = M
    found = _count_at_least(bs, bs2, lo) >= k
    for _ in range(BOUND_STEPS):
        mid = (lo + hi) * 0.5
        ok = _count_at_least(bs, bs2, mid) >= k
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    return tl.where(found, lo, float("-inf"))


@triton.jit
def _top_p_bound(bs, bs2, p, M, Z, BOUND_RANGE: tl.constexpr, BOUND_STEPS: tl.constexpr):
    """They hold at least top_p of the mass at or above it: every element below it has at least
    that mass strictly above it, so is outside the nucleus (1e-5 of slack for the different
    order of the fp32 sums). Searched from _search_floor as _top_k_bound is."""
    floor = _search_floor(bs, M, BOUND_RANGE)
    ws = tl.exp(bs - M)
    ws2 = tl.exp(bs2 - M)
    target = (p + 1e-5) * Z
    lo = tl.where(_mass_at_least(bs, ws, bs2, ws2, floor) >= target, floor, M - BOUND_RANGE)
    hi = M
    found = _mass_at_least(bs, ws, bs2, ws2, lo) >= target
    for _ in range(BOUND_STEPS):
        mid = (lo + hi) * 0.5
        ok = _mass_at_least(bs, ws, bs2, ws2, mid) >= target
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    return tl.where(found, lo, float("-inf"))


@triton.jit
def _gather_candidates(
    row_ptr, t, V, hot_ptr, n_hot, cut, val_ptr, idx_ptr,
    BLOCK_SIZE: tl.constexpr, HOT_TILE: tl.constexpr, CAP: tl.constexpr,
):
    """Re-read the row's hot blocks (ids in hot_ptr, ascending) HOT_TILE at a time and append every
    element at or above `cut` to the candidate list (token-id order). Returns the candidate count
    (the list holds the first CAP)."""
    i = tl.arange(0, HOT_TILE * BLOCK_SIZE)
    n = tl.zeros([], dtype=tl.int32)
    for first in range(0, n_hot, HOT_TILE):
        h = first + i // BLOCK_SIZE
        blk = tl.load(hot_ptr + h, mask=h < n_hot, other=0)
        offs = blk * BLOCK_SIZE + i % BLOCK_SIZE
        live = (h < n_hot) & (offs < V)
        s = tl.math.div_rn(tl.load(row_ptr + offs, mask=live, other=float("-inf")), t)
        take = live & (s >= cut)
        pos = n + tl.cumsum(take.to(tl.int32), 0) - 1
        tl.store(val_ptr + pos, s, mask=take & (pos < CAP))
        tl.store(idx_ptr + pos, offs, mask=take & (pos < CAP))
        n += tl.sum(take.to(tl.int32), 0)
    return n


@triton.jit
def _float_key(f):
    """Order-preserving int32 key of a float32."""
    b = f.to(tl.int32, bitcast=True)
    return b ^ ((b >> 31) & 0x7FFFFFFF)


@triton.jit
def _key_float(k):
    return (k ^ ((k >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _full_thresholds(row_ptr, t, V, k, p, M, Z, BLOCK: tl.constexpr):
    """Exact top-k and top-p thresholds over the whole row by bisection on float keys.

    top-k: the largest key whose count of elements >= it is >= k (the k-th value).
    top-p: the smallest key whose mass strictly above it is < p (every element at or above it is
    kept, every element below it has mass >= p above)."""
    k_lo = _float_key(tl.full([], float("-inf"), tl.float32)).to(tl.int64)
    k_hi = _float_key(M).to(tl.int64) + 1
    p_lo = k_lo
    p_hi = _float_key(M).to(tl.int64)
    for _ in range(33):
        k_mid = k_lo + (k_hi - k_lo) // 2
        p_mid = p_lo + (p_hi - p_lo) // 2
        fk = _key_float(k_mid.to(tl.int32))
        fp = _key_float(p_mid.to(tl.int32))
        count = tl.zeros([BLOCK], dtype=tl.int32)
        mass = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf"))
            s = tl.math.div_rn(x, t)
            count += (s >= fk).to(tl.int32)
            mass += tl.where(s > fp, tl.exp(s - M), 0.0)
        k_ok = tl.sum(count, 0) >= k
        k_lo = tl.where(k_ok, k_mid, k_lo)
        k_hi = tl.where(k_ok, k_hi, k_mid)
        p_ok = tl.sum(mass, 0) / Z < p
        p_hi = tl.where(p_ok, p_mid, p_hi)
        p_lo = tl.where(p_ok, p_lo, p_mid)
    t_k = tl.where(k < V, _key_float(k_lo.to(tl.int32)), float("-inf"))
    t_p = tl.where(p < 1.0, _key_float(p_hi.to(tl.int32)), float("-inf"))
    return t_k, t_p


@triton.jit
def _pairwise_thresholds(val_ptr, v, live, n, k, p, M, Z, N: tl.constexpr, JB: tl.constexpr):
    """Top-k and top-p thresholds of n candidates ([N] in v), straight from the definitions: a
    token is in the top-k when fewer than k tokens are strictly greater, in the top-p when the
    mass of strictly greater tokens is < p. Both sets are up-sets in value (the fp32 sums over
    nested sets are monotone), so their smallest member is the threshold, with ties at it kept.
    O(n * N) comparisons: for few candidates."""
    rank = tl.zeros([N], dtype=tl.int32)
    greater = tl.zeros([N], dtype=tl.float32)
    for jb in range(0, n, JB):
        rj = jb + tl.arange(0, JB)
        vj = tl.load(val_ptr + rj, mask=rj < n, other=float("-inf"))
        gt = vj[None, :] > v[:, None]  # [N, JB]
        rank += tl.sum(gt.to(tl.int32), 1)
        greater += tl.sum(tl.where(gt, (tl.exp(vj - M) / Z)[None, :], 0.0), 1)
    t_k = tl.min(tl.where(live & (rank < k), v, float("inf")), 0)
    # The max is always in the nucleus, even for a top_p that rounds to 0 in fp32.
    t_p = tl.min(tl.where(live & ((greater < p) | (rank == 0)), v, float("inf")), 0)
    return t_k, t_p


@triton.jit
def _bisect_thresholds(v, live, k, p, M, Z):
    """The same thresholds by bisection over float keys, as the full-row path, with the candidates
    ([N] in v) held in registers: 33 steps of two block sums, for many candidates."""
    e = tl.where(live, tl.exp(v - M), 0.0)
    k_lo = _float_key(tl.full([], float("-inf"), tl.float32)).to(tl.int64)
    k_hi = _float_key(M).to(tl.int64) + 1
    p_lo = k_lo
    p_hi = _float_key(M).to(tl.int64)
    for _ in range(33):
        k_mid = k_lo + (k_hi - k_lo) // 2
        p_mid = p_lo + (p_hi - p_lo) // 2
        k_ok = tl.sum((live & (v >= _key_float(k_mid.to(tl.int32)))).to(tl.int32), 0) >= k
        k_lo = tl.where(k_ok, k_mid, k_lo)
        k_hi = tl.where(k_ok, k_hi, k_mid)
        p_ok = tl.sum(tl.where(v > _key_float(p_mid.to(tl.int32)), e, 0.0), 0) / Z < p
        p_hi = tl.where(p_ok, p_mid, p_hi)
        p_lo = tl.where(p_ok, p_lo, p_mid)
    return _key_float(k_lo.to(tl.int32)), _key_float(p_hi.to(tl.int32))


@triton.jit
def _draw_candidates(
    val_ptr, idx_ptr, n, n_finite, k, p, t_m, M, Z, V, state, N: tl.constexpr, JB: tl.constexpr,
):
    """Thresholds and the draw over a row's n <= N candidates (every element above the cut);
    thresholds pairwise in [N, JB] tiles, or by bisection when JB is 0."""
    r = tl.arange(0, N)
    live = r < n
    v = tl.load(val_ptr + r, mask=live, other=float("-inf"))
    ix = tl.load(idx_ptr + r, mask=live, other=0)
    if JB > 0:
        t_k, t_p = _pairwise_thresholds(val_ptr, v, live, n, k, p, M, Z, N, JB)
    else:
        t_k, t_p = _bisect_thresholds(v, live, k, p, M, Z)
    # A filter whose boundary lies below the cut (fewer than k candidates; candidates holding less
    # than p of the mass, so the first token below the cut is still in the nucleus) is looser than
    # the filter that set the cut, and does not count.
    t_k = tl.where((k < V) & (n >= k), t_k, float("-inf"))
    cand_mass = tl.sum(tl.where(live, tl.exp(v - M) / Z, 0.0), 0)
    boundary_inside = (cand_mass >= p) | (n == n_finite)
    t_p = tl.where((p < 1.0) & boundary_inside, t_p, float("-inf"))
    thr = tl.maximum(tl.maximum(t_k, t_p), t_m)
    keep = live & (v >= thr)
    score = tl.where(keep, v.to(tl.float64) + hash_gumbel(state, ix), float("-inf"))
    best = tl.max(score, 0)
    token = tl.min(tl.where(keep & (score == best), ix, V), 0).to(tl.int64)
    lse_kept = M + tl.log(tl.sum(tl.where(keep, tl.exp(v - M), 0.0), 0))
    return token, thr, lse_kept
