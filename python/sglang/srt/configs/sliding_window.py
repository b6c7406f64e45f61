"""Which layers of an HF checkpoint attend through a sliding window, by transformers' rules."""

from __future__ import annotations

from typing import Any, Optional

SLIDING, FULL = "sliding_attention", "full_attention"
# transformers' default for Qwen2 / Qwen3 configs that omit max_window_layers.
DEFAULT_MAX_WINDOW_LAYERS = 28
# The Llama-shaped architectures whose transformers model reads `sliding_window` (Llama's ignores it).
WINDOWED_LLAMA_ARCHITECTURES = frozenset(("MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"))


def layer_types(hf_config: dict[str, Any], num_layers: int, default_pattern: Optional[int] = None) -> list[str]:
    """Each layer's type, SLIDING or FULL. In order: the config's `layer_types`; Qwen2/Qwen3's
    `use_sliding_window` (layers from `max_window_layers` on slide); a repeating pattern
    (`sliding_window_pattern`, else the family's default_pattern: every pattern-th layer is full,
    the others slide); else every layer slides (Mistral). No `sliding_window`, or
    use_sliding_window false: every layer is full."""
    if hf_config.get("sliding_window") is None or hf_config.get("use_sliding_window", True) is False:
        return [FULL] * num_layers
    if hf_config.get("layer_types") is not None:
        types = list(hf_config["layer_types"])
        unknown = sorted(set(types) - {SLIDING, FULL})
        if unknown or len(types) != num_layers:
            raise ValueError(f"layer_types must list {SLIDING!r} or {FULL!r} for each of {num_layers} layers, got {types}.")
        return types
    if "use_sliding_window" in hf_config:
        first = hf_config.get("max_window_layers", DEFAULT_MAX_WINDOW_LAYERS)
        return [SLIDING if i >= first else FULL for i in range(num_layers)]
    pattern = hf_config.get("sliding_window_pattern", default_pattern)
    if pattern is not None:
        return [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
    return [SLIDING] * num_layers


def layer_sliding_window(
    hf_config: dict[str, Any], layer_id: int, num_layers: int, default_pattern: Optional[int] = None
) -> Optional[int]:
    """The window (positions a query sees, itself included) of layer `layer_id`; None for a full layer."""
    if layer_types(hf_config, num_layers, default_pattern)[layer_id] == FULL:
        return None
    return int(hf_config["sliding_window"])


def llama_family_sliding_window(hf_config: dict[str, Any], layer_id: int, num_layers: int) -> Optional[int]:
    """layer_sliding_window for the Llama-shaped architectures: Mistral's window on every layer,
    Qwen2/Qwen3's by use_sliding_window; None for the others, as transformers does."""
    if not WINDOWED_LLAMA_ARCHITECTURES.intersection(hf_config.get("architectures") or ()):
        return None
    return layer_sliding_window(hf_config, layer_id, num_layers)
