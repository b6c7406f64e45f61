"""Mistral: the Llama decoder (its head_dim may differ from hidden_size / num_heads; ModelConfig
reads it). Its sliding_window is refused by ModelConfig until attention serves windows."""

from __future__ import annotations

from sglang.srt.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    """Identical code path and checkpoint names."""
