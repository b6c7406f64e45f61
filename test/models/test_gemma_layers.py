"""Fast checks (no server) of what the Gemma and sliding-window families read from a checkpoint's
config: transformers' layer-type rules, Gemma3's RoPE per layer type in both config layouts, the
(1 + w) RMSNorm, and the config features refused by name."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.configs.sliding_window import (
    FULL,
    SLIDING,
    layer_sliding_window,
    layer_types,
    llama_family_sliding_window,
)
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.models.gemma3 import rope_of_layer_type

S, F = SLIDING, FULL


@pytest.mark.parametrize(
    "hf,default_pattern,expected",
    [
        ({"sliding_window": 32}, None, [S, S, S, S]),  # Mistral: every layer
        ({"sliding_window": None}, None, [F, F, F, F]),
        ({}, 2, [F, F, F, F]),  # no window at all
        ({"sliding_window": 32, "use_sliding_window": False, "max_window_layers": 0}, None, [F, F, F, F]),
        ({"sliding_window": 32, "use_sliding_window": True, "max_window_layers": 2}, None, [F, F, S, S]),
        ({"sliding_window": 32}, 2, [S, F, S, F]),  # Gemma2's default
        ({"sliding_window": 32, "sliding_window_pattern": 3}, 6, [S, S, F, S]),
        ({"sliding_window": 32, "layer_types": [F, S, F, S]}, 2, [F, S, F, S]),
    ],
)
def test_layer_types_follow_transformers(hf, default_pattern, expected) -> None:
    assert layer_types(hf, 4, default_pattern) == expected


def test_transformers_configs_agree_with_layer_types() -> None:
    """The layer types transformers derives are the ones we derive from the config it writes, or
    from its inputs alone (checkpoints written before layer_types existed)."""
    cases = [
        (transformers.Qwen2Config(num_hidden_layers=5, use_sliding_window=True, sliding_window=32, max_window_layers=3),
         dict(use_sliding_window=True, sliding_window=32, max_window_layers=3), None),
        (transformers.Gemma2Config(num_hidden_layers=5, sliding_window=32), dict(sliding_window=32), 2),
        (transformers.Gemma3TextConfig(num_hidden_layers=7, sliding_window=32), dict(sliding_window=32), 6),
    ]
    for cfg, inputs, pattern in cases:
        assert layer_types(cfg.to_dict(), cfg.num_hidden_layers, pattern) == cfg.layer_types
        assert layer_types(inputs, cfg.num_hidden_layers, pattern) == cfg.layer_types
    assert layer_sliding_window({"sliding_window": 32}, 1, 4, 2) is None
    assert layer_sliding_window({"sliding_window": 32}, 0, 4, 2) == 32


def test_llama_family_windows_only_where_transformers_reads_them() -> None:
    hf = {"sliding_window": 32}
    assert llama_family_sliding_window(hf | {"architectures": ["MistralForCausalLM"]}, 0, 2) == 32
    assert llama_family_sliding_window(hf | {"architectures": ["LlamaForCausalLM"]}, 0, 2) is None
    qwen = hf | {"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "max_window_layers": 1}
    assert [llama_family_sliding_window(qwen, i, 2) for i in range(2)] == [None, 32]


def test_unknown_layer_types_are_refused() -> None:
    with pytest.raises(ValueError, match="layer_types"):
        layer_types({"sliding_window": 32, "layer_types": [S, "chunked_attention"]}, 2)


def test_gemma3_rope_per_layer_type_in_both_layouts() -> None:
    new = transformers.Gemma3TextConfig(
        rope_parameters={S: {"rope_type": "default", "rope_theta": 10_000.0},
                         F: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0}}).to_dict()
    old = {"rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    for hf in (new, old):
        assert rope_of_layer_type(hf, S) == (10_000.0, None)
        assert rope_of_layer_type(hf, F) == (1_000_000.0, {"rope_type": "linear", "factor": 8.0})
    assert rope_of_layer_type({}, F) == (1_000_000.0, None)
    with pytest.raises(ValueError, match="yarn"):
        rope_of_layer_type({"rope_scaling": {"rope_type": "yarn", "factor": 8.0}}, F)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unit_offset_rmsnorm_matches_gemma(dtype) -> None:
    ref = transformers.models.gemma2.modeling_gemma2.Gemma2RMSNorm(64, eps=1e-6)
    norm = RMSNorm(64, 1e-6, params_dtype=dtype, unit_offset=True)
    with torch.no_grad():
        ref.weight.normal_(0.0, 0.5)
        norm.weight.copy_(ref.weight)
    ref = ref.to(dtype)
    x, residual = torch.randn(5, 64).to(dtype), torch.randn(5, 64).to(dtype)
    torch.testing.assert_close(norm(x), ref(x), atol=1e-5 if dtype == torch.float32 else 1e-2, rtol=0)
    out, total = norm(x, residual.clone())
    assert torch.equal(total, x + residual)
    torch.testing.assert_close(out, ref(x + residual), atol=1e-5 if dtype == torch.float32 else 1e-2, rtol=0)


def _config(tmp_path, **fields) -> ModelConfig:
    base = dict(architectures=["Gemma2ForCausalLM"], vocab_size=300, hidden_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
                max_position_embeddings=512, hidden_activation="gelu_pytorch_tanh")
    (tmp_path / "config.json").write_text(json.dumps(base | fields))
    return ModelConfig.from_path(str(tmp_path))


def test_gemma_configs_accepted_and_refused_by_name(tmp_path) -> None:
    c = _config(tmp_path, hidden_act="gelu_pytorch_tanh")  # older configs carry both keys
    assert c.arch == "gemma2" and c.tie_word_embeddings  # Gemma ties unless the config says otherwise
    assert _config(tmp_path, architectures=["Gemma3ForCausalLM"]).arch == "gemma3"
    assert _config(tmp_path, architectures=["MistralForCausalLM"], hidden_activation=None).arch == "mistral"
    with pytest.raises(ValueError, match="hidden_activation 'gelu'"):
        _config(tmp_path, hidden_activation="gelu")
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        _config(tmp_path, use_bidirectional_attention=True)
    with pytest.raises(ValueError, match="hidden_act 'gelu_pytorch_tanh'"):
        _config(tmp_path, architectures=["LlamaForCausalLM"], hidden_act="gelu_pytorch_tanh")
