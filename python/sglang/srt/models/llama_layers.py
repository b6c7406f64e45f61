"""The Llama decoder layer and its attention and MLP, which the other families build on or reuse."""

from __future__ import annotations

from types import ModuleType
from typing import NamedTuple, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from sgl_kernel_ext.activation.silu_mul_cpu import silu_mul_cpu, silu_mul_cpu_available
from sgl_kernel_ext.layer.decode_layer_cpu import DecodeLayerWeights, decode_layer_kernel_available, decode_layer_weights
from sgl_kernel_ext.rotary.rope_store_cpu import rope_store_cpu, rope_store_cpu_applies
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.attention import Attention
from sglang.srt.layers.batch_invariant import pointwise
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from sglang.srt.layers.rotary import RotaryEmbedding, apply_rotary_emb
from sglang.srt.layers.triton_kernels import triton_kernels
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

class FusedRope(NamedTuple):
    """On CUDA, what each layer's fused norm/RoPE/KV-store kernel reads: the step's row indices
    into a float32 cos/sin table (the positions into the module's table, nothing gathered per
    step; or, for length-dependent RoPE, 0..N-1 into the step's own rows), and what the torch
    path needs where the kernel does not apply."""

    table_index: torch.Tensor  # [N] int64
    table: torch.Tensor  # [P, D] float32
    positions: torch.Tensor  # [N] int64
    seq_lens: Optional[torch.Tensor]  # [N] int64 for length-dependent RoPE, else None
    rotary_emb: RotaryEmbedding


# A step's RoPE input to every layer: cos, signed sin [N, 1, R] of its positions over the R
# rotated dims (RotaryEmbedding.forward), or on CUDA, where R is the whole head, a FusedRope.
Rope = Union[tuple[torch.Tensor, torch.Tensor], FusedRope]


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, tp_rank: int, tp_size: int) -> None:
        super().__init__()
        tp = dict(params_dtype=dtype, tp_rank=tp_rank, tp_size=tp_size)
        inter = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [inter, inter], **tp)
        self.down_proj = RowParallelLinear(inter, config.hidden_size, **tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = self.gate_up_proj.fused_silu_mul(x)  # [N, I / tp], a CUDA decode batch of a few rows
        if fused is not None:
            return self.down_proj(fused)
        gate_up = self.gate_up_proj(x)  # [N, 2 I / tp]
        kernels = triton_kernels("activation.silu_mul_triton") if gate_up.is_cuda else None
        if kernels is not None and kernels.silu_mul_triton_applies(gate_up):
            return self.down_proj(kernels.silu_mul_triton(gate_up))  # one launch, no silu temporary
        if self.c_silu():
            # The int8-activation mode's SiLU on every path, so that its decode step, all in C,
            # gives the op-by-op path's bits.
            return self.down_proj(silu_mul_cpu(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)  # [N, I / tp] each
        return self.down_proj(pointwise(F.silu, gate).mul_(up))

    def c_silu(self) -> bool:
        """Whether SiLU runs in silu_mul_cpu.c: with projections packed for int8 activations."""
        block = self.down_proj.block_weight
        return block is not None and block.int8_activations and silu_mul_cpu_available()


class LlamaAttention(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        dtype: torch.dtype,
        tp_rank: int,
        tp_size: int,
        qk_norm: bool,
        sliding_window: Optional[int] = None,
    ) -> None:
        super().__init__()
        tp = dict(params_dtype=dtype, tp_rank=tp_rank, tp_size=tp_size)
        d = config.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, d, config.num_attention_heads, config.num_key_value_heads, config.attention_bias, **tp
        )
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(config.num_attention_heads * d, config.hidden_size, **tp)
        self.q_norm = RMSNorm(d, config.rms_norm_eps, params_dtype=dtype) if qk_norm else None
        self.k_norm = RMSNorm(d, config.rms_norm_eps, params_dtype=dtype) if qk_norm else None
        self.attn = Attention(layer_id, self.num_heads, self.num_kv_heads, d, d**-0.5, sliding_window=sliding_window)

    def forward(self, rope: Rope, x: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        return self.attend(rope, self.qkv_proj(x), forward_batch)  # qkv_proj: [N, (Hq + 2 Hk) * D]

    def attend(self, rope: Rope, qkv: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        """qkv [N, (Hq + 2 Hk) * D] projections -> the attention output projected, [N, H]."""
        n, d, heads, kv_heads = qkv.shape[0], self.attn.head_dim, self.num_heads, self.num_kv_heads
        k_buf, v_buf = forward_batch.kv_cache.get_kv(self.attn.layer_id)
        if isinstance(rope, FusedRope):
            kernels = triton_kernels("rotary.rope_store_triton")
            if kernels.rope_store_triton_applies(qkv, k_buf, v_buf):
                # One launch for q/k norm, RoPE and the K/V store (instead of ~15 small kernels).
                q = self._rope_store_triton(kernels, rope, qkv, k_buf, v_buf, forward_batch)  # [N, Hq, D]
                return self.o_proj(self.attn(q, None, None, forward_batch))
            rope = rope.rotary_emb(rope.positions, qkv.dtype, rope.seq_lens)
        if self.q_norm is None and rope[0].shape[-1] == d and rope_store_cpu_applies(qkv, k_buf):
            # One C call on CPU: q rotated in place, k rotated and v copied into the cache.
            q = rope_store_cpu(qkv, heads, *rope, forward_batch.out_cache_loc, k_buf, v_buf)  # [N, Hq, D]
            return self.o_proj(self.attn(q, None, None, forward_batch))
        # q and k heads are adjacent in the fused output, so they are normed and rotated as one tensor.
        qk, v = qkv.split([(heads + kv_heads) * d, kv_heads * d], dim=-1)
        qk = qk.view(n, heads + kv_heads, d)
        if self.q_norm is not None:
            # Contiguous copies, so that RMSNorm takes its per-row kernel at every N: the strided
            # views count as contiguous only when N == 1, and the torch fallback the others took
            # rounds differently, so a row's bits changed between alone and batched.
            q_part, k_part = qk[:, :heads].contiguous(), qk[:, heads:].contiguous()  # [N, Hq, D], [N, Hk, D]
            qk = torch.cat([self.q_norm(q_part), self.k_norm(k_part)], dim=1)
        q, k = apply_rotary_emb(qk, *rope).split([heads, kv_heads], dim=1)  # [N, Hq, D], [N, Hk, D]
        return self.o_proj(self.attn(q, k, v.view(n, kv_heads, d), forward_batch))

    def _rope_store_triton(
        self,
        kernels: ModuleType,
        rope: FusedRope,
        qkv: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        forward_batch: ForwardBatch,
    ) -> torch.Tensor:
        """-> rotated q [N, Hq, D]; k and v are in the cache."""
        norm = {}
        if self.q_norm is not None:
            norm = dict(q_norm_weight=self.q_norm.weight, k_norm_weight=self.k_norm.weight, eps=self.q_norm.eps)
        return kernels.rope_store_triton(
            qkv, self.num_heads, rope.table_index, rope.table, forward_batch.out_cache_loc,
            k_buf, v_buf, **norm,
        )


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, dtype: torch.dtype, tp_rank: int, tp_size: int,
                 qk_norm: bool, sliding_window: Optional[int] = None) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, params_dtype=dtype)
        self.self_attn = LlamaAttention(config, layer_id, dtype, tp_rank, tp_size, qk_norm, sliding_window)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, params_dtype=dtype)
        self.mlp = self.build_mlp(config, layer_id, dtype, tp_rank, tp_size)

    def build_mlp(self, config: ModelConfig, layer_id: int, dtype: torch.dtype, tp_rank: int, tp_size: int) -> nn.Module:
        """The layer's MLP: [N, H] -> [N, H], all-reduced over the TP group (a family's MoE block)."""
        return LlamaMLP(config, dtype, tp_rank, tp_size)

    def forward(
        self, rope: Rope, x: torch.Tensor, residual: Optional[torch.Tensor], forward_batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's MLP output, the residual stream before it); the next norm adds them.
        At a CUDA decode step of a few rows each norm runs inside the launch of the projection
        after it (RMSNorm.fused_linear): two launches fewer per layer."""
        x, residual = self._attention(rope, x, residual, forward_batch)
        return self._mlp(x, residual)

    def _attention(
        self, rope: Rope, x: torch.Tensor, residual: Optional[torch.Tensor], forward_batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (the attention output [N, H], the residual stream x + residual [N, H])."""
        fused = None
        if isinstance(rope, FusedRope):  # CUDA, with the fused q/k norm, RoPE and KV-store kernel
            fused = self.input_layernorm.fused_linear(self.self_attn.qkv_proj, x, residual)
        if fused is not None:
            qkv, residual = fused  # [N, (Hq + 2 Hk) * D], [N, H]
            return self.self_attn.attend(rope, qkv, forward_batch), residual
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        return self.self_attn(rope, x, forward_batch), residual

    def _mlp(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (the MLP output of the post-attention norm of x + residual [N, H], x + residual [N, H])."""
        fused = None
        if isinstance(self.mlp, LlamaMLP):  # not a family's MoE block
            fused = self.post_attention_layernorm.fused_linear(self.mlp.gate_up_proj, x, residual, silu_mul=True)
        if fused is not None:
            act, residual = fused  # [N, I / tp], [N, H]
            return self.mlp.down_proj(act), residual
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual

    def cpu_decode_weights(self) -> Optional[DecodeLayerWeights]:
        """This layer's weights for the one-call CPU decode, or None where it cannot take them:
        a projection without integer blocks, a bias on gate_up, q/k norms, a sliding window, tensor
        parallelism."""
        attn, mlp = self.self_attn, self.mlp
        linears = {"qkv": attn.qkv_proj, "o": attn.o_proj, "gate_up": mlp.gate_up_proj, "down": mlp.down_proj}
        blocks = {name: linear.block_weight for name, linear in linears.items()}
        if (
            any(b is None for b in blocks.values())
            or attn.q_norm is not None
            or attn.attn.sliding_window is not None
            or mlp.gate_up_proj.bias is not None
            or attn.o_proj.tp_size > 1
            or not decode_layer_kernel_available()
        ):
            return None
        return decode_layer_weights(
            (self.input_layernorm.weight.detach(), self.post_attention_layernorm.weight.detach()),
            (self.input_layernorm.eps, self.post_attention_layernorm.eps), blocks,
            {name: _detached(linears[name].bias) for name in ("qkv", "o", "down")},
            (attn.num_heads, attn.num_kv_heads, attn.attn.head_dim), attn.attn.scaling,
        )


def _detached(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach()


