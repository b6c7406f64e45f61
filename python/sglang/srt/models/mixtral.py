"""Mixtral: the Llama decoder whose every MLP is a sparse MoE block (`block_sparse_moe` in the
checkpoint): softmax top-k (`num_experts_per_tok`, top-2) over `num_local_experts` experts of
`intermediate_size`, the top-k weights renormalised; experts' w1 (gate), w3 (up), w2 (down)."""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.moe import TopKConfig, load_expert_weight
from sglang.srt.layers.moe.sparse_block import SparseMoeBlock
from sglang.srt.models.llama import LlamaForCausalLM
from sglang.srt.models.moe_decoder import MoeDecoderLayer, num_experts


class MixtralDecoderLayer(MoeDecoderLayer):
    def build_mlp(self, config: ModelConfig, layer_id: int, dtype: torch.dtype, tp_rank: int, tp_size: int) -> nn.Module:
        hf = config.hf_config
        topk = TopKConfig(hf["num_experts_per_tok"], renormalize=True)
        return SparseMoeBlock(config.hidden_size, num_experts(hf), config.intermediate_size, topk,
                              params_dtype=dtype, tp_rank=tp_rank, tp_size=tp_size)


class MixtralForCausalLM(LlamaForCausalLM):
    decoder_layer_cls = MixtralDecoderLayer

    def load_weight(self, params: dict[str, nn.Parameter], name: str, tensor: torch.Tensor) -> str:
        name = name.replace(".block_sparse_moe.", ".mlp.")
        return load_expert_weight(params, name, tensor) or super().load_weight(params, name, tensor)
