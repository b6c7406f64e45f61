"""RoPE scaling types against transformers' ROPE_INIT_FUNCTIONS and its rotary modules: the
inverse frequencies (longrope short/long, dynamic NTK at and past the original length, partial
rotary), the longrope attention factor, and the cos/sin rows a step reads per sequence length."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from sglang.srt.configs.model_config import _hf_rope_scaling
from sglang.srt.layers.rotary import RotaryEmbedding, apply_rotary_emb, rope_inv_freq, rotary_dim_of

HEAD_DIM = 32


def _phi3(partial: float = 1.0) -> transformers.Phi3Config:
    rotary = int(HEAD_DIM * partial)
    g = torch.Generator().manual_seed(0)
    short, long = (1 + torch.rand(rotary // 2, generator=g) * k for k in (0.5, 8.0))
    rope = {"rope_type": "longrope", "short_factor": short.tolist(), "long_factor": long.tolist(),
            "rope_theta": 10000.0, "partial_rotary_factor": partial}
    return transformers.Phi3Config(hidden_size=4 * HEAD_DIM, num_attention_heads=4, max_position_embeddings=256,
                                   original_max_position_embeddings=32, rope_parameters=rope)


def _llama_dynamic() -> transformers.LlamaConfig:
    return transformers.LlamaConfig(hidden_size=4 * HEAD_DIM, num_attention_heads=4, max_position_embeddings=32,
                                    rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})


def _ours(config: transformers.PretrainedConfig) -> tuple[dict, int]:
    """(our scaling dict, rotary dim) from the config as saved to config.json."""
    cfg = config.to_dict()
    return _hf_rope_scaling(cfg), rotary_dim_of(HEAD_DIM, cfg)


@pytest.mark.parametrize("partial", [1.0, 0.5])
@pytest.mark.parametrize("seq_len", [None, 20, 32, 33, 200])
def test_longrope_inv_freq_matches_transformers(partial: float, seq_len) -> None:
    config = _phi3(partial)
    scaling, rotary_dim = _ours(config)
    want, want_factor = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu", seq_len=seq_len)
    got = rope_inv_freq(rotary_dim, 10000.0, scaling, seq_len)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    rows = RotaryEmbedding(rotary_dim, 256, 10000.0, scaling).cos_sin_cache
    assert rows.shape == (512, rotary_dim)
    # Both tables carry transformers' attention factor (sqrt(1 + ln 8 / ln 32) here).
    torch.testing.assert_close(rows[0, : rotary_dim // 2], torch.full((rotary_dim // 2,), want_factor))


def test_su_is_longrope() -> None:
    """An older Phi-3 config.json: rope_scaling of type "su", the original length at the top level."""
    cfg = {"max_position_embeddings": 256, "original_max_position_embeddings": 32,
           "rope_scaling": {"type": "su", "short_factor": [1.0] * 16, "long_factor": [2.0] * 16}}
    scaling = _hf_rope_scaling(cfg)
    assert scaling["rope_type"] == "longrope" and scaling["original_max_position_embeddings"] == 32
    assert scaling["max_position_embeddings"] == 256


@pytest.mark.parametrize("seq_len", [None, 16, 32, 33, 75])
def test_dynamic_inv_freq_matches_transformers(seq_len) -> None:
    config = _llama_dynamic()
    scaling, rotary_dim = _ours(config)
    want, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", seq_len=seq_len)
    torch.testing.assert_close(rope_inv_freq(rotary_dim, 10000.0, scaling, seq_len), want, atol=0, rtol=1e-6)


def _hf_cos_sin(module: torch.nn.Module, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' rotary module over one sequence of `length` tokens -> cos, sin [length, R]."""
    x = torch.zeros(1, length, 4)
    cos, sin = module(x, torch.arange(length).unsqueeze(0))
    return cos[0], sin[0]


@pytest.mark.parametrize(
    "make, hf_cls",
    [(_llama_dynamic, "LlamaRotaryEmbedding"), (_phi3, "Phi3RotaryEmbedding")],
)
def test_rows_match_transformers_per_sequence_length(make, hf_cls) -> None:
    """A batch mixing a short and a long sequence: each token's rows equal transformers' module
    run on its sequence alone."""
    config = make()
    scaling, rotary_dim = _ours(config)
    ours = RotaryEmbedding(rotary_dim, 256, 10000.0, scaling)
    hf_module = getattr(transformers.models.llama.modeling_llama if "Llama" in hf_cls
                        else transformers.models.phi3.modeling_phi3, hf_cls)
    lengths = [10, 75]
    positions = torch.cat([torch.arange(n) for n in lengths])
    seq_lens = torch.cat([torch.full((n,), n) for n in lengths])
    cos, signed_sin = ours(positions, torch.float32, seq_lens)  # [N, 1, R]
    start = 0
    for n in lengths:
        want_cos, want_sin = _hf_cos_sin(hf_module(config), n)
        torch.testing.assert_close(cos[start : start + n, 0], want_cos, atol=1e-6, rtol=1e-5)
        half = rotary_dim // 2
        torch.testing.assert_close(signed_sin[start : start + n, 0, half:], want_sin[:, half:], atol=1e-6, rtol=1e-5)
        start += n


def test_partial_rotary_leaves_the_rest_of_each_head() -> None:
    x = torch.randn(5, 3, HEAD_DIM)
    cos, signed_sin = RotaryEmbedding(HEAD_DIM // 2, 64, 10000.0)(torch.arange(5), torch.float32)
    out = apply_rotary_emb(x.clone(), cos, signed_sin)
    torch.testing.assert_close(out[..., HEAD_DIM // 2 :], x[..., HEAD_DIM // 2 :], atol=0, rtol=0)
    full = apply_rotary_emb(x[..., : HEAD_DIM // 2].contiguous(), cos, signed_sin)
    torch.testing.assert_close(out[..., : HEAD_DIM // 2], full, atol=0, rtol=0)


def test_an_odd_rotary_width_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"rotary width \(head_dim x partial_rotary_factor\) is 3"):
        RotaryEmbedding(3, 64, 10000.0)
