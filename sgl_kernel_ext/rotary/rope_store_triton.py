"""One Triton kernel per attention layer on CUDA: Qwen3's per-head q/k RMSNorm (optional), the
rotate-half RoPE of q and k, and the KV-cache write of k and v, straight from the fused qkv
projection output.

One program per (token, q or KV head); a KV-head program also copies that head's v. Rotated q
goes to a new contiguous [N, Hq, D] tensor (qkv is left unchanged), so any attention backend
can take it. Rows are independent (batch-invariant) and there are no host reads (capturable in
a CUDA graph), so positions and out_cache_loc are not range-checked: the caller guarantees
positions < P and slots < S.

Numerics follow the torch path (rotary.reference.rope_store_reference) rounding for rounding:
the norm as in norm.rmsnorm_triton; cos/sin rounded from the float32 table to the model dtype;
rotate_half(x) * signed_sin rounded to the model dtype, then x * cos added with one fused
multiply-add and rounded (torch's addcmul_). In bfloat16 and float16 that reproduces the torch
path bit for bit but for the q/k norm's row-sum order (rarely a 1-ulp difference); in float32
the norm differs from torch's by up to ~2 ulp (sum order; torch's rsqrt is not IEEE).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.triton_launch import launch, pdl_sync

from sgl_kernel_ext.norm.rmsnorm_triton import DTYPES, round_to


@triton.jit
def _norm_halves(x1, x2, w_ptr, eps, HALF: tl.constexpr, d, live, dtype: tl.constexpr):
    """RMSNorm of one head given as its two halves (float32, padded with zeros) -> the halves."""
    mean_sq = tl.math.div_rn(tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0), 2.0 * HALF)
    rstd = tl.math.div_rn(1.0, tl.sqrt_rn(mean_sq + eps))
    w1 = tl.load(w_ptr + d, mask=live, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + d, mask=live, other=0.0).to(tl.float32)
    return round_to(round_to(x1 * rstd, dtype) * w1, dtype), round_to(round_to(x2 * rstd, dtype) * w2, dtype)


@triton.jit
def _rope_store_kernel(
    qkv_ptr,  # [N, >= (Hq + 2 Hk) * D], unit column stride
    positions_ptr,  # [N]
    cos_sin_ptr,  # [P, D] float32: cos | sin of D / 2 frequencies
    q_norm_ptr,  # [D], read when HAS_NORM
    k_norm_ptr,  # [D], read when HAS_NORM
    loc_ptr,  # [N] KV-cache slots
    q_out_ptr,  # [N, Hq, D]
    k_buf_ptr,  # [S, Hk, D]
    v_buf_ptr,  # [S, Hk, D]
    stride_qkv,
    stride_cos_sin,
    stride_q_n,
    stride_q_h,
    stride_k_s,
    stride_k_h,
    stride_v_s,
    stride_v_h,
    eps,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,  # D / 2
    HALF_PAD: tl.constexpr,
    HAS_NORM: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    dtype = qkv_ptr.dtype.element_ty
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)  # q heads, then KV heads: adjacent in qkv as in this grid
    d = tl.arange(0, HALF_PAD)
    live = d < HALF
    row = qkv_ptr + token * stride_qkv
    src = row + head * (2 * HALF)
    x1 = tl.load(src + d, mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + d, mask=live, other=0.0).to(tl.float32)
    is_q = head < NUM_HEADS
    if HAS_NORM:
        if is_q:
            x1, x2 = _norm_halves(x1, x2, q_norm_ptr, eps, HALF, d, live, dtype)
        else:
            x1, x2 = _norm_halves(x1, x2, k_norm_ptr, eps, HALF, d, live, dtype)
    table = cos_sin_ptr + tl.load(positions_ptr + token).to(tl.int64) * stride_cos_sin
    cos = round_to(tl.load(table + d, mask=live, other=0.0), dtype)
    sin = round_to(tl.load(table + HALF + d, mask=live, other=0.0), dtype)
    # torch's addcmul_ is one fused multiply-add (on CPU and CUDA alike).
    out1 = round_to(tl.fma(x1, cos, round_to(x2 * -sin, dtype)), dtype)
    out2 = round_to(tl.fma(x2, cos, round_to(x1 * sin, dtype)), dtype)
    if is_q:
        dst = q_out_ptr + token * stride_q_n + head * stride_q_h
        tl.store(dst + d, out1.to(q_out_ptr.dtype.element_ty), mask=live)
        tl.store(dst + HALF + d, out2.to(q_out_ptr.dtype.element_ty), mask=live)
    else:
        kv_head = head - NUM_HEADS
        slot = tl.load(loc_ptr + token).to(tl.int64)
        k_dst = k_buf_ptr + slot * stride_k_s + kv_head * stride_k_h
        tl.store(k_dst + d, out1.to(k_buf_ptr.dtype.element_ty), mask=live)
        tl.store(k_dst + HALF + d, out2.to(k_buf_ptr.dtype.element_ty), mask=live)
        v_src = row + (NUM_HEADS + NUM_KV_HEADS + kv_head) * (2 * HALF)
        v_dst = v_buf_ptr + slot * stride_v_s + kv_head * stride_v_h
        v1 = tl.load(v_src + d, mask=live, other=0.0)
        v2 = tl.load(v_src + HALF + d, mask=live, other=0.0)
        tl.store(v_dst + d, v1.to(v_buf_ptr.dtype.element_ty), mask=live)
        tl.store(v_dst + HALF + d, v2.to(v_buf_ptr.dtype.element_ty), mask=live)


def rope_store_triton_applies(qkv: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor) -> bool:
    """Whether the kernel takes these: CUDA, float dtypes, qkv [N, ...] with unit column stride,
    caches [S, Hk, D] of one shape with unit stride along D, and D even."""
    return qkv.is_cuda and _layout_ok(qkv, k_buf, v_buf)


def _layout_ok(qkv: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor) -> bool:
    return (
        qkv.dtype in DTYPES
        and qkv.dim() == 2
        and qkv.stride(1) == 1
        and k_buf.dim() == 3
        and k_buf.shape == v_buf.shape
        and k_buf.shape[2] % 2 == 0
        and k_buf.stride(2) == 1
        and v_buf.stride(2) == 1
    )


def rope_store_triton(
    qkv: torch.Tensor,
    num_heads: int,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    loc: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    q_norm_weight: Optional[torch.Tensor] = None,
    k_norm_weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """qkv [N, (Hq + 2 Hk) * D] (q, k, v heads packed; unit column stride); positions [N] int;
    cos_sin_cache [P, D] float32; loc [N] int KV slots; k_buf, v_buf [S, Hk, D]; optional
    q_norm_weight and k_norm_weight [D] (both or neither) with eps. Stores the (normed) rotated
    k at k_buf[loc] and v at v_buf[loc]. -> (normed) rotated q, a new [N, Hq, D] tensor."""
    tokens = qkv.shape[0]
    _check(qkv, num_heads, positions, cos_sin_cache, loc, k_buf, v_buf, q_norm_weight, k_norm_weight)
    num_kv_heads, head_dim = k_buf.shape[1], k_buf.shape[2]
    q = torch.empty((tokens, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)  # [N, Hq, D]
    if tokens == 0:
        return q
    has_norm = q_norm_weight is not None
    half_pad = triton.next_power_of_2(head_dim // 2)
    launch(_rope_store_kernel, (tokens, num_heads + num_kv_heads),
        qkv, positions, cos_sin_cache,
        q_norm_weight if has_norm else cos_sin_cache, k_norm_weight if has_norm else cos_sin_cache,
        loc, q, k_buf, v_buf,
        qkv.stride(0), cos_sin_cache.stride(0), q.stride(0), q.stride(1),
        k_buf.stride(0), k_buf.stride(1), v_buf.stride(0), v_buf.stride(1), eps,
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HALF=head_dim // 2, HALF_PAD=half_pad,
        HAS_NORM=has_norm, num_warps=max(1, min(4, half_pad // 64)), pdl=True,
    )
    return q


def _check(
    qkv: torch.Tensor,
    num_heads: int,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    loc: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    q_norm_weight: Optional[torch.Tensor],
    k_norm_weight: Optional[torch.Tensor],
) -> None:
    """Shape and layout checks only (metadata: nothing is read back from the device)."""
    if not _layout_ok(qkv, k_buf, v_buf):
        raise ValueError("rope_store_triton takes qkv [N, ...] with unit column stride and caches [S, Hk, D], D even.")
    tokens, (num_kv_heads, head_dim) = qkv.shape[0], k_buf.shape[1:]
    if qkv.shape[1] < (num_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(f"qkv rows hold {qkv.shape[1]} values, fewer than the q, k and v heads.")
    if any(t.shape != (tokens,) or not t.is_contiguous() for t in (positions, loc)):
        raise ValueError(f"positions and loc must be contiguous [{tokens}].")
    if cos_sin_cache.dtype != torch.float32 or cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim:
        raise ValueError(f"cos_sin_cache must be float32 [P, {head_dim}].")
    if cos_sin_cache.stride(1) != 1:
        raise ValueError("cos_sin_cache must have unit column stride.")
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("give both q_norm_weight and k_norm_weight, or neither.")
    for w in (q_norm_weight, k_norm_weight):
        if w is not None and (w.shape != (head_dim,) or w.stride(0) != 1):
            raise ValueError(f"q/k norm weights must be contiguous [{head_dim}].")

