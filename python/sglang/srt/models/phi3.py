"""Phi-3: the Llama decoder with q/k/v and gate/up fused in the checkpoint, LongRoPE (`longrope`,
formerly `su`) scaling, an optional partial rotary factor and a sliding window."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.models.fused_weights import Weights, split_fused
from sglang.srt.models.llama import LlamaForCausalLM
from sglang.srt.models.llama_layers import LlamaDecoderLayer


class Phi3ForCausalLM(LlamaForCausalLM):
    def make_layer(self, config: ModelConfig, layer_id: int, dtype: torch.dtype, tp_rank: int,
                   tp_size: int) -> nn.Module:
        return LlamaDecoderLayer(config, layer_id, dtype, tp_rank, tp_size, False, _sliding_window(config))

    def load_weights(self, weights: Weights) -> None:
        c = self.config
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        weights = split_fused(weights, "qkv_proj", {"q_proj": q, "k_proj": kv, "v_proj": kv})
        inter = c.intermediate_size
        weights = split_fused(weights, "gate_up_proj", {"gate_proj": inter, "up_proj": inter})
        super().load_weights(weights)


def _sliding_window(config: ModelConfig) -> Optional[int]:
    """The config's window; None where it covers every position the server holds (it then masks
    nothing)."""
    window = config.hf_config.get("sliding_window")
    return window if window is not None and window < config.context_len else None
