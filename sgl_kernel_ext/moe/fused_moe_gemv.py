"""The MoE experts for decode-sized batches: two Triton GEMV kernels and no token -> expert sort.

With a few (token, slot) pairs, the grouped GEMM's alignment (a sort, scatters and a search:
about ten small launches a layer) and its tensor-core blocks padded to 16 rows cost more than
the weight reads. Here:
1. gate_up: one program per (pair, BLOCK_N columns of the intermediate dim) reads the pair's
   expert id, streams that expert's gate and up rows and writes silu(gate) * up (float32 math,
   rounded to the model dtype) to the pair's row of act [N k, I];
2. down: one program per (token, BLOCK_N hidden columns) runs the token's k slots in order,
   each slot's expert row block times its act row, rounds weight * result to the model dtype
   and sums the slots in float32 (the grouped GEMM's numbers).
Pairs of another EP rank's experts contribute zero. No host synchronisation: CUDA graphs
capture both. Numerics: sgl_kernel_ext.moe.reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.norm.rmsnorm_triton import round_to
from sgl_kernel_ext.triton_launch import launch, pdl_sync

# (token, slot) pairs up to which the GEMV path serves a batch.
GEMV_MAX_PAIRS = 64
# Tiles measured on the H100 at Qwen3-30B-A3B's shapes (docs/gpu_engine.md): narrow column
# blocks for many programs in flight, a longer K tile where a handful of pairs leaves few.
BLOCK_N = 16
BLOCK_K_FEW, FEW_PAIRS, BLOCK_K_MANY = 256, 8, 128


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
    pdl_sync(PDL)
    dtype = act_ptr.dtype.element_ty
    pair = tl.program_id(0).to(tl.int64)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    if (expert < 0) | (expert >= num_experts):
        return
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    col_live = cols < inter
    x_row = x_ptr + (pair // top_k) * stride_x
    w_base = w13_ptr + expert * stride_we
    acc_gate = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_live = ks < hidden
        a = tl.load(x_row + ks, mask=k_live, other=0.0).to(tl.float32)[None, :]  # [1, BK]
        w_mask = col_live[:, None] & k_live[None, :]
        w_gate = tl.load(w_base + cols[:, None] * stride_wn + ks[None, :], mask=w_mask, other=0.0)  # [BN, BK]
        w_up = tl.load(w_base + (cols[:, None] + inter) * stride_wn + ks[None, :], mask=w_mask, other=0.0)
        acc_gate += tl.sum(w_gate.to(tl.float32) * a, axis=1)
        acc_up += tl.sum(w_up.to(tl.float32) * a, axis=1)
    act = round_to(acc_gate / (1.0 + tl.exp(-acc_gate)) * acc_up, dtype)
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
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    dtype = out_ptr.dtype.element_ty
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    col_live = cols < hidden
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for slot in range(0, top_k):
        pair = token * top_k + slot
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        local = (expert >= 0) & (expert < num_experts)
        w_base = w2_ptr + tl.where(local, expert, 0) * stride_we
        live_inter = tl.where(local, inter, 0)  # a foreign slot reads nothing
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_live = ks < live_inter
            a = tl.load(act_ptr + pair * stride_act + ks, mask=k_live, other=0.0).to(tl.float32)[None, :]
            w = tl.load(w_base + cols[:, None] * stride_wn + ks[None, :], mask=col_live[:, None] & k_live[None, :],
                        other=0.0)  # [BN, BK]
            acc += tl.sum(w.to(tl.float32) * a, axis=1)
        weight = tl.load(weights_ptr + pair)
        total += tl.where(local, round_to(acc * weight, dtype), 0.0)
    tl.store(out_ptr + token * stride_out + cols, total.to(dtype), mask=col_live)


def fused_experts_gemv_applies(num_pairs: int, batch_invariant: bool) -> bool:
    """Decode-sized batches, outside the batch-invariant mode (whose rows take one path at every
    batch size)."""
    return num_pairs <= GEMV_MAX_PAIRS and not batch_invariant


def fused_experts_gemv(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, local_ids: torch.Tensor
) -> torch.Tensor:
    """x [N, H]; w13 [E, 2I, H]; w2 [E, H, I] (unit last strides); topk_weights [N, k];
    local_ids [N, k] (ids outside [0, E) contribute zero) -> [N, H] in x's dtype."""
    n, k = local_ids.shape
    num_experts, hidden, inter = w13.shape[0], x.shape[1], w2.shape[2]
    out = torch.empty(n, hidden, dtype=x.dtype, device=x.device)  # [N, H]
    if n == 0:
        return out
    ids = local_ids.reshape(-1).to(torch.int32).contiguous()  # [N k]
    act = torch.empty(n * k, inter, dtype=x.dtype, device=x.device)  # [N k, I]; foreign pairs' rows unread
    tiles = dict(BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K_FEW if n * k <= FEW_PAIRS else BLOCK_K_MANY, num_warps=8, num_stages=2)
    launch(_gate_up_gemv_kernel, (n * k, triton.cdiv(inter, BLOCK_N)), x, w13, act, ids,
           k, num_experts, hidden, inter, x.stride(0), w13.stride(0), w13.stride(1), act.stride(0), **tiles, pdl=True)
    weights = topk_weights.reshape(-1).float().contiguous()  # [N k]
    launch(_down_gemv_kernel, (n, triton.cdiv(hidden, BLOCK_N)), act, w2, out, weights, ids,
           k, num_experts, hidden, inter, act.stride(0), w2.stride(0), w2.stride(1), out.stride(0), **tiles, pdl=True)
    return out
