"""Filtered sampling without a sort: top-k (ties kept) / joint top-p / min-p + hash-Gumbel draw.

The support is the one defined in sglang.srt.layers.sampling_ops: with scaled = logits / T,
token i is kept iff scaled[i] >= max(k-th largest, top-p boundary, max + log(min_p)). Every
sampled row draws argmax(scaled + gumbel(hash(seed, position, token id))) over its kept tokens;
greedy rows (top_k <= 1) take the argmax of the logits (lowest id on ties); rows with NaN, +inf
or nothing finite are invalid (id -1).

Two launches, no host synchronisation, every decision per row on the device; the logits are
read once on the fast path:

  1. chunk (grid B x chunks of CHUNK, small CTAs so that several share an SM and hide each
     other's load latency): per chunk max / argmax / sum of exp(scaled - chunk max), a count
     histogram of scaled values in absolute bins of width 1 / BIN_SCALE below the chunk's max
     bin, and the chunk's own top bins, up to LCAP elements, saved (value, id) in id order with
     the lowest bin level down to which the chunk saved everything.
  2. row (grid B): combines the row's chunk stats once into the row max M, the partition Z and
     a histogram over the row's top NBIN bins. From it each active filter gives a bin its
     threshold cannot lie below (top-k: where the cumulative count reaches k; top-p: the
     highest bin above which even an upper bound of the remaining mass is below 1 - top_p;
     min-p: the bin of M + log(min_p)); the cut is the highest of those. When every chunk saved
     down to the cut and the candidates fit in CAP, the row gathers them from the chunks' saved
     elements (token-id order, offsets from the histograms), takes the exact thresholds from
     the candidates (all elements above the cut are there, so each one's count and mass of
     strictly greater elements are exact) and draws by Gumbel-max over the kept ones. Any other
     row with a sampled draw takes the exact full-row path: a 32-step bisection over float keys
     for the thresholds, then Gumbel over the whole row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.sampling.murmur import hash_gumbel, row_hash_state

CHUNK = 2048  # elements per chunk CTA, held in registers (16 per thread at 4 warps)
NBIN = 64  # histogram bins below each chunk's max bin
BIN_SCALE = 2.0  # bins per unit of scaled logit: 32 units of range, mass ratio e^0.5 within a bin
LCAP = 64  # elements a chunk saves from its top bins
CAP = 2048  # candidates per row on the fast path
# Candidate counts up to SMALL take their thresholds from one [SMALL, SMALL] comparison tile, more
# by bisection over MEDIUM or CAP candidates in registers.
SMALL = 128
MEDIUM = 512
FULL_BLOCK = 4096  # tile of the full-row path
_ALL_SAVED = tl.constexpr(-(2**30))  # saved level of a chunk that saved every finite element

# Row modes, set by the row kernel: 0 candidates, 1 full row, 2 greedy, 3 invalid.


@dataclass
class SampleResult:
    ids: torch.Tensor  # [B] int64, -1 on invalid rows
    invalid: torch.Tensor  # [B] bool
    lse: torch.Tensor  # [B] float32, logsumexp of the scaled row
    lse_kept: torch.Tensor  # [B] float32, logsumexp of the scaled row over the kept tokens
    threshold: torch.Tensor  # [B] float32, scaled-logit threshold of the support


@triton.jit
def _abs_bin(v, BIN_SCALE: tl.constexpr):
    """floor(v * BIN_SCALE) as int32, clamped so -inf / NaN / huge values stay representable."""
    f = tl.floor(v * BIN_SCALE)
    f = tl.where(f > -1.0e9, f, -1.0e9)
    f = tl.where(f < 1.0e9, f, 1.0e9)
    return f.to(tl.int32)


@triton.jit
def _chunk_ptrs(fws, iws, B, NC, NBIN: tl.constexpr, LCAP: tl.constexpr):
    """Per-chunk scratch in the workspaces: cmax, csum, cxmax, saved values [B * NC, LCAP] (float32);
    carg, cbad, cvalid, nsaved, saved level, hist [B * NC, NBIN], saved ids [B * NC, LCAP] (int32)."""
    n = B * NC
    i = iws + 5 * n
    return fws, fws + n, fws + 2 * n, fws + 3 * n, iws, iws + n, iws + 2 * n, iws + 3 * n, iws + 4 * n, i, i + n * NBIN


@triton.jit
def _row_ptrs(fws, iws, B, NC, NBIN: tl.constexpr, LCAP: tl.constexpr):
    """Per-row scratch after the chunks': cand_val [B, CAP] (float32), cand_idx [B, CAP] (int32)."""
    n = B * NC
    return fws + n * (3 + LCAP), iws + n * (5 + NBIN + LCAP)


@triton.jit
def _chunk_kernel(
    logits_ptr, stride, temps_ptr, V, B, NC, fws, iws,
    CHUNK: tl.constexpr, NBIN: tl.constexpr, BIN_SCALE: tl.constexpr, LCAP: tl.constexpr,
):
    cmax_ptr, csum_ptr, cxmax_ptr, sval_ptr, carg_ptr, cbad_ptr, cvalid_ptr, nsaved_ptr, level_ptr, hist_ptr, sidx_ptr = (
        _chunk_ptrs(fws, iws, B, NC, NBIN, LCAP)
    )
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    inb = offs < V
    x = tl.load(logits_ptr + row.to(tl.int64) * stride + offs, mask=inb, other=float("-inf"))
    t = tl.load(temps_ptr + row)
    s = tl.math.div_rn(x, t)
    bad = tl.max(((x != x) | (x == float("inf"))).to(tl.int32), 0)
    xmax = tl.max(x, 0)
    arg = tl.min(tl.where(x == xmax, offs, V), 0)
    smax = tl.math.div_rn(xmax, t)  # = max(s): correctly rounded division by t > 0 is monotone
    ref = tl.where(smax == float("-inf"), 0.0, smax)
    csum = tl.sum(tl.exp(s - ref), 0)
    finite = inb & (s > float("-inf"))
    a_max = _abs_bin(smax, BIN_SCALE)
    j = a_max - _abs_bin(s, BIN_SCALE)
    in_range = finite & (j < NBIN)
    hist = tl.histogram(tl.where(in_range, j, 0), NBIN, mask=in_range)  # [NBIN]
    n_finite = tl.sum(finite.to(tl.int32), 0)
    # Save the chunk's top bins while they fit (all of it when it has few finite elements), so the
    # row kernel finds every candidate above its cut here instead of re-reading the logits.
    b = tl.arange(0, NBIN)
    j_saved = tl.max(tl.where(tl.cumsum(hist, 0) <= LCAP, b, -1), 0)
    save_all = n_finite <= LCAP
    take = tl.where(save_all, finite, in_range & (j <= j_saved))
    pos = tl.cumsum(take.to(tl.int32), 0) - 1
    slot = row * NC + chunk
    out = slot.to(tl.int64) * LCAP + pos
    tl.store(sval_ptr + out, s, mask=take)
    tl.store(sidx_ptr + out, offs, mask=take)
    tl.store(cmax_ptr + slot, smax)
    tl.store(csum_ptr + slot, csum)
    tl.store(cxmax_ptr + slot, xmax)
    tl.store(carg_ptr + slot, arg)
    tl.store(cbad_ptr + slot, bad)
    tl.store(cvalid_ptr + slot, n_finite)
    tl.store(nsaved_ptr + slot, tl.sum(take.to(tl.int32), 0))
    tl.store(level_ptr + slot, tl.where(save_all, _ALL_SAVED, a_max - j_saved))
    tl.store(hist_ptr + slot.to(tl.int64) * NBIN + b, hist)


@triton.jit
def _gather_candidates(
    sval_ptr, sidx_ptr, slots, cm, nsaved, start, level, val_ptr, idx_ptr,
    BIN_SCALE: tl.constexpr, LCAP: tl.constexpr,
):
    """Copy every saved element at or above bin `level` of the row's chunks ([NCP] slots) to the
    row's candidate list, chunk after chunk at offsets `start` ([NCP]), id order within a chunk."""
    r = tl.arange(0, LCAP)
    src = slots.to(tl.int64)[:, None] * LCAP + r[None, :]  # [NCP, LCAP]
    live = cm[:, None] & (r[None, :] < nsaved[:, None])
    v = tl.load(sval_ptr + src, mask=live, other=float("-inf"))
    ix = tl.load(sidx_ptr + src, mask=live, other=0)
    take = live & (_abs_bin(v, BIN_SCALE) >= level)
    pos = start[:, None] + tl.cumsum(take.to(tl.int32), 1) - 1
    tl.store(val_ptr + pos, v, mask=take)
    tl.store(idx_ptr + pos, ix, mask=take)


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
    t_p = tl.min(tl.where(live & (greater < p), v, float("inf")), 0)
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


@triton.jit
def _row_kernel(
    logits_ptr, stride, temps_ptr, top_k_ptr, top_p_ptr, log_min_p_ptr, seeds_ptr, pos_ptr, V, B, NC, fws, iws,
    ids_ptr, invalid_ptr, out_ptr,
    NBIN: tl.constexpr, BIN_SCALE: tl.constexpr, NCP: tl.constexpr, LCAP: tl.constexpr, CAP: tl.constexpr,
    SMALL: tl.constexpr, MEDIUM: tl.constexpr, BLOCK: tl.constexpr,
):
    cmax_ptr, csum_ptr, cxmax_ptr, sval_ptr, carg_ptr, cbad_ptr, cvalid_ptr, nsaved_ptr, level_ptr, hist_ptr, sidx_ptr = (
        _chunk_ptrs(fws, iws, B, NC, NBIN, LCAP)
    )
    cand_val_ptr, cand_idx_ptr = _row_ptrs(fws, iws, B, NC, NBIN, LCAP)
    lse_ptr, lse_kept_ptr, thr_ptr = out_ptr, out_ptr + B, out_ptr + 2 * B
    row = tl.program_id(0)
    c = tl.arange(0, NCP)
    cm = c < NC
    slots = row * NC + c
    cmax = tl.load(cmax_ptr + slots, mask=cm, other=float("-inf"))
    M = tl.max(cmax, 0)
    ref = tl.where(M == float("-inf"), 0.0, M)
    csum = tl.load(csum_ptr + slots, mask=cm, other=0.0)
    Z = tl.sum(tl.where(cmax > float("-inf"), csum * tl.exp(cmax - ref), 0.0), 0)
    bad = (tl.max(tl.load(cbad_ptr + slots, mask=cm, other=0), 0) > 0) | (M == float("-inf"))

    # Row histogram over its top NBIN bins: g = a_M - absolute bin.
    a_M = _abs_bin(M, BIN_SCALE)
    shift = a_M - _abs_bin(cmax, BIN_SCALE)  # [NCP] chunk bin j = g - shift
    g = tl.arange(0, NBIN)
    jj = g[None, :] - shift[:, None]  # [NCP, NBIN]
    hm = cm[:, None] & (jj >= 0) & (jj < NBIN)
    H = tl.load(hist_ptr + slots.to(tl.int64)[:, None] * NBIN + jj, mask=hm, other=0)  # [NCP, NBIN]
    G = tl.sum(H, 0)  # [NBIN]
    count_cum = tl.cumsum(G, 0)

    k = tl.load(top_k_ptr + row)
    p = tl.load(top_p_ptr + row)
    log_min_p = tl.load(log_min_p_ptr + row)
    NONE: tl.constexpr = 2 * NBIN  # filter inactive
    g_k = tl.min(tl.where(count_cum >= k, g, NBIN), 0)
    g_k = tl.where(k < V, g_k, NONE)
    # Mass strictly below bin g, bounded above by each bin's upper edge and the bottom of the
    # range for elements below it; 1 - that bound <= the mass at or above bin g.
    upper = (a_M - g + 1).to(tl.float64) / BIN_SCALE
    w = G.to(tl.float64) * tl.exp(upper - M.to(tl.float64))
    n_finite = tl.sum(tl.load(cvalid_ptr + slots, mask=cm, other=0), 0)
    n_below = n_finite - tl.sum(G, 0)
    bottom = (a_M - NBIN + 1).to(tl.float64) / BIN_SCALE
    below = tl.sum(w, 0) - tl.cumsum(w, 0) + n_below.to(tl.float64) * tl.exp(bottom - M.to(tl.float64))
    enough = 1.0 - below / Z.to(tl.float64) >= p.to(tl.float64) + 1e-5
    g_p = tl.min(tl.where(enough, g, NBIN), 0)
    g_p = tl.where(p < 1.0, g_p, NONE)
    g_m = a_M - _abs_bin(M + log_min_p, BIN_SCALE)
    g_m = tl.where(log_min_p > float("-inf"), tl.minimum(g_m, NBIN), NONE)
    g_cut = tl.minimum(tl.minimum(g_k, g_p), g_m)
    level = a_M - g_cut  # absolute bin of the cut
    per_chunk = tl.sum(tl.where(g[None, :] <= g_cut, H, 0), 1)  # [NCP] candidates of each chunk
    n_cand = tl.sum(per_chunk, 0)
    saved_to = tl.max(tl.load(level_ptr + slots, mask=cm, other=_ALL_SAVED), 0)
    mode = tl.where((g_cut < NBIN) & (saved_to <= level) & (n_cand <= CAP), 0, 1)
    mode = tl.where(k <= 1, 2, mode)
    mode = tl.where(bad, 3, mode)

    lse = M + tl.log(Z)
    tl.store(lse_ptr + row, lse)
    tl.store(invalid_ptr + row, (mode == 3).to(tl.int8))
    cxmax = tl.load(cxmax_ptr + slots, mask=cm, other=float("-inf"))
    carg = tl.load(carg_ptr + slots, mask=cm, other=V)
    token = tl.min(tl.where(cxmax == tl.max(cxmax, 0), carg, V), 0).to(tl.int64)
    lse_kept = lse
    thr = tl.full([], float("-inf"), tl.float32)
    if mode < 2:
        k = tl.load(top_k_ptr + row)
        p = tl.load(top_p_ptr + row)
        t_m = M + tl.load(log_min_p_ptr + row)
        state = row_hash_state(tl.load(seeds_ptr + row), tl.load(pos_ptr + row))
        if mode == 0:
            n = n_cand
            val_ptr = cand_val_ptr + row.to(tl.int64) * CAP
            idx_ptr = cand_idx_ptr + row.to(tl.int64) * CAP
            nsaved = tl.load(nsaved_ptr + slots, mask=cm, other=0)
            chunk_start = tl.cumsum(per_chunk, 0) - per_chunk
            _gather_candidates(
                sval_ptr, sidx_ptr, slots, cm, nsaved, chunk_start, level, val_ptr, idx_ptr, BIN_SCALE=BIN_SCALE, LCAP=LCAP
            )
            tl.debug_barrier()  # the draw reads candidates other threads of this CTA wrote
            if n <= SMALL:
                token, thr, lse_kept = _draw_candidates(
                    val_ptr, idx_ptr, n, n_finite, k, p, t_m, M, Z, V, state, N=SMALL, JB=SMALL
                )
            elif n <= MEDIUM:
                token, thr, lse_kept = _draw_candidates(
                    val_ptr, idx_ptr, n, n_finite, k, p, t_m, M, Z, V, state, N=MEDIUM, JB=0
                )
            else:
                token, thr, lse_kept = _draw_candidates(
                    val_ptr, idx_ptr, n, n_finite, k, p, t_m, M, Z, V, state, N=CAP, JB=0
                )
        else:
            row_ptr = logits_ptr + row.to(tl.int64) * stride
            t = tl.load(temps_ptr + row)
            t_k = tl.full([], float("-inf"), tl.float32)
            t_p = tl.full([], float("-inf"), tl.float32)
            if (k < V) | (p < 1.0):
                t_k, t_p = _full_thresholds(row_ptr, t, V, k, p, M, Z, BLOCK)
            thr = tl.maximum(tl.maximum(t_k, t_p), t_m)
            best = tl.full([BLOCK], float("-inf"), tl.float64)
            best_id = tl.full([BLOCK], V, tl.int32)
            kept_sum = tl.zeros([BLOCK], dtype=tl.float32)
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf"))
                s = tl.math.div_rn(x, t)
                keep = (offs < V) & (s >= thr)
                score = tl.where(keep, s.to(tl.float64) + hash_gumbel(state, offs), float("-inf"))
                # Strictly greater: an earlier tile keeps the lower token id on a tie.
                better = score > best
                best = tl.where(better, score, best)
                best_id = tl.where(better, offs, best_id)
                kept_sum += tl.where(keep, tl.exp(s - M), 0.0)
            top = tl.max(best, 0)
            token = tl.min(tl.where(best == top, best_id, V), 0).to(tl.int64)
            lse_kept = M + tl.log(tl.sum(kept_sum, 0))
    tl.store(ids_ptr + row, tl.where(mode == 3, -1, token))
    tl.store(lse_kept_ptr + row, lse_kept)
    tl.store(thr_ptr + row, thr)


@triton.jit
def _greedy_kernel(logits_ptr, stride, V, ids_ptr, invalid_ptr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_id = tl.full([BLOCK], V, tl.int32)
    bad = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf"))
        bad |= ((x != x) | (x == float("inf"))).to(tl.int32)
        better = x > best
        best = tl.where(better, x, best)
        best_id = tl.where(better, offs, best_id)
    top = tl.max(best, 0)
    invalid = (tl.max(bad, 0) > 0) | (top == float("-inf"))
    token = tl.min(tl.where(best == top, best_id, V), 0).to(tl.int64)
    tl.store(ids_ptr + row, tl.where(invalid, -1, token))
    tl.store(invalid_ptr + row, invalid.to(tl.int8))


# Compiled kernels by everything Triton specialises a launch on: Triton's own launch path binds
# and re-specialises every argument on each call; here the key is one tuple of the arguments
# (an eager decode step is host-bound at small batch).
_COMPILED: dict[tuple, object] = {}


def _spec(arg) -> object:
    """What Triton specialises an argument on: a tensor's dtype and 16-byte alignment, an int's
    value (covers == 1, divisibility by 16 and width), a constexpr's value."""
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    return arg


def _launch(kernel, grid: tuple, args: tuple, num_warps: int) -> None:
    """kernel[grid](*args) with every argument positional, constexprs included (their order in the
    signature); the first launch of a specialisation compiles through Triton, later ones call the
    compiled kernel directly."""
    device = args[0].device
    if device.type == "cpu":  # the interpreter: warps mean nothing there, nothing is compiled
        kernel[grid](*args)
        return
    key = (kernel, device, num_warps, *map(_spec, args))
    compiled = _COMPILED.get(key)
    if compiled is None:
        _COMPILED[key] = kernel[grid](*args, num_warps=num_warps)
    else:
        compiled[grid + (1,) * (3 - len(grid))](*args)  # a compiled kernel takes all three grid dims


# Scratch per device, grown to the largest batch seen and reused by every call: fewer allocations
# and kernel arguments per step (a decode step's launch cost matters at small batch). Calls on a
# device are ordered on one stream, as the sampler's are.
_WORKSPACES: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _workspace(device: torch.device, floats: int, ints: int) -> tuple[torch.Tensor, torch.Tensor]:
    fws, iws = _WORKSPACES.get(device, (None, None))
    if fws is None or fws.numel() < floats or iws.numel() < ints:
        fws = torch.empty(floats, dtype=torch.float32, device=device)
        iws = torch.empty(ints, dtype=torch.int32, device=device)
        _WORKSPACES[device] = (fws, iws)
    return fws, iws


def sample_triton(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    log_min_ps: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
) -> SampleResult:
    """One draw per row of `logits` ([B, V] float32, unit stride along V).

    temperatures [B] or [B, 1] float32 (> 0); top_ks [B] int32 (>= V: none, <= 1: greedy);
    top_ps [B] float32 (1: none); log_min_ps [B] float32 (-inf: none); seeds [B] int64;
    positions [B] int64. Nothing is read back on the host.
    """
    B, V = logits.shape
    dev = logits.device
    nc = -(-V // CHUNK)  # plain ints: triton.cdiv / next_power_of_2 are ~10 µs constexpr-function calls
    chunks = B * nc
    fws, iws = _workspace(dev, chunks * (3 + LCAP) + B * CAP, chunks * (5 + NBIN + LCAP) + B * CAP)
    ids = torch.empty(B, dtype=torch.int64, device=dev)
    invalid = torch.empty(B, dtype=torch.int8, device=dev)
    out = torch.empty(3, B, dtype=torch.float32, device=dev)  # lse, lse_kept, threshold
    temps = temperatures.reshape(B)
    stride = logits.stride(0)
    # Small chunk CTAs: several per SM overlap their loads (one 16-warp CTA per SM cannot).
    _launch(_chunk_kernel, (B, nc), (logits, stride, temps, V, B, nc, fws, iws, CHUNK, NBIN, BIN_SCALE, LCAP), 4)
    row_args = (logits, stride, temps, top_ks, top_ps, log_min_ps, seeds, positions, V, B, nc, fws, iws, ids, invalid, out)
    row_consts = (NBIN, BIN_SCALE, 1 << (nc - 1).bit_length(), LCAP, CAP, SMALL, MEDIUM, FULL_BLOCK)
    _launch(_row_kernel, (B,), row_args + row_consts, 16)
    # A bool view of the int8 flags costs no kernel, unlike .bool().
    return SampleResult(ids=ids, invalid=invalid.view(torch.bool), lse=out[0], lse_kept=out[1], threshold=out[2])


def greedy_triton(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Argmax per row (lowest id on ties) and the invalid flag, in one launch: ([B] int64, [B] bool)."""
    B, V = logits.shape
    ids = torch.empty(B, dtype=torch.int64, device=logits.device)
    invalid = torch.empty(B, dtype=torch.int8, device=logits.device)
    _launch(_greedy_kernel, (B,), (logits, logits.stride(0), V, ids, invalid, FULL_BLOCK), 16)
    return ids, invalid.view(torch.bool)


# ---------------------------------------------------------------------------------- references


def sample_reference(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    log_min_ps: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
) -> SampleResult:
    """The same function in plain torch: sampling_ops' support from a full sort, hash-Gumbel draw."""
    from sglang.srt.layers.sampling_ops import compute_support, draw_seeded

    B, V = logits.shape
    scaled = logits / temperatures.reshape(B, 1)  # [B, V] float32
    greedy_ids, invalid = greedy_reference(logits)
    safe = torch.where(invalid.unsqueeze(1), torch.zeros_like(scaled), scaled)
    support = compute_support(safe, top_ks, top_ps, top_ps, window=None, need_top_p=True, need_min_p=False)
    # min-p from log(min_p) directly, as the kernel does: exp then log need not round-trip.
    support.threshold = torch.maximum(support.threshold, support.vals[:, :1] + log_min_ps.unsqueeze(1))
    threshold = support.threshold  # [B, 1]
    drawn = draw_seeded(safe, support, seeds, positions)
    greedy = (top_ks <= 1).unsqueeze(1)  # [B, 1]; greedy rows keep everything
    threshold = torch.where(greedy, torch.full_like(threshold, float("-inf")), threshold)
    ids = torch.where(greedy.squeeze(1), greedy_ids, drawn)
    ids = torch.where(invalid, torch.full_like(ids, -1), ids)
    kept = torch.where(scaled >= threshold, scaled, torch.full_like(scaled, float("-inf")))
    return SampleResult(
        ids=ids,
        invalid=invalid,
        lse=torch.logsumexp(scaled, dim=-1),
        lse_kept=torch.logsumexp(kept, dim=-1),
        threshold=threshold.squeeze(1),
    )


def greedy_reference(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    invalid = ~torch.isfinite(logits.amax(dim=-1))  # [B] bool; amax propagates NaN
    ids = torch.where(invalid, torch.full_like(invalid, -1, dtype=torch.int64), logits.argmax(dim=-1))
    return ids, invalid
