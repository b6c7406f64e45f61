"""Qwen3: the Llama decoder with a per-head RMSNorm on q and k before RoPE, no q/k/v bias, and a
head_dim that need not be hidden_size / num_heads (ModelConfig reads it from the config)."""

from __future__ import annotations

from sglang.srt.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
