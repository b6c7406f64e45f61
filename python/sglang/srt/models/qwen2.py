"""Qwen2: the Llama decoder with q/k/v biases (ModelConfig sets attention_bias for qwen2)."""

from __future__ import annotations

from sglang.srt.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Identical code path; the biases come from ModelConfig.attention_bias."""
