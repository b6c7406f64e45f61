"""GLM-4 (0414): the Llama decoder with two more RMSNorms (after attention and after the MLP,
before each is added to the residual stream), q/k/v biases, gate/up fused in the checkpoint, and
RoPE over half of each head in the interleaved (GPT-J) layout.

The interleaved rotation pairs dims (2i, 2i+1) of the rotated part; the rotate-half layout pairs
(i, i + R/2). Loading permutes the rows of the q and k projections (weights and biases) within
the rotated part of each head from [0, 1, 2, 3, ...] to [0, 2, 4, ..., 1, 3, 5, ...], so that the
rotate-half rotation of the permuted vectors is the interleaved rotation of the original ones,
permuted. q and k are permuted alike, so q . k, and with it the attention, is unchanged."""

from __future__ import annotations

from typing import Iterator, Optional

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.rotary import rotary_dim_of
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.models.fused_weights import Weights, split_fused
from sglang.srt.models.llama import LlamaForCausalLM
from sglang.srt.models.llama_layers import LlamaDecoderLayer, Rope

# transformers' Glm4Config rotates half of each head where the config does not say.
GLM4_PARTIAL_ROTARY_FACTOR = 0.5


class Glm4DecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: ModelConfig, layer_id: int, dtype: torch.dtype, tp_rank: int, tp_size: int) -> None:
        super().__init__(config, layer_id, dtype, tp_rank, tp_size, qk_norm=False)
        eps = config.rms_norm_eps
        self.post_self_attn_layernorm = RMSNorm(config.hidden_size, eps, params_dtype=dtype)
        self.post_mlp_layernorm = RMSNorm(config.hidden_size, eps, params_dtype=dtype)

    def forward(
        self, rope: Rope, x: torch.Tensor, residual: Optional[torch.Tensor], forward_batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's normed MLP output, the residual stream before it), as LlamaDecoderLayer."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.post_self_attn_layernorm(self.self_attn(rope, x, forward_batch))
        x, residual = self.post_attention_layernorm(x, residual)
        return self.post_mlp_layernorm(self.mlp(x)), residual

    def cpu_decode_weights(self) -> None:
        """The one-call CPU decode has no post-attention / post-MLP norms."""
        return None


class Glm4ForCausalLM(LlamaForCausalLM):
    default_partial_rotary_factor = GLM4_PARTIAL_ROTARY_FACTOR

    def make_layer(self, config: ModelConfig, layer_id: int, dtype: torch.dtype, tp_rank: int,
                   tp_size: int) -> nn.Module:
        return Glm4DecoderLayer(config, layer_id, dtype, tp_rank, tp_size)

    def load_weights(self, weights: Weights) -> None:
        c = self.config
        inter = c.intermediate_size
        weights = split_fused(weights, "gate_up_proj", {"gate_proj": inter, "up_proj": inter})
        rotary_dim = rotary_dim_of(c.head_dim, c.hf_config, GLM4_PARTIAL_ROTARY_FACTOR)
        super().load_weights(_rotate_half_layout(weights, c.head_dim, rotary_dim))


def _rotate_half_layout(weights: Weights, head_dim: int, rotary_dim: int) -> Iterator[tuple[str, torch.Tensor]]:
    """q_proj / k_proj weights [heads * D, H] and biases [heads * D] with each head's first
    `rotary_dim` rows reordered from interleaved pairs to halves (module docstring)."""
    evens, odds = torch.arange(0, rotary_dim, 2), torch.arange(1, rotary_dim, 2)
    inside = torch.cat([evens, odds, torch.arange(rotary_dim, head_dim)])  # [D]: one head's new row order
    for name, tensor in weights:
        if ".q_proj." in name or ".k_proj." in name:
            heads = tensor.shape[0] // head_dim
            order = (torch.arange(heads).unsqueeze(1) * head_dim + inside).flatten()  # [heads * D]
            tensor = tensor[order]
        yield name, tensor
