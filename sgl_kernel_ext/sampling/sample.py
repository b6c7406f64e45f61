"""Filtered sampling without a sort: top-k (ties kept) / joint top-p / min-p + hash-Gumbel draw.

The support is the one defined in support.py (the plain-torch rule): with scaled = logits / T,
token i is kept iff scaled[i] >= max(k-th largest, top-p boundary, max + log(min_p)). Every
sampled row draws argmax(scaled + gumbel(hash(seed, position, token id))) over its kept tokens;
greedy rows (top_k <= 1) take the argmax of the logits (lowest id on ties); rows with NaN, +inf
or nothing finite are invalid (id -1).

Two launches, no host synchronisation, every decision per row on the device:

  1. chunk (grid B x chunks of CHUNK, small CTAs so that several share an SM and hide each
     other's load latency): per chunk the max and sum of exp(scaled - chunk max), the count of
     finite elements, and the max and runner-up of each block of BLOCK_SIZE elements. Nothing else per
     element: this pass reads all the logits, and block-wide histograms, scans and scattered
     stores here cost several times the read itself.
  2. row (grid B): combines the chunk stats into the row max M and partition Z, and from the
     block maxima and runners-up (distinct elements of the row) a lower bound for each active
     filter's threshold: the k-th largest of them has at least k elements at or above it; those
     whose mass reaches top_p bound the nucleus from below (not searched when a top-k bound
     already leaves few candidates); min-p's threshold is known. Every
     element at or above the highest bound (the cut) lies in a block whose max reaches the cut
     ("hot" blocks): the row re-reads only those, keeps the elements at or above the cut as
     candidates (token-id order), takes the exact thresholds from the candidates (all elements
     above the cut are there, so each one's count and mass of strictly greater elements are
     exact) and draws by Gumbel-max over the kept ones. A row with no bound (no filter, or
     filters looser than the block maxima can show), too many hot blocks or candidates takes the
     exact full-row path: a 32-step bisection over float keys for the thresholds (only when a
     top-k or top-p is set), then Gumbel over the whole row, which takes two more launches:
  3. full draw (grid B x chunks): for full-row rows only, each chunk's best Gumbel score and its
     token, and its kept mass (the Gumbel scores are float64 hashes, too slow for one CTA over a
     whole row, e.g. a flat row with min-p at high temperature);
  4. full reduce (grid B): the row's token (best score, lowest id on ties) and kept logsumexp.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.sampling.murmur import hash_gumbel, row_hash_state
from sgl_kernel_ext.sampling.sample_reference import SampleResult
from sgl_kernel_ext.sampling.sample_thresholds import (
    _draw_candidates,
    _full_thresholds,
    _gather_candidates,
    _top_k_bound,
    _top_p_bound,
)
from sgl_kernel_ext.triton_launch import launch, pdl_sync

CHUNK = 2048  # elements per chunk CTA, held in registers (16 per thread at 4 warps)
# Elements per block whose max and runner-up the chunk pass saves. Small blocks: those are then
# most of a row's nucleus (on N(0, 4.3^2) logits, the maxima of 32-blocks hold >= 0.94 of the
# mass, with the runners-up >= 0.98; 128-blocks' maxima 0.86), so they bound top-p as well as
# top-k.
BLOCK_SIZE = 32
HOT_TILE = 128  # hot blocks the row kernel re-reads at once (4096 elements, 8 per thread at 16 warps)
MAX_HOT = 2048  # hot blocks a row may have on the fast path
BOUND_RANGE = 64.0  # the bounds are searched at most this many units of scaled logit below the max
# Bisection steps of the bounds: resolution at most BOUND_RANGE / 2**8 = 0.25 (on the H100, 8 steps beat 12
# at every batch size; at 6 the loose top-p cut leaves more than CAP candidates).
BOUND_STEPS = 8
CAP = 2048  # candidates per row on the fast path
# Candidate counts up to SMALL take their thresholds from one [SMALL, SMALL] comparison tile, more
# by bisection over MEDIUM or CAP candidates in registers.
SMALL = 128
MEDIUM = 512
FULL_BLOCK = 4096  # tile of the full-row path
ROW_WARPS = 16  # the row kernel: 16 warps beat 8 and 4 at every batch size on the H100

# Row modes, set by the row kernel: 0 candidates, 1 full row, 2 greedy, 3 invalid.


@triton.jit
def _full_scratch(fws, iws, B, NC, NB, MAX_HOT: tl.constexpr, CAP: tl.constexpr):
    """After _scratch's regions: per row the full-row flag (int32) and row max (float32), per
    chunk the best token (int32) and kept mass (float32); the best scores are in dws [B, NC]."""
    n = B * NC
    f = fws + 2 * n + B * (2 * NB + CAP)
    i = iws + 2 * n + B * (MAX_HOT + CAP)
    return i, f, i + B, f + B


@triton.jit
def _scratch(fws, iws, B, NC, NB, MAX_HOT: tl.constexpr, CAP: tl.constexpr):
    """Pointers into the workspaces: per chunk cmax, csum (float32) and cbad, cvalid (int32); per
    row the raw block maxima and runners-up [B, NB] each and candidate values [B, CAP] (float32),
    hot block list [B, MAX_HOT] and candidate ids [B, CAP] (int32)."""
    n = B * NC
    bmax = fws + 2 * n
    hot = iws + 2 * n
    return fws, fws + n, iws, iws + n, bmax, bmax + B * NB, bmax + 2 * B * NB, hot, hot + B * MAX_HOT


# The batch size is not specialised on (== 1, % 16): a new batch size must never compile.
@triton.jit(do_not_specialize=["B"])
def _chunk_kernel(
    logits_ptr, stride, temps_ptr, V, B, NC, fws, iws,
    CHUNK: tl.constexpr, BLOCK_SIZE: tl.constexpr, MAX_HOT: tl.constexpr, CAP: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    NSUB: tl.constexpr = CHUNK // BLOCK_SIZE
    NB = NC * NSUB
    cmax_ptr, csum_ptr, cbad_ptr, cvalid_ptr, bmax_ptr, bsec_ptr, _, _, _ = _scratch(fws, iws, B, NC, NB, MAX_HOT, CAP)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    sub = tl.arange(0, NSUB)
    offs = chunk * CHUNK + sub[:, None] * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)[None, :]  # [NSUB, BLOCK_SIZE]
    x = tl.load(logits_ptr + row.to(tl.int64) * stride + offs, mask=offs < V, other=float("-inf"))
    t = tl.load(temps_ptr + row)
    bmax = tl.max(x, 1)  # [NSUB]
    # The largest value below the max: another element of the block (a tie with the max is
    # skipped, which only loosens the row's bounds).
    bsec = tl.max(tl.where(x < bmax[:, None], x, float("-inf")), 1)  # [NSUB]
    xmax = tl.max(bmax, 0)
    smax = tl.math.div_rn(xmax, t)  # = max(scaled): correctly rounded division by t > 0 is monotone
    ref = tl.where(smax == float("-inf"), 0.0, smax)
    s = tl.math.div_rn(x, t)
    csum = tl.sum(tl.sum(tl.exp(s - ref), 1), 0)
    n_finite = tl.sum(tl.sum((s > float("-inf")).to(tl.int32), 1), 0)
    # A NaN makes the sum NaN (the max may skip it); +inf makes the max +inf.
    bad = ((xmax == float("inf")) | (csum != csum)).to(tl.int32)
    slot = row * NC + chunk
    tl.store(bmax_ptr + row.to(tl.int64) * NB + chunk * NSUB + sub, bmax)
    tl.store(bsec_ptr + row.to(tl.int64) * NB + chunk * NSUB + sub, bsec)
    tl.store(cmax_ptr + slot, smax)
    tl.store(csum_ptr + slot, csum)
    tl.store(cbad_ptr + slot, bad)
    tl.store(cvalid_ptr + slot, n_finite)



@triton.jit(do_not_specialize=["B"])
def _row_kernel(
    logits_ptr, stride, temps_ptr, top_k_ptr, top_p_ptr, log_min_p_ptr, seeds_ptr, pos_ptr, V, B, NC, fws, iws,
    ids_ptr, invalid_ptr, out_ptr,
    CHUNK: tl.constexpr, BLOCK_SIZE: tl.constexpr, NCP: tl.constexpr, HOT_TILE: tl.constexpr, MAX_HOT: tl.constexpr,
    BOUND_RANGE: tl.constexpr, BOUND_STEPS: tl.constexpr, CAP: tl.constexpr, SMALL: tl.constexpr,
    MEDIUM: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    NSUB: tl.constexpr = CHUNK // BLOCK_SIZE
    NBP: tl.constexpr = NCP * NSUB
    NB = NC * NSUB
    cmax_ptr, csum_ptr, cbad_ptr, cvalid_ptr, bmax_ptr, bsec_ptr, cand_val_ptr, hot_ptr, cand_idx_ptr = _scratch(
        fws, iws, B, NC, NB, MAX_HOT, CAP
    )
    lse_ptr, lse_kept_ptr, thr_ptr = out_ptr, out_ptr + B, out_ptr + 2 * B
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    t = tl.load(temps_ptr + row)
    c = tl.arange(0, NCP)
    cm = c < NC
    slots = row * NC + c
    cmax = tl.load(cmax_ptr + slots, mask=cm, other=float("-inf"))
    M = tl.max(cmax, 0)
    ref = tl.where(M == float("-inf"), 0.0, M)
    csum = tl.load(csum_ptr + slots, mask=cm, other=0.0)
    Z = tl.sum(tl.where(cmax > float("-inf"), csum * tl.exp(cmax - ref), 0.0), 0)
    bad = (tl.max(tl.load(cbad_ptr + slots, mask=cm, other=0), 0) > 0) | (M == float("-inf"))
    n_finite = tl.sum(tl.load(cvalid_ptr + slots, mask=cm, other=0), 0)

    b = tl.arange(0, NBP)
    live = b < NB
    bx = tl.load(bmax_ptr + row.to(tl.int64) * NB + b, mask=live, other=float("-inf"))  # [NBP] raw block maxima
    bs = tl.math.div_rn(bx, t)  # the scaled value of each block's max element
    bx2 = tl.load(bsec_ptr + row.to(tl.int64) * NB + b, mask=live, other=float("-inf"))
    bs2 = tl.math.div_rn(bx2, t)
    k = tl.load(top_k_ptr + row)
    p = tl.load(top_p_ptr + row)
    log_min_p = tl.load(log_min_p_ptr + row)
    t_m = M + log_min_p
    cut_k = tl.full([], float("-inf"), tl.float32)
    if (k > 1) & (k < V):
        cut_k = _top_k_bound(bs, bs2, k, M, BOUND_RANGE, BOUND_STEPS)
    # A top-k cut of few candidates needs no top-p bound: the exact thresholds come from the
    # candidates either way.
    cut_p = tl.full([], float("-inf"), tl.float32)
    if (k > 1) & (p < 1.0) & ((cut_k == float("-inf")) | (k > SMALL)):
        cut_p = _top_p_bound(bs, bs2, p, M, Z, BOUND_RANGE, BOUND_STEPS)
    cut = tl.maximum(tl.maximum(cut_k, cut_p), t_m)
    hot = live & (bs >= cut)
    n_hot = tl.sum(hot.to(tl.int32), 0)
    mode = tl.where((cut > float("-inf")) & (n_hot <= MAX_HOT), 0, 1)
    mode = tl.where(k <= 1, 2, mode)
    mode = tl.where(bad, 3, mode)

    lse = M + tl.log(Z)
    tl.store(lse_ptr + row, lse)
    tl.store(invalid_ptr + row, (mode == 3).to(tl.int8))
    # Greedy: the lowest id holding the max lies in the lowest block whose max it is.
    x_top = tl.max(bx, 0)
    first = tl.min(tl.where(bx == x_top, b, NBP), 0)
    first_offs = first * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    xb = tl.load(row_ptr + first_offs, mask=first_offs < V, other=float("-inf"))
    token = tl.min(tl.where(xb == x_top, first_offs, V), 0).to(tl.int64)
    lse_kept = lse
    thr = tl.full([], float("-inf"), tl.float32)
    full = tl.zeros([], tl.int32)
    if mode < 2:
        state = row_hash_state(tl.load(seeds_ptr + row), tl.load(pos_ptr + row))
        n = tl.full([], CAP + 1, tl.int32)  # > CAP: the full-row path
        if mode == 0:
            val_ptr = cand_val_ptr + row.to(tl.int64) * CAP
            idx_ptr = cand_idx_ptr + row.to(tl.int64) * CAP
            row_hot_ptr = hot_ptr + row.to(tl.int64) * MAX_HOT
            tl.store(row_hot_ptr + tl.cumsum(hot.to(tl.int32), 0) - 1, b, mask=hot)
            tl.debug_barrier()  # the gather reads block ids other threads of this CTA wrote
            n = _gather_candidates(row_ptr, t, V, row_hot_ptr, n_hot, cut, val_ptr, idx_ptr, BLOCK_SIZE, HOT_TILE, CAP)
            tl.debug_barrier()  # the draw reads candidates other threads of this CTA wrote
            if n <= SMALL:
                token, thr, lse_kept = _draw_candidates(
                    val_ptr, idx_ptr, n, n_finite, k, p, t_m, M, Z, V, state, N=SMALL, JB=SMALL
                )
            elif n <= MEDIUM:
                token, thr, lse_kept = _draw_candidates(
                    val_ptr, idx_ptr, n, n_finite, k, p, t_m, M, Z, V, state, N=MEDIUM, JB=0
                )
            elif n <= CAP:
                token, thr, lse_kept = _draw_candidates(
                    val_ptr, idx_ptr, n, n_finite, k, p, t_m, M, Z, V, state, N=CAP, JB=0
                )
        if n > CAP:
            t_k = tl.full([], float("-inf"), tl.float32)
            t_p = tl.full([], float("-inf"), tl.float32)
            if (k < V) | (p < 1.0):
                t_k, t_p = _full_thresholds(row_ptr, t, V, k, p, M, Z, BLOCK)
            thr = tl.maximum(tl.maximum(t_k, t_p), t_m)
            full = tl.full([], 1, tl.int32)  # the draw over the whole row: _full_chunk_kernel, _full_reduce_kernel
    flag_ptr, rowmax_ptr, _, _ = _full_scratch(fws, iws, B, NC, NB, MAX_HOT, CAP)
    tl.store(flag_ptr + row, full)
    tl.store(rowmax_ptr + row, M)
    tl.store(ids_ptr + row, tl.where(mode == 3, -1, token))
    tl.store(lse_kept_ptr + row, lse_kept)
    tl.store(thr_ptr + row, thr)


@triton.jit(do_not_specialize=["B"])
def _full_chunk_kernel(
    logits_ptr, stride, temps_ptr, seeds_ptr, pos_ptr, V, B, NC, fws, iws, dws, out_ptr,
    CHUNK: tl.constexpr, BLOCK_SIZE: tl.constexpr, MAX_HOT: tl.constexpr, CAP: tl.constexpr,
    PDL: tl.constexpr,
):
    """A full-row row's chunk: its best Gumbel score over the kept tokens (lowest id on ties)
    and its kept mass, with the threshold the row kernel stored. Other rows return at once."""
    pdl_sync(PDL)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    flag_ptr, rowmax_ptr, best_id_ptr, ksum_ptr = _full_scratch(fws, iws, B, NC, NC * (CHUNK // BLOCK_SIZE), MAX_HOT, CAP)
    if tl.load(flag_ptr + row) != 0:
        t = tl.load(temps_ptr + row)
        thr = tl.load(out_ptr + 2 * B + row)
        M = tl.load(rowmax_ptr + row)
        state = row_hash_state(tl.load(seeds_ptr + row), tl.load(pos_ptr + row))
        offs = chunk * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(logits_ptr + row.to(tl.int64) * stride + offs, mask=offs < V, other=float("-inf"))
        s = tl.math.div_rn(x, t)
        keep = (offs < V) & (s >= thr)
        score = tl.where(keep, s.to(tl.float64) + hash_gumbel(state, offs), float("-inf"))
        top = tl.max(score, 0)
        slot = row * NC + chunk
        tl.store(dws + slot, top)
        tl.store(best_id_ptr + slot, tl.min(tl.where(score == top, offs, V), 0))
        tl.store(ksum_ptr + slot, tl.sum(tl.where(keep, tl.exp(s - M), 0.0), 0))


@triton.jit(do_not_specialize=["B"])
def _full_reduce_kernel(
    ids_ptr, out_ptr, fws, iws, dws, V, B, NC, NCP: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_SIZE: tl.constexpr, MAX_HOT: tl.constexpr, CAP: tl.constexpr,
    PDL: tl.constexpr,
):
    """A full-row row's token (best chunk score; the lowest id among equal ones) and kept logsumexp."""
    pdl_sync(PDL)
    row = tl.program_id(0)
    flag_ptr, rowmax_ptr, best_id_ptr, ksum_ptr = _full_scratch(fws, iws, B, NC, NC * (CHUNK // BLOCK_SIZE), MAX_HOT, CAP)
    if tl.load(flag_ptr + row) != 0:
        c = tl.arange(0, NCP)
        slots = row * NC + c
        score = tl.load(dws + slots, mask=c < NC, other=float("-inf"))
        ids = tl.load(best_id_ptr + slots, mask=c < NC, other=V)
        top = tl.max(score, 0)
        tl.store(ids_ptr + row, tl.min(tl.where(score == top, ids, V), 0).to(tl.int64))
        kept = tl.sum(tl.load(ksum_ptr + slots, mask=c < NC, other=0.0), 0)
        tl.store(out_ptr + B + row, tl.load(rowmax_ptr + row) + tl.log(kept))


@triton.jit
def _greedy_kernel(logits_ptr, stride, V, ids_ptr, invalid_ptr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_sync(PDL)
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


# Scratch per device, grown to the largest batch seen and reused by every call: fewer allocations
# and kernel arguments per step (a decode step's launch cost matters at small batch). Calls on a
# device are ordered on one stream, as the sampler's are.
_WORKSPACES: dict[torch.device, "Workspace"] = {}


def workspace_sizes(B: int, V: int) -> tuple[int, int, int]:
    """(float32, int32, float64) scratch elements a call over B rows of V logits uses."""
    nc = -(-V // CHUNK)
    chunks, nb = B * nc, nc * (CHUNK // BLOCK_SIZE)
    return chunks * 3 + B * (2 * nb + CAP + 1), chunks * 3 + B * (MAX_HOT + CAP + 1), chunks


Workspace = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def new_workspace(B: int, V: int, device: torch.device) -> Workspace:
    floats, ints, doubles = workspace_sizes(B, V)
    return (
        torch.empty(floats, dtype=torch.float32, device=device),
        torch.empty(ints, dtype=torch.int32, device=device),
        torch.empty(doubles, dtype=torch.float64, device=device),
    )


def _workspace(device: torch.device, B: int, V: int) -> Workspace:
    held = _WORKSPACES.get(device)
    if held is None or any(t.numel() < n for t, n in zip(held, workspace_sizes(B, V))):
        held = _WORKSPACES[device] = new_workspace(B, V, device)
    return held


def sample_triton(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    log_min_ps: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    workspace: Optional[Workspace] = None,
) -> SampleResult:
    """One draw per row of `logits` ([B, V] float32, unit stride along V).

    temperatures [B] or [B, 1] float32 (> 0); top_ks [B] int32 (>= V: none, <= 1: greedy);
    top_ps [B] float32 (1: none); log_min_ps [B] float32 (-inf: none); seeds [B] int64;
    positions [B] int64. Nothing is read back on the host. `workspace` (new_workspace for at
    least B rows): scratch of the caller's own, which a CUDA graph needs (the shared one grows).
    """
    B, V = logits.shape
    dev = logits.device
    nc = -(-V // CHUNK)  # plain ints: triton.cdiv / next_power_of_2 are ~10 µs constexpr-function calls
    fws, iws, dws = workspace if workspace is not None else _workspace(dev, B, V)
    ids = torch.empty(B, dtype=torch.int64, device=dev)
    invalid = torch.empty(B, dtype=torch.int8, device=dev)
    out = torch.empty(3, B, dtype=torch.float32, device=dev)  # lse, lse_kept, threshold
    temps = temperatures.reshape(B)
    stride = logits.stride(0)
    # Small chunk CTAs: several per SM overlap their loads (one 16-warp CTA per SM cannot).
    launch(_chunk_kernel, (B, nc), logits, stride, temps, V, B, nc, fws, iws, CHUNK, BLOCK_SIZE, MAX_HOT, CAP, num_warps=4,
           pdl=True)
    row_args = (logits, stride, temps, top_ks, top_ps, log_min_ps, seeds, positions, V, B, nc, fws, iws, ids, invalid, out)
    row_consts = (
        CHUNK, BLOCK_SIZE, 1 << (nc - 1).bit_length(), HOT_TILE, MAX_HOT, BOUND_RANGE, BOUND_STEPS, CAP, SMALL, MEDIUM,
        FULL_BLOCK,
    )
    launch(_row_kernel, (B,), *row_args, *row_consts, num_warps=ROW_WARPS, pdl=True)
    full_consts = (CHUNK, BLOCK_SIZE, MAX_HOT, CAP)
    launch(_full_chunk_kernel, (B, nc), logits, stride, temps, seeds, positions, V, B, nc, fws, iws, dws, out, *full_consts,
           num_warps=4, pdl=True)
    launch(_full_reduce_kernel, (B,), ids, out, fws, iws, dws, V, B, nc, 1 << (nc - 1).bit_length(), *full_consts,
           num_warps=4, pdl=True)
    # A bool view of the int8 flags costs no kernel, unlike .bool().
    return SampleResult(ids=ids, invalid=invalid.view(torch.bool), lse=out[0], lse_kept=out[1], threshold=out[2])


def full_row_flags(workspace: Workspace, B: int, V: int) -> torch.Tensor:
    """[B] int32 view: which rows of the last sample_triton call on `workspace` took the full-row path."""
    nc = -(-V // CHUNK)
    start = 2 * B * nc + B * (MAX_HOT + CAP)  # _full_scratch's flags
    return workspace[1][start:start + B]


def greedy_triton(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Argmax per row (lowest id on ties) and the invalid flag, in one launch: ([B] int64, [B] bool)."""
    B, V = logits.shape
    ids = torch.empty(B, dtype=torch.int64, device=logits.device)
    invalid = torch.empty(B, dtype=torch.int8, device=logits.device)
    launch(_greedy_kernel, (B,), logits, logits.stride(0), V, ids, invalid, FULL_BLOCK, num_warps=16, pdl=True)
    return ids, invalid.view(torch.bool)
