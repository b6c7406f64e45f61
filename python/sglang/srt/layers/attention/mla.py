"""Multi-head latent attention (DeepSeek-V2/V3) over a compressed paged KV cache.

Each token stores one row per layer: its normalised KV latent c_kv [r] and its rotated shared
rope key k_rope [d_rope] (one "head" of r + d_rope values). kv_b_proj's key and value halves are
absorbed into the query and the output: per head h,
    q_nope[h] . (W_UK[h] c_kv) = (q_nope[h] W_UK[h]) . c_kv      (W_UK[h]: [d_nope, r])
    sum_t p_t W_UV[h] c_kv_t = W_UV[h] (sum_t p_t c_kv_t)          (W_UV[h]: [d_v, r])
so attention is MQA over the latent rows, with queries [q_nope W_UK, q_rope] [H, r + d_rope] and
the same rows as keys and values; the first r values of each output are sum_t p_t c_kv_t (the
attention layer's v_head_dim = r: a backend may leave the rope part of each output undefined). Prefill, chunked prefill, cached prefixes and
decode all take this one form, through the step's attention backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from sglang.srt.layers.attention.attention_layer import Attention
from sglang.srt.layers.batch_invariant import is_batch_invariant, row_blocked
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import ColumnParallelLinear, RowParallelLinear, make_param
from sglang.srt.layers.rotary import apply_rotary_emb
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

# transformers builds q_a_layernorm and kv_a_layernorm with its RMSNorm's default epsilon, not
# the config's rms_norm_eps.
LATENT_NORM_EPS = 1e-6


@dataclass(frozen=True)
class MLAShape:
    hidden_size: int
    num_heads: int  # over all TP ranks
    q_lora_rank: Optional[int]  # None: a plain q_proj
    kv_lora_rank: int  # r
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    attention_bias: bool
    # Whether the checkpoint's rope dimensions come in interleaved pairs (x0, x1), (x2, x3), ...;
    # such rows are reordered at load (evens, then odds) so that rotate-half RoPE applies.
    rope_interleave: bool

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """The cached row per token and layer: c_kv and k_rope."""
        return self.kv_lora_rank + self.qk_rope_head_dim


class MLAttention(nn.Module):
    def __init__(self, shape: MLAShape, layer_id: int, scaling: float, dtype: torch.dtype, tp_rank: int,
                 tp_size: int) -> None:
        super().__init__()
        self.shape = shape
        tp = dict(params_dtype=dtype, tp_rank=tp_rank, tp_size=tp_size)
        hidden, heads, bias = shape.hidden_size, shape.num_heads, shape.attention_bias
        if shape.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(hidden, heads * shape.qk_head_dim, **tp)
        else:
            # The q and kv down-projections are replicated: every rank needs the whole latent.
            self.q_a_proj = ColumnParallelLinear(hidden, shape.q_lora_rank, bias, params_dtype=dtype)
            self.q_a_layernorm = RMSNorm(shape.q_lora_rank, LATENT_NORM_EPS, params_dtype=dtype)
            self.q_b_proj = ColumnParallelLinear(shape.q_lora_rank, heads * shape.qk_head_dim, **tp)
        self.kv_a_proj_with_mqa = ColumnParallelLinear(hidden, shape.latent_dim, bias, params_dtype=dtype)
        self.kv_a_layernorm = RMSNorm(shape.kv_lora_rank, LATENT_NORM_EPS, params_dtype=dtype)
        self.o_proj = RowParallelLinear(heads * shape.v_head_dim, hidden, bias, **tp)
        self.num_heads, self.num_kv_heads = heads // tp_size, 1
        self.head_start = tp_rank * self.num_heads
        # kv_b_proj, split by head into its key and value halves (loaded by load_kv_b_proj).
        self.w_uk = make_param((self.num_heads, shape.qk_nope_head_dim, shape.kv_lora_rank), dtype, None)
        self.w_uv = make_param((self.num_heads, shape.v_head_dim, shape.kv_lora_rank), dtype, None)
        self.attn = Attention(layer_id, self.num_heads, 1, shape.latent_dim, scaling, v_head_dim=shape.kv_lora_rank)

    def load_kv_b_proj(self, weight: torch.Tensor) -> None:
        """weight [H * (d_nope + d_v), r], the checkpoint's kv_b_proj: this rank's heads."""
        s = self.shape
        per_head = weight.view(s.num_heads, s.qk_nope_head_dim + s.v_head_dim, s.kv_lora_rank)
        mine = per_head.narrow(0, self.head_start, self.num_heads)  # [Hl, d_nope + d_v, r]
        w_uk, w_uv = mine.split([s.qk_nope_head_dim, s.v_head_dim], dim=1)
        self.w_uk.data.copy_(w_uk)
        self.w_uv.data.copy_(w_uv)

    def rope_row_order(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """The checkpoint tensor `name` (a projection of this module) with its rope rows in
        rotate-half order where the checkpoint interleaves them; other tensors unchanged."""
        s = self.shape
        if not s.rope_interleave:
            return tensor
        evens_then_odds = torch.cat([torch.arange(0, s.qk_rope_head_dim, 2), torch.arange(1, s.qk_rope_head_dim, 2)])
        if ".kv_a_proj_with_mqa." in name:
            rows = torch.cat([torch.arange(s.kv_lora_rank), s.kv_lora_rank + evens_then_odds])
            return tensor.index_select(0, rows)
        if ".q_b_proj.weight" in name or ".q_proj.weight" in name:
            per_head = torch.cat([torch.arange(s.qk_nope_head_dim), s.qk_nope_head_dim + evens_then_odds])
            rows = (torch.arange(s.num_heads)[:, None] * s.qk_head_dim + per_head).reshape(-1)
            return tensor.index_select(0, rows)
        return tensor

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor,
                forward_batch: ForwardBatch) -> torch.Tensor:
        """rope: cos, signed sin [N, 1, d_rope]; x [N, hidden] -> [N, hidden]."""
        s, n, heads = self.shape, x.shape[0], self.num_heads
        if s.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q_nope, q_rope = q.view(n, heads, s.qk_head_dim).split([s.qk_nope_head_dim, s.qk_rope_head_dim], dim=-1)
        c_kv, k_rope = self.kv_a_proj_with_mqa(x).split([s.kv_lora_rank, s.qk_rope_head_dim], dim=-1)  # [N, r], [N, d_rope]
        c_kv = self.kv_a_layernorm(c_kv.contiguous())
        k_rope = apply_rotary_emb(k_rope.unsqueeze(1), *rope)  # [N, 1, d_rope]
        latent = torch.cat([c_kv.unsqueeze(1), k_rope], dim=-1)  # [N, 1, r + d_rope]
        forward_batch.kv_cache.set_kv(self.attn.layer_id, forward_batch.out_cache_loc, latent, None)
        q_latent = torch.cat([per_head_matmul(q_nope, self.w_uk), apply_rotary_emb(q_rope, *rope)], dim=-1)  # [N, Hl, r + d_rope]
        out = self.attn(q_latent, None, None, forward_batch).view(n, heads, s.latent_dim)[..., : s.kv_lora_rank]
        out = per_head_matmul(out, self.w_uv.transpose(1, 2))  # [N, Hl, d_v]
        return self.o_proj(out.reshape(n, heads * s.v_head_dim))


def per_head_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [N, H, a] @ w [H, a, b] per head -> [N, H, b]; in batch-invariant mode on row blocks of
    a fixed size, so that a token's result does not depend on the batch."""

    def bmm(rows: torch.Tensor) -> torch.Tensor:
        return torch.bmm(rows.transpose(0, 1), w).transpose(0, 1)

    return row_blocked(bmm, x) if is_batch_invariant() else bmm(x)
