"""Build a model for a ModelConfig and fill its weights from GGUF or safetensors."""

from __future__ import annotations

from typing import Union

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.linear import block_quant_int8_activations
from sglang.srt.layers.moe.fused_moe import expert_parallel
from sglang.srt.model_loader.gguf_loader import iter_gguf_weights
from sglang.srt.model_loader.safetensors_loader import iter_safetensors_weights
from sglang.srt.models.registry import get_model_class


def load_model(
    config: ModelConfig,
    model_path: str,
    dtype: torch.dtype,
    device: Union[str, torch.device],
    tp_rank: int = 0,
    tp_size: int = 1,
    int8_activations: bool = False,
    ep_size: int = 1,
) -> nn.Module:
    """The model on `device` in `dtype`, holding this TP rank's shard of every weight.
    int8_activations: CPU linears with GGUF integer blocks round their inputs to 8 bits.
    ep_size: expert-parallel groups inside the TP group (MoE models; see layers.moe.fused_moe)."""
    with torch.device(device), expert_parallel(ep_size):
        model = get_model_class(config.arch)(config, dtype=dtype, tp_rank=tp_rank, tp_size=tp_size)
    if config.format == "gguf":
        weights = iter_gguf_weights(model_path, config)
    else:
        weights = iter_safetensors_weights(model_path)
    model.load_weights(weights)
    with block_quant_int8_activations(int8_activations):
        for module in model.modules():
            if hasattr(module, "process_weights_after_loading"):
                module.process_weights_after_loading()
    return model.eval()
