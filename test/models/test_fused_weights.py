"""Checkpoint tensors stored fused (Phi-3's qkv_proj / gate_up_proj) are split into their parts
before TP sharding: each rank holds its slice of q, of k and of v (and of gate and of up)."""

from __future__ import annotations

import torch

from family_utils import save_tiny
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader.safetensors_loader import iter_safetensors_weights
from sglang.srt.models.phi3 import Phi3ForCausalLM


def test_phi3_fused_tensors_shard_per_part(tmp_path) -> None:
    model = save_tiny(str(tmp_path), "Phi3Config", "Phi3ForCausalLM", hidden_size=64, intermediate_size=96,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                      pad_token_id=0)
    config = ModelConfig.from_path(str(tmp_path))
    hf_qkv = model.model.layers[0].self_attn.qkv_proj.weight.detach()  # [(4 + 2 * 2) * 16, 64]
    hf_gate_up = model.model.layers[0].mlp.gate_up_proj.weight.detach()  # [2 * 96, 64]
    q, k, v = hf_qkv.split([64, 32, 32])
    gate, up = hf_gate_up.split([96, 96])
    for rank in range(2):
        ours = Phi3ForCausalLM(config, tp_rank=rank, tp_size=2)
        ours.load_weights(iter_safetensors_weights(str(tmp_path)))
        layer = ours.model.layers[0]
        want_qkv = torch.cat([q.chunk(2)[rank], k.chunk(2)[rank], v.chunk(2)[rank]])
        torch.testing.assert_close(layer.self_attn.qkv_proj.weight, want_qkv, atol=0, rtol=0)
        want_gate_up = torch.cat([gate.chunk(2)[rank], up.chunk(2)[rank]])
        torch.testing.assert_close(layer.mlp.gate_up_proj.weight, want_gate_up, atol=0, rtol=0)
