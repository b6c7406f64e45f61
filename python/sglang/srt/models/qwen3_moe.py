"""Qwen3-MoE: the Qwen3 decoder (q/k RMSNorm attention) whose MLPs are sparse MoE blocks:
softmax top-k routing over `num_experts` experts of `moe_intermediate_size`, the top-k weights
renormalised when `norm_topk_prob`. Layer i is sparse unless it is in `mlp_only_layers` or
(i + 1) is not a multiple of `decoder_sparse_step`; those keep a dense MLP of `intermediate_size`."""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.moe import TopKConfig, load_expert_weight
from sglang.srt.layers.moe.sparse_block import SparseMoeBlock
from sglang.srt.models.llama_layers import LlamaMLP
from sglang.srt.models.moe_decoder import MoeDecoderLayer, num_experts
from sglang.srt.models.qwen3 import Qwen3ForCausalLM


class Qwen3MoeDecoderLayer(MoeDecoderLayer):
    def build_mlp(self, config: ModelConfig, layer_id: int, dtype: torch.dtype, tp_rank: int, tp_size: int) -> nn.Module:
        hf = config.hf_config
        experts = num_experts(hf)
        sparse = (
            experts > 0
            and layer_id not in (hf.get("mlp_only_layers") or ())
            and (layer_id + 1) % hf.get("decoder_sparse_step", 1) == 0
        )
        if not sparse:
            return LlamaMLP(config, dtype, tp_rank, tp_size)
        topk = TopKConfig(hf["num_experts_per_tok"], bool(hf.get("norm_topk_prob", False)))
        return SparseMoeBlock(config.hidden_size, experts, hf["moe_intermediate_size"], topk,
                              params_dtype=dtype, tp_rank=tp_rank, tp_size=tp_size)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def make_layer(self, config: ModelConfig, layer_id: int, dtype: torch.dtype, tp_rank: int,
                   tp_size: int) -> nn.Module:
        return Qwen3MoeDecoderLayer(config, layer_id, dtype, tp_rank, tp_size, self.qk_norm)

    def load_weight(self, params: dict[str, nn.Parameter], name: str, tensor: torch.Tensor) -> str:
        return load_expert_weight(params, name, tensor) or super().load_weight(params, name, tensor)
