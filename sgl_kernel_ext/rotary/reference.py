"""Plain-torch reference for rotary.rope_store_triton: the model's torch path (LlamaAttention
with layers.rotary.apply_rotary_emb and, for Qwen3, the per-head q/k RMSNorm), taking the
positions and the float32 cos/sin table rather than rope_store_cpu's precomputed cos/sin."""

from __future__ import annotations

from typing import Optional

import torch

from sgl_kernel_ext.norm.reference import rmsnorm_reference


def rope_store_reference(
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
    """qkv [N, (Hq + 2 Hk) * D] -> rotated q [N, Hq, D] (a new tensor; qkv is not changed);
    stores rotated k at k_buf[loc] and v at v_buf[loc]. cos/sin are rounded to the model dtype
    and x * cos + rotate_half(x) * sin is computed in it, as the torch path does."""
    tokens, (num_kv_heads, head_dim) = qkv.shape[0], k_buf.shape[1:]
    q, k, v = qkv[:, : (num_heads + 2 * num_kv_heads) * head_dim].split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1
    )
    q, k = q.reshape(tokens, num_heads, head_dim), k.reshape(tokens, num_kv_heads, head_dim)
    if q_norm_weight is not None:
        q, k = rmsnorm_reference(q, q_norm_weight, eps), rmsnorm_reference(k, k_norm_weight, eps)
    cos, sin = cos_sin_cache[positions].to(qkv.dtype).unsqueeze(1).chunk(2, dim=-1)  # [N, 1, D / 2] each
    cos, signed_sin = torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)  # [N, 1, D]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x2, x1], dim=-1).mul_(signed_sin).addcmul_(x, cos)

    k_buf[loc] = rotate(k).to(k_buf.dtype)
    v_buf[loc] = v.reshape(tokens, num_kv_heads, head_dim).to(v_buf.dtype)
    return rotate(q)
