"""Build a model for a ModelConfig and fill its weights from GGUF, safetensors, or (load format
`dummy`) small random values."""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.linear import block_quant_int8_activations
from sglang.srt.layers.moe.fused_moe import expert_parallel
from sglang.srt.layers.quantization import resolve_quant_config
from sglang.srt.layers.quantization.fp8_linear import attach_fp8
from sglang.srt.model_loader.gguf_loader import iter_gguf_weights
from sglang.srt.model_loader.safetensors_loader import iter_safetensors_weights
from sglang.srt.models.registry import get_model_class

# Dummy weights are uniform in [-DUMMY_RANGE, DUMMY_RANGE] (small, so activations stay finite).
DUMMY_RANGE = 1e-3
DUMMY_SEED = 0


def load_model(
    config: ModelConfig,
    model_path: str,
    dtype: torch.dtype,
    device: Union[str, torch.device],
    tp_rank: int = 0,
    tp_size: int = 1,
    int8_activations: bool = False,
    load_format: str = "auto",
    ep_size: int = 1,
    quantization: Optional[str] = None,
) -> nn.Module:
    """The model on `device` in `dtype`, holding this TP rank's shard of every weight.
    int8_activations: CPU linears with GGUF integer blocks round their inputs to 8 bits.
    load_format: auto / safetensors / gguf (must match the path) or dummy (random weights).
    ep_size: expert-parallel groups inside the TP group (MoE models; see layers.moe.fused_moe).
    quantization: --quantization; a checkpoint's quantization_config applies without it."""
    _check_load_format(load_format, config)
    quant_config = resolve_quant_config(config.hf_config, quantization, config.format)
    with torch.device(device), expert_parallel(ep_size):
        model = get_model_class(config.arch)(config, dtype=dtype, tp_rank=tp_rank, tp_size=tp_size)
    if quant_config is not None:
        attach_fp8(model, quant_config)
    if load_format == "dummy":
        init_dummy_weights(model, seed=DUMMY_SEED + tp_rank)
    elif config.format == "gguf":
        model.load_weights(iter_gguf_weights(model_path, config))
    else:
        model.load_weights(iter_safetensors_weights(model_path))
    with block_quant_int8_activations(int8_activations):
        for module in model.modules():
            if hasattr(module, "process_weights_after_loading"):
                module.process_weights_after_loading()
    if torch.device(device).type == "cuda":
        # The weights quantised at load leave their bf16 blocks cached, and the draft heads a
        # checkpoint does not hold are dropped after building; the KV pool is sized from the
        # memory free after loading.
        torch.cuda.empty_cache()
    return model.eval()


def _check_load_format(load_format: str, config: ModelConfig) -> None:
    if load_format == "dummy" and config.format == "gguf":
        raise ValueError("--load-format dummy needs a folder with config.json, not a GGUF file.")
    if load_format in ("safetensors", "gguf") and load_format != config.format:
        raise ValueError(f"--load-format {load_format} does not match the model path, which is {config.format}.")


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int) -> None:
    """Every parameter uniform in [-DUMMY_RANGE, DUMMY_RANGE], drawn in float32 and cast to the
    parameter's dtype (float8 parameters included); one seed per parameter, in order."""
    for param in model.parameters():
        generator = torch.Generator(param.device).manual_seed(seed)
        values = torch.empty(param.shape, dtype=torch.float32, device=param.device)
        param.copy_(values.uniform_(-DUMMY_RANGE, DUMMY_RANGE, generator=generator).to(param.dtype))
        seed += 1
