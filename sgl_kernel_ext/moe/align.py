"""Token -> expert alignment for the grouped-GEMM MoE kernels, in torch ops without host syncs.

The N * k (token, slot) pairs are sorted by expert into blocks of BLOCK_M rows, each expert's
run padded to a multiple of BLOCK_M, so that every block belongs to one expert. Buffer sizes
depend on N, k, E and BLOCK_M alone (the worst case: every expert that can receive a pair pads
BLOCK_M - 1 rows), so a CUDA graph captures the alignment and replays it for any routing.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class ExpertBlocks(NamedTuple):
    sorted_pairs: torch.Tensor  # [P] int32: pair index t * k + j, grouped by expert; N * k marks padding
    block_expert: torch.Tensor  # [P / BLOCK_M] int32: each block's expert; E for blocks past the last run


def padded_rows(num_pairs: int, num_experts: int, block_m: int) -> int:
    """P: rows of the sorted layout in the worst case, a multiple of block_m."""
    rows = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    return -(-rows // block_m) * block_m


# Pairs x buckets up to which a pair's rank within its expert comes from a one-hot running
# count (a few elementwise launches) rather than a stable sort (one slow radix sort launch).
ONE_HOT_MAX_ELEMENTS = 1 << 22


def _rank_within_expert(key: torch.Tensor, counts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """key [P] bucket per pair (E: foreign) -> [P] how many earlier pairs share its bucket."""
    num_pairs = key.shape[0]
    if num_pairs * (num_experts + 1) <= ONE_HOT_MAX_ELEMENTS:
        one_hot = torch.zeros(num_experts + 1, num_pairs, dtype=torch.int32, device=key.device)  # [E + 1, P]
        one_hot.scatter_(0, key.unsqueeze(0), 1)
        return one_hot.cumsum(1, dtype=torch.int32).gather(0, key.unsqueeze(0)).squeeze(0).long() - 1
    order = torch.argsort(key, stable=True)  # [P] pairs grouped by bucket
    first_of_key = torch.cumsum(counts, 0) - counts  # [E + 1] unpadded start of each bucket
    rank = torch.empty_like(key)
    rank[order] = torch.arange(num_pairs, device=key.device) - first_of_key[key[order]]
    return rank


def align_to_blocks(local_ids: torch.Tensor, num_experts: int, block_m: int) -> ExpertBlocks:
    """local_ids [N, k] (ids outside [0, E) are another rank's experts: left out) -> ExpertBlocks.
    Within an expert the pairs keep their (token, slot) order."""
    flat = local_ids.reshape(-1).long()  # [N k]
    num_pairs, device = flat.shape[0], flat.device
    key = torch.where((flat >= 0) & (flat < num_experts), flat, num_experts)  # foreign -> bucket E
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=device)
    counts.scatter_add_(0, key, torch.ones_like(key))  # [E + 1]
    padded = (counts[:num_experts] + block_m - 1) // block_m * block_m  # [E]
    run_ends = torch.cumsum(padded, 0)  # [E]
    run_starts = run_ends - padded
    rows = padded_rows(num_pairs, num_experts, block_m)
    rank_in_run = _rank_within_expert(key, counts, num_experts)  # [N k]
    # Foreign pairs go to a dump slot past the layout.
    dest = torch.where(key < num_experts, run_starts[key.clamp(max=num_experts - 1)] + rank_in_run, rows)
    sorted_pairs = torch.full((rows + 1,), num_pairs, dtype=torch.int32, device=device)
    sorted_pairs.scatter_(0, dest, torch.arange(num_pairs, dtype=torch.int32, device=device))
    block_starts = torch.arange(0, rows, block_m, device=device)  # [P / BLOCK_M]
    block_expert = torch.searchsorted(run_ends, block_starts, right=True).to(torch.int32)
    return ExpertBlocks(sorted_pairs[:rows], block_expert)
