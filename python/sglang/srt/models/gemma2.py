"""Gemma2: a decoder with GeGLU (tanh GELU) MLPs, pre- and post-norms around attention and MLP,
(1 + w) RMSNorms, queries scaled by query_pre_attn_scalar^-0.5, attention and final-logit
soft-capping, sliding-window layers alternating with global ones, and embeddings scaled by
sqrt(hidden) in the model dtype. Also the base of Gemma3 (gemma3.py)."""

from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.configs.sliding_window import FULL, SLIDING, layer_types
from sglang.srt.layers.attention import Attention
from sglang.srt.layers.batch_invariant import pointwise
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from sglang.srt.layers.rotary import RotaryEmbedding, apply_rotary_emb
from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.llama import LlamaForCausalLM

# cos, signed sin [N, 1, D] of a step's positions (RotaryEmbedding.forward), per layer type.
Ropes = dict[str, tuple[torch.Tensor, torch.Tensor]]


class GemmaMLP(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, tp_rank: int, tp_size: int) -> None:
        super().__init__()
        tp = dict(params_dtype=dtype, tp_rank=tp_rank, tp_size=tp_size)
        inter = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [inter, inter], **tp)
        self.down_proj = RowParallelLinear(inter, config.hidden_size, **tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # [N, I / tp] each
        return self.down_proj(pointwise(functools.partial(F.gelu, approximate="tanh"), gate).mul_(up))


class GemmaAttention(nn.Module):
    """Gemma2's attention; with qk_norm, Gemma3's (a (1 + w) RMSNorm on each q and k head before RoPE)."""

    def __init__(
        self, config: ModelConfig, layer_id: int, layer_type: str, dtype: torch.dtype, tp_rank: int, tp_size: int,
        qk_norm: bool, logit_cap: Optional[float],
    ) -> None:
        super().__init__()
        tp = dict(params_dtype=dtype, tp_rank=tp_rank, tp_size=tp_size)
        hf, d = config.hf_config, config.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, d, config.num_attention_heads, config.num_key_value_heads, config.attention_bias, **tp
        )
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * d, config.hidden_size, bias=config.attention_bias, **tp
        )
        norm = dict(params_dtype=dtype, unit_offset=True)
        self.q_norm = RMSNorm(d, config.rms_norm_eps, **norm) if qk_norm else None
        self.k_norm = RMSNorm(d, config.rms_norm_eps, **norm) if qk_norm else None
        window = int(hf["sliding_window"]) if layer_type == SLIDING else None
        scaling = float(hf.get("query_pre_attn_scalar", d)) ** -0.5
        self.attn = Attention(
            layer_id, self.num_heads, self.num_kv_heads, d, scaling, sliding_window=window, logit_cap=logit_cap
        )

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        n, d, heads, kv_heads = x.shape[0], self.attn.head_dim, self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x)  # [N, (Hq + 2 Hk) * D]
        qk, v = qkv.split([(heads + kv_heads) * d, kv_heads * d], dim=-1)
        qk = qk.view(n, heads + kv_heads, d)
        if self.q_norm is not None:
            qk = torch.cat([self.q_norm(qk[:, :heads].contiguous()), self.k_norm(qk[:, heads:].contiguous())], dim=1)
        q, k = apply_rotary_emb(qk, *rope).split([heads, kv_heads], dim=1)  # [N, Hq, D], [N, Hk, D]
        return self.o_proj(self.attn(q, k, v.view(n, kv_heads, d), forward_batch))


class GemmaDecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, layer_id: int, layer_type: str, dtype: torch.dtype, tp_rank: int, tp_size: int,
        qk_norm: bool, logit_cap: Optional[float],
    ) -> None:
        super().__init__()
        self.layer_type = layer_type
        hidden, eps = config.hidden_size, config.rms_norm_eps
        norm = dict(params_dtype=dtype, unit_offset=True)
        self.input_layernorm = RMSNorm(hidden, eps, **norm)
        self.self_attn = GemmaAttention(config, layer_id, layer_type, dtype, tp_rank, tp_size, qk_norm, logit_cap)
        self.post_attention_layernorm = RMSNorm(hidden, eps, **norm)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps, **norm)
        self.mlp = GemmaMLP(config, dtype, tp_rank, tp_size)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps, **norm)

    def forward(
        self, ropes: Ropes, x: torch.Tensor, residual: Optional[torch.Tensor], forward_batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's normed MLP output, the residual stream before it); the next norm adds them."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.post_attention_layernorm(self.self_attn(ropes[self.layer_type], x, forward_batch))
        x, residual = self.pre_feedforward_layernorm(x, residual)
        return self.post_feedforward_layernorm(self.mlp(x)), residual


class Gemma2Model(nn.Module):
    qk_norm = False
    # Every second layer is global when the config lists no layer_types (transformers' default).
    default_sliding_window_pattern = 2

    def __init__(self, config: ModelConfig, dtype: torch.dtype, tp_rank: int, tp_size: int) -> None:
        super().__init__()
        tp = dict(params_dtype=dtype, tp_rank=tp_rank, tp_size=tp_size)
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, **tp)
        # sqrt(hidden) rounded to the model dtype first, as the reference does.
        self.embed_scale = torch.tensor(config.hidden_size**0.5, dtype=dtype).item()
        types = layer_types(config.hf_config, config.num_hidden_layers, self.default_sliding_window_pattern)
        logit_cap = self.attn_logit_cap(config)
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(config, i, types[i], dtype, tp_rank, tp_size, self.qk_norm, logit_cap)
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, params_dtype=dtype, unit_offset=True)
        self.rotary_embs = self.build_rotary(config)

    def attn_logit_cap(self, config: ModelConfig) -> Optional[float]:
        return config.hf_config.get("attn_logit_softcapping")

    def build_rotary(self, config: ModelConfig) -> nn.ModuleDict:
        """Layer type -> its RoPE table (one shared table here)."""
        return nn.ModuleDict(
            {"shared": RotaryEmbedding(config.head_dim, config.context_len, config.rope_theta, config.rope_scaling)}
        )

    def step_ropes(self, positions: torch.Tensor, dtype: torch.dtype) -> Ropes:
        rope = self.rotary_embs["shared"](positions, dtype)
        return {SLIDING: rope, FULL: rope}

    def forward(self, forward_batch: ForwardBatch) -> torch.Tensor:
        """-> [N, H] final hidden states of every new token."""
        x = self.embed_tokens(forward_batch.input_ids) * self.embed_scale  # [N, H]
        ropes, residual = self.step_ropes(forward_batch.positions, x.dtype), None
        for layer in self.layers:
            x, residual = layer(ropes, x, residual, forward_batch)
        x, _ = self.norm(x, residual)
        return x


class Gemma2ForCausalLM(LlamaForCausalLM):
    model_cls = Gemma2Model

    def build_model(self, config: ModelConfig, dtype: torch.dtype, tp_rank: int, tp_size: int) -> nn.Module:
        return self.model_cls(config, dtype, tp_rank, tp_size)

    def final_logit_softcapping(self, config: ModelConfig) -> Optional[float]:
        return config.hf_config.get("final_logit_softcapping")
