"""Gemma3 (text): Gemma2's decoder with a (1 + w) RMSNorm on every q and k head, five local
(sliding-window) layers to one global by default, and a RoPE table per layer type: local layers
rotate with rope_local_base_freq, global ones with rope_theta and its scaling."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.configs.sliding_window import FULL, SLIDING
from sglang.srt.layers.rotary import RotaryEmbedding
from sglang.srt.models.gemma2 import Gemma2ForCausalLM, Gemma2Model, Ropes

# The scalings Gemma3 checkpoints use (linear on the global layers); the length-dependent ones
# would need each step's sequence lengths, which these per-layer-type tables do not take.
GEMMA3_ROPE_TYPES = ("default", "linear")
# transformers' RoPE bases when the config names none.
DEFAULT_THETA = {FULL: 1_000_000.0, SLIDING: 10_000.0}


def rope_of_layer_type(hf_config: dict[str, Any], layer_type: str) -> tuple[float, Optional[dict[str, Any]]]:
    """(base, scaling or None) of a layer type's RoPE: from `rope_parameters[layer_type]` (the
    layout transformers 5 writes), else from rope_local_base_freq (local) or rope_theta and
    rope_scaling (global)."""
    params = hf_config.get("rope_parameters") or {}
    if layer_type in params:
        rope = dict(params[layer_type] or {})
    elif layer_type == SLIDING:
        rope = {"rope_theta": hf_config.get("rope_local_base_freq")}
    else:
        rope = {**(hf_config.get("rope_scaling") or {}), "rope_theta": hf_config.get("rope_theta")}
    theta = rope.get("rope_theta") or DEFAULT_THETA[layer_type]
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if rope_type not in GEMMA3_ROPE_TYPES:
        raise ValueError(f"Gemma3 RoPE scaling {rope_type!r} is not supported; supported: {GEMMA3_ROPE_TYPES}.")
    if rope_type == "default":
        return float(theta), None
    return float(theta), {k: v for k, v in rope.items() if k not in ("type", "rope_theta")} | {"rope_type": rope_type}


class Gemma3Model(Gemma2Model):
    qk_norm = True
    default_sliding_window_pattern = 6

    def attn_logit_cap(self, config: ModelConfig) -> Optional[float]:
        return None  # transformers' Gemma3 attention does not apply attn_logit_softcapping

    def build_rotary(self, config: ModelConfig) -> nn.ModuleDict:
        tables = {}
        for layer_type in (SLIDING, FULL):
            theta, scaling = rope_of_layer_type(config.hf_config, layer_type)
            tables[layer_type] = RotaryEmbedding(config.head_dim, config.context_len, theta, scaling)
        return nn.ModuleDict(tables)

    def step_ropes(self, positions: torch.Tensor, dtype: torch.dtype) -> Ropes:
        return {layer_type: table(positions, dtype) for layer_type, table in self.rotary_embs.items()}


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    model_cls = Gemma3Model
