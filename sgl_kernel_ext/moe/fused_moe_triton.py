"""The MoE experts as two grouped-GEMM Triton kernels for CUDA.

After the alignment (align_triton.py on CUDA up to its count-table size, else align.py) sorts the
(token, slot) pairs into per-expert blocks of BLOCK_M rows:
1. gate_up: each program multiplies one block's tokens by a BLOCK_N slice of its expert's gate
   and up rows and writes silu(gate) * up (float32 math, rounded to the model dtype) to the
   pair's row of act [N k, I];
2. down: each program multiplies a block's act rows by a BLOCK_N slice of the expert's w2 and
   writes weight * result to the pair's row of out [N k, H];
then the k slots of each token are summed in float32. Decode-sized batches skip the alignment
and take the GEMV kernels of fused_moe_gemv.py instead. Pairs of another EP rank's experts are
never written: their rows stay zero. Shapes depend on N alone and nothing reads back to the
host, so CUDA graphs capture the whole path. Numerics: sgl_kernel_ext.moe.reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.attention.paged_decode import _dot, dot_flags
from sgl_kernel_ext.moe.align import align_to_blocks
from sgl_kernel_ext.moe.align_triton import align_to_blocks_triton, align_triton_applies
from sgl_kernel_ext.moe.fused_moe_gemv import fused_experts_gemv, fused_experts_gemv_applies
from sgl_kernel_ext.norm.rmsnorm_triton import DTYPES, round_to
from sgl_kernel_ext.triton_launch import launch, pdl_sync


@triton.jit
def _gate_up_kernel(
    x_ptr,  # [N, H]
    w13_ptr,  # [E, 2I, H]
    act_ptr,  # [N k, I]
    sorted_pairs_ptr,  # [P] int32
    block_expert_ptr,  # [P / BLOCK_M] int32
    num_pairs, top_k, num_experts, hidden, inter,
    stride_x, stride_we, stride_wn, stride_act,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    dtype = act_ptr.dtype.element_ty
    n_blocks = tl.cdiv(inter, BLOCK_N)
    block, col_block = tl.program_id(0) // n_blocks, tl.program_id(0) % n_blocks
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    if expert >= num_experts:
        return
    pairs = tl.load(sorted_pairs_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # [BM]
    live = pairs < num_pairs
    tokens = pairs // top_k
    cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    col_live = cols < inter
    w_base = w13_ptr + expert * stride_we
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_live = ks < hidden
        a = tl.load(x_ptr + tokens[:, None] * stride_x + ks[None, :], mask=live[:, None] & k_live[None, :], other=0.0)
        w_mask = k_live[:, None] & col_live[None, :]
        w_gate = tl.load(w_base + cols[None, :] * stride_wn + ks[:, None], mask=w_mask, other=0.0)  # [BK, BN]
        w_up = tl.load(w_base + (cols[None, :] + inter) * stride_wn + ks[:, None], mask=w_mask, other=0.0)
        acc_gate += _dot(a, w_gate, DOT_PRECISION, DOT_UPCAST)
        acc_up += _dot(a, w_up, DOT_PRECISION, DOT_UPCAST)
    act = round_to(acc_gate / (1.0 + tl.exp(-acc_gate)) * acc_up, dtype)
    out = act_ptr + pairs[:, None] * stride_act + cols[None, :]
    tl.store(out, act.to(dtype), mask=live[:, None] & col_live[None, :])


@triton.jit
def _down_kernel(
    act_ptr,  # [N k, I]
    w2_ptr,  # [E, H, I]
    out_ptr,  # [N k, H]
    weights_ptr,  # [N k] float32
    sorted_pairs_ptr, block_expert_ptr,
    num_pairs, num_experts, hidden, inter,
    stride_act, stride_we, stride_wn, stride_out,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    dtype = out_ptr.dtype.element_ty
    n_blocks = tl.cdiv(hidden, BLOCK_N)
    block, col_block = tl.program_id(0) // n_blocks, tl.program_id(0) % n_blocks
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    if expert >= num_experts:
        return
    pairs = tl.load(sorted_pairs_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    live = pairs < num_pairs
    cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    col_live = cols < hidden
    w_base = w2_ptr + expert * stride_we
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_live = ks < inter
        a = tl.load(act_ptr + pairs[:, None] * stride_act + ks[None, :], mask=live[:, None] & k_live[None, :], other=0.0)
        w = tl.load(w_base + cols[None, :] * stride_wn + ks[:, None], mask=k_live[:, None] & col_live[None, :], other=0.0)
        acc += _dot(a, w, DOT_PRECISION, DOT_UPCAST)
    weight = tl.load(weights_ptr + pairs, mask=live, other=0.0)  # [BM]
    out = out_ptr + pairs[:, None] * stride_out + cols[None, :]
    tl.store(out, (acc * weight[:, None]).to(dtype), mask=live[:, None] & col_live[None, :])


def fused_experts_triton_applies(x: torch.Tensor, w13: torch.Tensor) -> bool:
    """CUDA, a float dtype shared by x and the weights, x [N, H] and weights with unit last stride."""
    return x.is_cuda and x.dtype in DTYPES and w13.dtype == x.dtype and x.dim() == 2 and x.stride(1) == 1


def block_config(num_pairs: int, num_experts: int, dtype: torch.dtype, batch_invariant: bool = False) -> dict:
    """Tiles by the pairs an expert receives on average: BLOCK_M near that count, so that an
    expert's weights are read by as few blocks as possible without padding most rows (the best of
    benchmark/gpu_kernel_sweep.py at Qwen3-30B-A3B's shapes in bf16 on an H200 at 64 and 256
    tokens, the widest tier on an H100; docs/gpu_engine.md; float32 halves the K tile to stay in
    shared memory); one fixed tile when batch_invariant, so that a row's sums never depend on the
    batch."""
    per_expert = num_pairs / max(num_experts, 1)
    if batch_invariant:
        cfg = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, num_warps=8, num_stages=3)
    elif per_expert < 16:
        cfg = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, num_warps=4, num_stages=3)
    elif per_expert < 64:
        cfg = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3)
    else:
        cfg = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)
    if dtype == torch.float32:
        cfg["BLOCK_K"] //= 2
    return cfg


def fused_experts_triton(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    local_ids: torch.Tensor,
    batch_invariant: bool = False,
) -> torch.Tensor:
    """x [N, H]; w13 [E, 2I, H]; w2 [E, H, I]; topk_weights [N, k]; local_ids [N, k] (ids
    outside [0, E) contribute zero) -> [N, H] in x's dtype."""
    n, k = local_ids.shape
    num_experts, hidden, inter = w13.shape[0], x.shape[1], w2.shape[2]
    num_pairs = n * k
    w13, w2 = w13.contiguous(), w2.contiguous()
    if fused_experts_gemv_applies(num_pairs, k, batch_invariant):
        return fused_experts_gemv(x, w13, w2, topk_weights, local_ids)
    cfg = block_config(num_pairs, num_experts, x.dtype, batch_invariant)
    align = align_to_blocks_triton if align_triton_applies(local_ids, num_experts) else align_to_blocks
    blocks = align(local_ids, num_experts, cfg["BLOCK_M"])
    flags = dot_flags(x.dtype)
    act = torch.empty(num_pairs, inter, dtype=x.dtype, device=x.device)  # [N k, I]
    grid = (blocks.block_expert.shape[0] * triton.cdiv(inter, cfg["BLOCK_N"]),)
    launch(_gate_up_kernel, grid, x, w13, act, blocks.sorted_pairs, blocks.block_expert,
           num_pairs, k, num_experts, hidden, inter, x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
           **cfg, **flags, pdl=True)
    out = torch.zeros(num_pairs, hidden, dtype=x.dtype, device=x.device)  # [N k, H]; foreign pairs stay 0
    weights = topk_weights.reshape(-1).float().contiguous()  # [N k]
    grid = (blocks.block_expert.shape[0] * triton.cdiv(hidden, cfg["BLOCK_N"]),)
    launch(_down_kernel, grid, act, w2, out, weights, blocks.sorted_pairs, blocks.block_expert,
           num_pairs, num_experts, hidden, inter, act.stride(0), w2.stride(0), w2.stride(1), out.stride(0),
           **cfg, **flags, pdl=True)
    return out.view(n, k, hidden).sum(dim=1, dtype=torch.float32).to(x.dtype)
