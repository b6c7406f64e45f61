"""YaRN RoPE against transformers' ROPE_INIT_FUNCTIONS["yarn"]: the frequencies bit for bit and
the attention factor, through ModelConfig's reading of config.json."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.rotary import RotaryEmbedding, rope_attention_factor, rope_inv_freq

CASES = {
    "qwen3": ("Qwen3Config", dict(head_dim=32, max_position_embeddings=4096),
              {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}),
    "betas": ("Qwen3Config", dict(head_dim=64, max_position_embeddings=8192),
              {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512, "beta_fast": 16,
               "beta_slow": 2, "truncate": False}),
    "attention_factor": ("Qwen3Config", dict(head_dim=16, max_position_embeddings=2048),
                         {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 1024,
                          "attention_factor": 0.7}),
    "no_factor": ("Qwen3Config", dict(head_dim=32, max_position_embeddings=4096),
                  {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 1024}),
    "deepseek": ("DeepseekV3Config", dict(qk_rope_head_dim=16, max_position_embeddings=8192),
                 {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 256, "beta_fast": 32,
                  "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),
    "deepseek_mscale": ("DeepseekV3Config", dict(qk_rope_head_dim=16, max_position_embeddings=8192),
                        {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 256,
                         "mscale": 0.707, "mscale_all_dim": 1.0}),
}


def _hf_config(name: str, tmp_path) -> tuple[transformers.PretrainedConfig, ModelConfig]:
    config_cls, shape, rope = CASES[name]
    cfg = getattr(transformers, config_cls)(
        architectures=[config_cls.replace("Config", "ForCausalLM")], hidden_size=64, num_attention_heads=4, num_key_value_heads=4, rope_parameters={"rope_theta": 10000.0, **rope},
        **shape,
    )
    cfg.save_pretrained(tmp_path)
    ours = ModelConfig.from_path(str(tmp_path))
    return cfg, ours


@pytest.mark.parametrize("name", sorted(CASES))
def test_yarn_matches_transformers(name: str, tmp_path) -> None:
    cfg, ours = _hf_config(name, tmp_path)
    hf_inv_freq, hf_factor = ROPE_INIT_FUNCTIONS["yarn"](cfg)
    assert ours.rope_scaling["rope_type"] == "yarn"
    head_dim = cfg.head_dim
    assert torch.equal(rope_inv_freq(head_dim, ours.rope_theta, ours.rope_scaling), hf_inv_freq)
    assert rope_attention_factor(ours.rope_scaling) == pytest.approx(hf_factor, rel=1e-12)
    # The cos/sin table carries the factor as transformers' rotary embedding applies it.
    rotary = RotaryEmbedding(head_dim, 64, ours.rope_theta, ours.rope_scaling)
    positions = torch.arange(64)
    freqs = positions[:, None].float() * hf_inv_freq
    cos, signed_sin = rotary(positions, torch.float32)
    torch.testing.assert_close(cos[:, 0], torch.cat([freqs, freqs], -1).cos() * hf_factor, atol=0, rtol=0)
    torch.testing.assert_close(signed_sin[:, 0, head_dim // 2:], freqs.sin() * hf_factor, atol=0, rtol=0)
