"""Architecture name (ModelConfig.arch) -> model class."""

from __future__ import annotations

from torch import nn

from sglang.srt.models.deepseek_v3 import DeepseekV3ForCausalLM
from sglang.srt.models.gemma2 import Gemma2ForCausalLM
from sglang.srt.models.gemma3 import Gemma3ForCausalLM
from sglang.srt.models.glm4 import Glm4ForCausalLM
from sglang.srt.models.llama import LlamaForCausalLM
from sglang.srt.models.mistral import MistralForCausalLM
from sglang.srt.models.mixtral import MixtralForCausalLM
from sglang.srt.models.olmo2 import Olmo2ForCausalLM
from sglang.srt.models.phi3 import Phi3ForCausalLM
from sglang.srt.models.qwen2 import Qwen2ForCausalLM
from sglang.srt.models.qwen3 import Qwen3ForCausalLM
from sglang.srt.models.qwen3_moe import Qwen3MoeForCausalLM
from sglang.srt.models.qwen3_next import Qwen3NextForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "llama": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
    "qwen3": Qwen3ForCausalLM,
    "qwen3_moe": Qwen3MoeForCausalLM,
    "mixtral": MixtralForCausalLM,
    "deepseek_v3": DeepseekV3ForCausalLM,
    "mistral": MistralForCausalLM,
    "phi3": Phi3ForCausalLM,
    "olmo2": Olmo2ForCausalLM,
    "glm4": Glm4ForCausalLM,
    "qwen3_next": Qwen3NextForCausalLM,
    "gemma2": Gemma2ForCausalLM,
    "gemma3": Gemma3ForCausalLM,
}


def get_model_class(arch: str) -> type[nn.Module]:
    if arch not in MODEL_REGISTRY:
        raise ValueError(f"No model implementation for architecture {arch!r}; known: {sorted(MODEL_REGISTRY)}.")
    return MODEL_REGISTRY[arch]
