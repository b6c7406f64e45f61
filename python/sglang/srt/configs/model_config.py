"""ModelConfig: the architecture numbers of a checkpoint, read from an HF folder or a GGUF file."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from sglang.srt.configs.gguf_header import read_gguf_header

# HF `architectures` entry -> our architecture name (also the GGUF `general.architecture` value).
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "MistralForCausalLM": "mistral",
    "Phi3ForCausalLM": "phi3",
    "Olmo2ForCausalLM": "olmo2",
    "Glm4ForCausalLM": "glm4",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
}
MODEL_ARCHS = frozenset(ARCHITECTURES.values())
# Families whose MLP is GeGLU with tanh GELU (config key hidden_activation, not hidden_act), and
# whose configs tie the embeddings unless they say otherwise.
GEGLU_TANH_ARCHS = ("gemma2", "gemma3")
# Architectures read from GGUF files (gguf_loader maps their tensor names and undoes llama.cpp's
# q/k row permutation); the others load from safetensors only.
GGUF_ARCHS = frozenset({"llama", "qwen2", "qwen3"})
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "dynamic")
# Legacy rope_type names -> the name transformers now uses.
ROPE_TYPE_ALIASES = {"su": "longrope"}
# generation_config.json keys that become the model's default sampling parameters.
GENERATION_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass
class ModelConfig:
    model_path: str
    format: str  # "gguf" | "safetensors"
    arch: str  # a value of ARCHITECTURES
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float
    context_len: int
    tie_word_embeddings: bool
    attention_bias: bool
    eos_token_ids: list[int]
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    # {"rope_type": one of SUPPORTED_ROPE_TYPES, ...HF scaling keys}; None for plain RoPE. Longrope
    # and dynamic also carry the resolved max_position_embeddings and original_max_position_embeddings.
    rope_scaling: Optional[dict[str, Any]] = None
    # Checkpoint dtype name ("bfloat16", ...); None when the file does not say (GGUF is quantised).
    dtype: Optional[str] = None
    bos_token_id: Optional[int] = None
    # The checkpoint's config.json as read ({} for GGUF): family-specific keys (soft-capping,
    # sliding windows, expert counts, ...) are read by the model class that uses them.
    hf_config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_path(cls, model_path: str, context_length: Optional[int] = None) -> "ModelConfig":
        if os.path.isfile(model_path) and model_path.endswith(".gguf"):
            config = _from_gguf(model_path)
        elif os.path.isfile(os.path.join(model_path, "config.json")):
            config = _from_hf_folder(model_path)
        else:
            raise ValueError(f"{model_path!r} is neither a .gguf file nor a folder with config.json.")
        if context_length is not None:
            if context_length > config.context_len:
                raise ValueError(
                    f"--context-length {context_length} exceeds the model's {config.context_len} positions."
                )
            config.context_len = context_length
        return config

    def kv_cache_bytes_per_token(self, itemsize: int, tp_size: int = 1) -> int:
        """K and V of one token over all layers, on one TP rank."""
        kv_heads = max(1, self.num_key_value_heads // tp_size)
        return 2 * self.num_hidden_layers * kv_heads * self.head_dim * itemsize


def _from_hf_folder(folder: str) -> ModelConfig:
    cfg = _read_json(os.path.join(folder, "config.json"))
    gen = _read_json(os.path.join(folder, "generation_config.json"))
    arch = _hf_arch(cfg)
    _reject_unsupported_hf(cfg, arch)
    heads = cfg["num_attention_heads"]
    rope = cfg.get("rope_parameters") or {}  # transformers >= 5 nests theta and scaling here
    eos = _as_id_list(cfg.get("eos_token_id")) + _as_id_list(gen.get("eos_token_id"))
    rope_scaling = _hf_rope_scaling(cfg)
    context_len = cfg.get("max_position_embeddings", 2048)
    if rope_scaling is not None and rope_scaling["rope_type"] == "dynamic":
        # Dynamic NTK stretches RoPE past max_position_embeddings by up to `factor`.
        context_len = int(context_len * rope_scaling["factor"])
    return ModelConfig(
        model_path=folder,
        format="safetensors",
        arch=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        intermediate_size=cfg["intermediate_size"],
        rope_theta=float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        context_len=context_len,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", arch in GEGLU_TANH_ARCHS)),
        # Qwen2 always has q/k/v biases; its config has no attention_bias key.
        # GLM-4's default is true (transformers' Glm4Config).
        attention_bias=True if arch == "qwen2" else bool(cfg.get("attention_bias", arch == "glm4")),
        eos_token_ids=sorted(set(eos)),
        generation_defaults={k: gen[k] for k in GENERATION_DEFAULT_KEYS if gen.get(k) is not None},
        rope_scaling=rope_scaling,
        dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
        bos_token_id=cfg.get("bos_token_id"),
        hf_config=cfg,
    )


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _hf_arch(cfg: dict[str, Any]) -> str:
    for name in cfg.get("architectures") or ():
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    raise ValueError(
        f"Unsupported architectures {cfg.get('architectures')}; supported: {sorted(ARCHITECTURES)}."
    )


def _reject_unsupported_hf(cfg: dict[str, Any], arch: str) -> None:
    """Features that would change the numbers if ignored fail loudly instead."""
    if arch in GEGLU_TANH_ARCHS:
        if cfg.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise ValueError(f"hidden_activation {cfg['hidden_activation']!r} is not supported (only gelu_pytorch_tanh).")
        if cfg.get("use_bidirectional_attention"):
            raise ValueError("use_bidirectional_attention=true is not supported.")
    elif cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {cfg['hidden_act']!r} is not supported (only silu).")
    if cfg.get("mlp_bias"):
        raise ValueError("mlp_bias=true is not supported.")
    if arch in ("qwen3_moe", "mixtral"):
        _reject_unsupported_moe(cfg, arch)


def _reject_unsupported_moe(cfg: dict[str, Any], arch: str) -> None:
    """HF's Mixtral and Qwen3-MoE attention apply `sliding_window` whenever it is set."""
    if cfg.get("sliding_window") is not None:
        raise ValueError(f"Sliding-window attention ({arch}, sliding_window={cfg['sliding_window']}) is not supported.")


def _hf_rope_scaling(cfg: dict[str, Any]) -> Optional[dict[str, Any]]:
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
    rope_type = ROPE_TYPE_ALIASES.get(rope_type, rope_type)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"RoPE scaling {rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}.")
    if rope_type == "default":
        return None
    out = {k: v for k, v in scaling.items() if k not in ("type", "rope_theta")} | {"rope_type": rope_type}
    if rope_type == "yarn":
        _fill_yarn_defaults(out, cfg)
    if rope_type in ("longrope", "dynamic"):
        # The checkpoint's lengths, not --context-length: the frequencies are defined by them.
        max_len = cfg.get("max_position_embeddings", 2048)
        # A top-level original_max_position_embeddings (Phi3) wins, as in transformers.
        original = cfg.get("original_max_position_embeddings") or scaling.get("original_max_position_embeddings")
        out |= {"max_position_embeddings": max_len, "original_max_position_embeddings": original or max_len}
    return out


def _fill_yarn_defaults(scaling: dict[str, Any], cfg: dict[str, Any]) -> None:
    """YaRN's pre-training length and factor as transformers fills them: the length from the config's
    top level, else max_position_embeddings; a missing factor is the ratio of the two."""
    max_len = cfg.get("max_position_embeddings", 2048)
    if cfg.get("original_max_position_embeddings") is not None:
        scaling["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
    scaling.setdefault("original_max_position_embeddings", max_len)
    if scaling.get("factor") is None:
        scaling["factor"] = max_len / scaling["original_max_position_embeddings"]


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _from_gguf(path: str) -> ModelConfig:
    meta, tensors = read_gguf_header(path)
    arch = meta["general.architecture"]
    if arch not in GGUF_ARCHS:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: {sorted(GGUF_ARCHS)}.")
    hidden = meta[f"{arch}.embedding_length"]
    heads = meta[f"{arch}.attention.head_count"]
    head_dim = meta.get(f"{arch}.attention.key_length", hidden // heads)
    if meta.get(f"{arch}.rope.dimension_count", head_dim) != head_dim:
        raise ValueError("Partial rotary embeddings (rope.dimension_count < head_dim) are not supported.")
    if meta.get(f"{arch}.rope.scaling.type", "none") != "none" or "rope_freqs.weight" in tensors:
        raise ValueError("RoPE scaling in GGUF files is not supported.")
    eos = [meta[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in meta]
    return ModelConfig(
        model_path=path,
        format="gguf",
        arch=arch,
        vocab_size=meta.get(f"{arch}.vocab_size") or tensors["token_embd.weight"][0],
        hidden_size=hidden,
        num_hidden_layers=meta[f"{arch}.block_count"],
        num_attention_heads=heads,
        num_key_value_heads=meta.get(f"{arch}.attention.head_count_kv", heads),
        head_dim=head_dim,
        intermediate_size=meta[f"{arch}.feed_forward_length"],
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(meta[f"{arch}.attention.layer_norm_rms_epsilon"]),
        context_len=meta[f"{arch}.context_length"],
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
        eos_token_ids=sorted(set(eos)),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
    )
