"""Architecture name (ModelConfig.arch) -> model class."""

from __future__ import annotations

from torch import nn

from sglang.srt.models.gemma2 import Gemma2ForCausalLM
from sglang.srt.models.gemma3 import Gemma3ForCausalLM
from sglang.srt.models.llama import LlamaForCausalLM
from sglang.srt.models.qwen2 import Qwen2ForCausalLM
from sglang.srt.models.qwen3 import Qwen3ForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "llama": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
    "qwen3": Qwen3ForCausalLM,
    "gemma2": Gemma2ForCausalLM,
    "gemma3": Gemma3ForCausalLM,
}


def get_model_class(arch: str) -> type[nn.Module]:
    if arch not in MODEL_REGISTRY:
        raise ValueError(f"No model implementation for architecture {arch!r}; known: {sorted(MODEL_REGISTRY)}.")
    return MODEL_REGISTRY[arch]
