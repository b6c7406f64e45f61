"""Token -> expert alignment (align.py's layout) in two Triton launches, for CUDA.

align.py's torch ops take about thirty small launches a layer, a fixed cost that a decode step of
a MoE model pays in every layer. Here, over chunks of pairs:
1. count (grid: chunks): each chunk's pairs per expert, [chunks, E]; the programs also fill the
   sorted layout with the padding mark;
2. scatter (grid: chunks): each program sums the counts into the experts' padded runs and its
   chunk's offset within each run (the pairs of earlier chunks), ranks its pairs within their
   expert by a running count along the chunk, and writes each pair to its row; program 0 writes
   each block's expert.
Within an expert the pairs keep their (token, slot) order, so the result equals align.py's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.moe.align import ExpertBlocks, padded_rows
from sgl_kernel_ext.triton_launch import launch, pdl_sync

# Pairs per program: CHUNK, fewer where an [E_PAD, CHUNK] tile of hits would pass HITS_TILE
# elements (it stays in registers at 8 warps).
CHUNK, HITS_TILE = 64, 8192
ROW_TILE = 16  # chunks' counts summed at once
# Every scatter program sums the whole [chunks, E_PAD] count table, so the reads grow as
# chunks^2 x E_PAD: this path serves up to that many count reads (32 MiB of L2 traffic; e.g.
# 16k pairs at 128 experts, 2k pairs at 512), align.py the larger batches.
ALIGN_TRITON_MAX_READS = 1 << 23


@triton.jit
def _expert_hits(ids_ptr, p, num_pairs, num_experts, e):
    """[E_PAD, CHUNK] int32: 1 where pair p belongs to expert e (ids outside [0, E): none)."""
    key = tl.load(ids_ptr + p, mask=p < num_pairs, other=-1)
    return ((key[None, :] == e[:, None]) & (e < num_experts)[:, None]).to(tl.int32)


@triton.jit(do_not_specialize=["num_pairs", "rows", "n_chunks"])
def _count_kernel(ids_ptr, counts_ptr, sorted_ptr, num_pairs, num_experts, rows, n_chunks,
                  E_PAD: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr):
    pdl_sync(PDL)
    chunk = tl.program_id(0)
    e = tl.arange(0, E_PAD)
    for start in range(chunk * CHUNK, rows, n_chunks * CHUNK):  # the padding mark, one slice per program
        r = start + tl.arange(0, CHUNK)
        tl.store(sorted_ptr + r, tl.full([CHUNK], 0, tl.int32) + num_pairs, mask=r < rows)
    hits = _expert_hits(ids_ptr, chunk * CHUNK + tl.arange(0, CHUNK), num_pairs, num_experts, e)
    tl.store(counts_ptr + chunk * E_PAD + e, tl.sum(hits, 1))


@triton.jit(do_not_specialize=["num_pairs", "n_chunks", "n_blocks"])
def _scatter_kernel(ids_ptr, counts_ptr, sorted_ptr, block_expert_ptr, num_pairs, num_experts, n_chunks, n_blocks,
                    E_PAD: tl.constexpr, CHUNK: tl.constexpr, ROW_TILE: tl.constexpr, BLOCK_M: tl.constexpr,
                    PDL: tl.constexpr):
    pdl_sync(PDL)
    chunk = tl.program_id(0)
    e = tl.arange(0, E_PAD)
    total = tl.zeros([E_PAD], tl.int32)
    before = tl.zeros([E_PAD], tl.int32)  # pairs of each expert in earlier chunks
    for c0 in range(0, n_chunks, ROW_TILE):
        c = c0 + tl.arange(0, ROW_TILE)
        tile = tl.load(counts_ptr + c[:, None] * E_PAD + e[None, :], mask=(c < n_chunks)[:, None], other=0)
        total += tl.sum(tile, 0)
        before += tl.sum(tl.where((c < chunk)[:, None], tile, 0), 0)
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    run_ends = tl.cumsum(padded, 0)  # [E_PAD]
    p = chunk * CHUNK + tl.arange(0, CHUNK)
    hits = _expert_hits(ids_ptr, p, num_pairs, num_experts, e)  # [E_PAD, CHUNK]
    rank = tl.cumsum(hits, 1) - hits + (before + run_ends - padded)[:, None]  # the row each hit goes to
    dest = tl.sum(hits * rank, 0)  # [CHUNK]
    tl.store(sorted_ptr + dest, p.to(tl.int32), mask=tl.sum(hits, 0) > 0)
    if chunk == 0:
        live_e = (e < num_experts)[:, None]
        for b0 in range(0, n_blocks, CHUNK):  # [E_PAD, CHUNK] tiles of runs x blocks
            b = b0 + tl.arange(0, CHUNK)
            # searchsorted(run_ends, start, right=True): the runs ending at or before the block's start
            ended = (run_ends[:, None] <= (b * BLOCK_M)[None, :]) & live_e
            tl.store(block_expert_ptr + b, tl.sum(ended.to(tl.int32), 0), mask=b < n_blocks)


def _chunking(num_pairs: int, num_experts: int) -> tuple[int, int, int]:
    """(E_PAD, pairs per chunk, chunks)."""
    e_pad = triton.next_power_of_2(num_experts)
    chunk = max(1, min(CHUNK, HITS_TILE // e_pad))
    return e_pad, chunk, max(1, -(-num_pairs // chunk))


def align_triton_fits(num_pairs: int, num_experts: int) -> bool:
    """Whether the scatter programs' count-table reads stay within ALIGN_TRITON_MAX_READS."""
    e_pad, _, n_chunks = _chunking(num_pairs, num_experts)
    return n_chunks * n_chunks * e_pad <= ALIGN_TRITON_MAX_READS


def align_triton_applies(local_ids: torch.Tensor, num_experts: int) -> bool:
    return local_ids.is_cuda and align_triton_fits(local_ids.numel(), num_experts)


def align_to_blocks_triton(local_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertBlocks:
    """align.align_to_blocks's result (local_ids [N, k] int) in two launches."""
    ids = local_ids.reshape(-1).to(torch.int32).contiguous()  # [P]
    num_pairs, device = ids.shape[0], ids.device
    rows = padded_rows(num_pairs, num_experts, block_m)
    e_pad, chunk, n_chunks = _chunking(num_pairs, num_experts)
    n_blocks = rows // block_m
    counts = torch.empty(n_chunks, e_pad, dtype=torch.int32, device=device)  # [chunks, E_PAD]
    sorted_pairs = torch.empty(rows, dtype=torch.int32, device=device)  # [P_padded]
    block_expert = torch.empty(n_blocks, dtype=torch.int32, device=device)  # [P_padded / BLOCK_M]
    launch(_count_kernel, (n_chunks,), ids, counts, sorted_pairs, num_pairs, num_experts, rows, n_chunks,
           E_PAD=e_pad, CHUNK=chunk, num_warps=8, pdl=True)
    launch(_scatter_kernel, (n_chunks,), ids, counts, sorted_pairs, block_expert, num_pairs, num_experts, n_chunks,
           n_blocks, E_PAD=e_pad, CHUNK=chunk, ROW_TILE=ROW_TILE, BLOCK_M=block_m, num_warps=8, pdl=True)
    return ExpertBlocks(sorted_pairs, block_expert)
