"""Mistral: the Llama decoder (its head_dim may differ from hidden_size / num_heads; ModelConfig
reads it) with `sliding_window` on every layer (LlamaForCausalLM.make_layer reads it)."""

from __future__ import annotations

from sglang.srt.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    """Identical code path and checkpoint names."""
