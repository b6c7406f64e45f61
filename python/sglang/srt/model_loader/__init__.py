"""Build a model for a ModelConfig and fill its weights from GGUF or safetensors."""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.linear import block_quant_int8_activations
from sglang.srt.layers.quantization import resolve_quant_config
from sglang.srt.layers.quantization.fp8_linear import attach_fp8
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
    quantization: Optional[str] = None,
) -> nn.Module:
    """The model on `device` in `dtype`, holding this TP rank's shard of every weight.
    int8_activations: CPU linears with GGUF integer blocks round their inputs to 8 bits.
    quantization: --quantization; a checkpoint's quantization_config applies without it."""
    quant_config = resolve_quant_config(config.hf_config, quantization, config.format)
    with torch.device(device):
        model = get_model_class(config.arch)(config, dtype=dtype, tp_rank=tp_rank, tp_size=tp_size)
    if quant_config is not None:
        attach_fp8(model, quant_config)
    if config.format == "gguf":
        weights = iter_gguf_weights(model_path, config)
    else:
        weights = iter_safetensors_weights(model_path)
    model.load_weights(weights)
    with block_quant_int8_activations(int8_activations):
        for module in model.modules():
            if hasattr(module, "process_weights_after_loading"):
                module.process_weights_after_loading()
    if quant_config is not None and torch.device(device).type == "cuda":
        # The weights quantised at load leave their bf16 blocks cached; the KV pool is sized
        # from the memory free after loading.
        torch.cuda.empty_cache()
    return model.eval()
