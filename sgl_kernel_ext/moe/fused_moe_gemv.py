"""The MoE experts for decode-sized batches: two Triton GEMV kernels and no token -> expert sort.

With a few (token, slot) pairs, the grouped GEMM's alignment (a sort, scatters and a search:
about ten small launches a layer) and its tensor-core blocks padded to 16 rows cost more than
the weight reads. Here:
1. gate_up: one program per (pair, BLOCK_N columns of the intermediate dim) reads the pair's
   expert id, streams that expert's gate and up rows and writes silu(gate) * up (float32 math,
   rounded to the model dtype) to the pair's row of act [N k, I];
2. down: one program per (token, BLOCK_N hidden columns) streams the row blocks of the token's k
   slots' experts together, times each slot's act row, rounds weight * result to the model dtype
   and sums the slots in float32 (the grouped GEMM's numbers).
As in gemm/gemv_triton.py, each lane keeps float32 partial sums along K and reduces once.
Pairs of another EP rank's experts contribute zero. No host synchronisation: CUDA graphs
capture both. Numerics: sgl_kernel_ext.moe.reference.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.norm.rmsnorm_triton import round_to
from sgl_kernel_ext.triton_launch import launch, pdl_sync

# (token, slot) pairs up to which the GEMV path serves a batch, and slots a token may have.
GEMV_MAX_PAIRS = 64
GEMV_MAX_TOP_K = 16


class GemvTile(NamedTuple):
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# The best of benchmark/gpu_kernel_sweep.py at Qwen3-30B-A3B's shapes on an H200 at 1 and 8
# tokens (docs/gpu_engine.md): gate_up by batch size class (pairs <= FEW_PAIRS, more), down one
# tile for both. Narrow column blocks keep many programs in flight.
FEW_PAIRS = 8
GATE_UP_TILES = (GemvTile(2, 1024, 4, 1), GemvTile(2, 512, 4, 1))
DOWN_TILE = GemvTile(8, 256, 4, 1)
# Elements of the down kernel's [K_PAD, BLOCK_N, BLOCK_K] float32 accumulator (k = 8 at the tiles
# above); a larger top-k (Qwen3-Next's 10, padded to 16) shortens the K tile to stay in registers.
DOWN_ACC_MAX = 16384


@triton.jit
def _gate_up_gemv_kernel(
    x_ptr,  # [N, H]
    w13_ptr,  # [E, 2I, H]
    act_ptr,  # [N k, I]
    ids_ptr,  # [N k] int32 local expert ids
    top_k, num_experts, hidden, inter,
    stride_x, stride_we, stride_wn, stride_act,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """Per-lane float32 partial sums over [BLOCK_N, BLOCK_K] tiles, one reduction at the end."""
    pdl_sync(PDL)
    dtype = act_ptr.dtype.element_ty
    pair = tl.program_id(0).to(tl.int64)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    if (expert < 0) | (expert >= num_experts):
        return
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    col_live = cols < inter
    rows = tl.where(col_live, cols, 0).to(tl.int64)  # dead columns read row 0: no mask along N
    x_row = x_ptr + (pair // top_k) * stride_x
    w_base = w13_ptr + expert * stride_we
    acc_gate = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_live = ks < hidden
        a = tl.load(x_row + ks, mask=k_live, other=0.0).to(tl.float32)[None, :]  # [1, BK]
        w_gate = tl.load(w_base + rows[:, None] * stride_wn + ks[None, :], mask=k_live[None, :], other=0.0)  # [BN, BK]
        w_up = tl.load(w_base + (rows[:, None] + inter) * stride_wn + ks[None, :], mask=k_live[None, :], other=0.0)
        acc_gate += w_gate.to(tl.float32) * a
        acc_up += w_up.to(tl.float32) * a
    gate = tl.sum(acc_gate, axis=1)  # [BN]
    up = tl.sum(acc_up, axis=1)
    act = round_to(gate / (1.0 + tl.exp(-gate)) * up, dtype)
    tl.store(act_ptr + pair * stride_act + cols, act.to(dtype), mask=col_live)


@triton.jit
def _down_gemv_kernel(
    act_ptr,  # [N k, I]
    w2_ptr,  # [E, H, I]
    out_ptr,  # [N, H]
    weights_ptr,  # [N k] float32
    ids_ptr,  # [N k] int32
    top_k, num_experts, hidden, inter,
    stride_act, stride_we, stride_wn, stride_out,
    K_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    """All k slots of a token at once ([K_PAD, BLOCK_N, BLOCK_K] tiles: k times the loads in
    flight of one slot), per-lane float32 partial sums, one reduction per slot at the end."""
    pdl_sync(PDL)
    dtype = out_ptr.dtype.element_ty
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    col_live = cols < hidden
    rows = tl.where(col_live, cols, 0).to(tl.int64)
    slot = tl.arange(0, K_PAD)
    pairs = token * top_k + slot  # [K_PAD]
    expert = tl.load(ids_ptr + pairs, mask=slot < top_k, other=-1).to(tl.int64)
    local = (slot < top_k) & (expert >= 0) & (expert < num_experts)  # a foreign slot reads nothing
    w_base = w2_ptr + tl.where(local, expert, 0)[:, None, None] * stride_we + rows[None, :, None] * stride_wn
    acc = tl.zeros((K_PAD, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        live = local[:, None] & (ks < inter)[None, :]  # [K_PAD, BK]
        a = tl.load(act_ptr + pairs[:, None] * stride_act + ks[None, :], mask=live, other=0.0).to(tl.float32)
        w = tl.load(w_base + ks[None, None, :], mask=live[:, None, :], other=0.0)  # [K_PAD, BN, BK]
        acc += w.to(tl.float32) * a[:, None, :]
    y = tl.sum(acc, axis=2)  # [K_PAD, BN]
    weight = tl.load(weights_ptr + pairs, mask=local, other=0.0)
    total = tl.sum(tl.where(local[:, None], round_to(y * weight[:, None], dtype), 0.0), axis=0)  # [BN]
    tl.store(out_ptr + token * stride_out + cols, total.to(dtype), mask=col_live)


def fused_experts_gemv_applies(num_pairs: int, top_k: int, batch_invariant: bool) -> bool:
    """Decode-sized batches with up to GEMV_MAX_TOP_K slots a token (the down kernel's accumulator
    holds them all), outside the batch-invariant mode (whose rows take one path at every batch size)."""
    return num_pairs <= GEMV_MAX_PAIRS and top_k <= GEMV_MAX_TOP_K and not batch_invariant


def fused_experts_gemv(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, local_ids: torch.Tensor
) -> torch.Tensor:
    """x [N, H]; w13 [E, 2I, H]; w2 [E, H, I] (unit last strides); topk_weights [N, k];
    local_ids [N, k] (ids outside [0, E) contribute zero) -> [N, H] in x's dtype."""
    n, k = local_ids.shape
    inter = w2.shape[2]
    out = torch.empty(n, x.shape[1], dtype=x.dtype, device=x.device)  # [N, H]
    if n == 0:
        return out
    ids = local_ids.reshape(-1).to(torch.int32).contiguous()  # [N k]
    act = torch.empty(n * k, inter, dtype=x.dtype, device=x.device)  # [N k, I]; foreign pairs' rows unread
    weights = topk_weights.reshape(-1).float().contiguous()  # [N k]
    gate_up_gemv(x, w13, act, ids, k, GATE_UP_TILES[n * k > FEW_PAIRS])
    down_gemv(act, w2, out, weights, ids, k, DOWN_TILE)
    return out


def gate_up_gemv(x: torch.Tensor, w13: torch.Tensor, act: torch.Tensor, ids: torch.Tensor, k: int,
                 tile: GemvTile) -> None:
    """act[pair] = silu(x[pair // k] @ gate^T) * (x[pair // k] @ up^T) of the pair's expert."""
    inter = w13.shape[1] // 2
    launch(_gate_up_gemv_kernel, (ids.numel(), triton.cdiv(inter, tile.block_n)), x, w13, act, ids,
           k, w13.shape[0], x.shape[1], inter, x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
           BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, num_warps=tile.num_warps, num_stages=tile.num_stages, pdl=True)


def down_gemv(act: torch.Tensor, w2: torch.Tensor, out: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, k: int,
              tile: GemvTile) -> None:
    """out[token] = sum over its k slots of round(weight * act[pair] @ W2[expert]^T)."""
    hidden, k_pad = out.shape[1], triton.next_power_of_2(k)
    block_k = max(16, min(tile.block_k, DOWN_ACC_MAX // (k_pad * tile.block_n)))  # more slots: a shorter K tile
    launch(_down_gemv_kernel, (out.shape[0], triton.cdiv(hidden, tile.block_n)), act, w2, out, weights, ids,
           k, w2.shape[0], hidden, w2.shape[2], act.stride(0), w2.stride(0), w2.stride(1), out.stride(0),
           K_PAD=k_pad, BLOCK_N=tile.block_n, BLOCK_K=block_k, num_warps=tile.num_warps,
           num_stages=tile.num_stages, pdl=True)
