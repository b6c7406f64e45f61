"""OLMo 2: no norm before attention or the MLP; each block's output is RMS-normed and then added
to the residual stream (post-norm), and q and k are RMS-normed over the whole projection (all
heads at once, not per head) before RoPE."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.llama import LlamaForCausalLM
from sglang.srt.models.llama_layers import LlamaAttention, LlamaMLP, Rope


class Olmo2Attention(LlamaAttention):
    def __init__(self, config: ModelConfig, layer_id: int, dtype: torch.dtype, tp_rank: int, tp_size: int) -> None:
        if tp_size > 1:
            # The norms span all heads, which TP splits over ranks.
            raise ValueError("OLMo 2 (q/k RMSNorm over all heads) does not support --tp-size > 1.")
        super().__init__(config, layer_id, dtype, tp_rank, tp_size, qk_norm=False)
        d, eps = config.head_dim, config.rms_norm_eps
        self.q_proj_norm = RMSNorm(self.num_heads * d, eps, params_dtype=dtype)
        self.k_proj_norm = RMSNorm(self.num_kv_heads * d, eps, params_dtype=dtype)

    def forward(self, rope: Rope, x: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        d = self.attn.head_dim
        q, k, v = self.qkv_proj(x).split([self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * d], dim=-1)
        q, k = self.q_proj_norm(q.contiguous()), self.k_proj_norm(k.contiguous())  # [N, Hq D], [N, Hk D]
        return self.attend(rope, torch.cat([q, k, v], dim=-1), forward_batch)  # qkv: [N, (Hq + 2 Hk) D]


class Olmo2DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, dtype: torch.dtype, tp_rank: int, tp_size: int) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = Olmo2Attention(config, layer_id, dtype, tp_rank, tp_size)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, params_dtype=dtype)
        self.mlp = LlamaMLP(config, dtype, tp_rank, tp_size)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, eps, params_dtype=dtype)

    def forward(
        self, rope: Rope, x: torch.Tensor, residual: Optional[torch.Tensor], forward_batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's normed MLP output, the residual stream before it), as LlamaDecoderLayer."""
        stream = x if residual is None else x + residual  # [N, H]
        stream = stream + self.post_attention_layernorm(self.self_attn(rope, stream, forward_batch))
        return self.post_feedforward_layernorm(self.mlp(stream)), stream

    def cpu_decode_weights(self) -> None:
        """The one-call CPU decode computes pre-norm layers only."""
        return None


class Olmo2ForCausalLM(LlamaForCausalLM):
    def make_layer(self, config: ModelConfig, layer_id: int, dtype: torch.dtype, tp_rank: int,
                   tp_size: int) -> nn.Module:
        return Olmo2DecoderLayer(config, layer_id, dtype, tp_rank, tp_size)

    def load_weights(self, weights) -> None:
        super().load_weights((_our_name(name), tensor) for name, tensor in weights)


def _our_name(name: str) -> str:
    """The checkpoint's whole-projection q_norm / k_norm are q_proj_norm / k_proj_norm here, apart
    from LlamaAttention's per-head q_norm / k_norm (None in this model)."""
    for which in ("q", "k"):
        name = name.replace(f".self_attn.{which}_norm.", f".self_attn.{which}_proj_norm.")
    return name
