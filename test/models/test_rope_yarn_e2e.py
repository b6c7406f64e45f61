"""Qwen3 and Llama checkpoints with YaRN RoPE scaling (its frequency ramp and attention factor),
written by transformers, served in float32 and compared with transformers, batched and chunked
(Llama's attention takes the CPU engine's fused RoPE + KV-store call, Qwen3's the op-by-op path)."""

from __future__ import annotations

import pytest

from family_utils import assert_matches_hf, prompts, save_tiny, serving

pytestmark = pytest.mark.e2e

SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, max_position_embeddings=512)
# A short pre-training length, so that the prompts reach the interpolated frequencies.
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32}


@pytest.fixture(scope="module", params=["Qwen3", "Llama"])
def yarn_server(request, tmp_path_factory, gguf_path: str):
    family = request.param
    folder = str(tmp_path_factory.mktemp(f"{family}_yarn"))
    model = save_tiny(folder, f"{family}Config", f"{family}ForCausalLM", tie_word_embeddings=True,
                      rope_parameters=YARN, **SHAPE)
    with serving(folder, gguf_path, "--chunked-prefill-size", "16") as server:
        yield server, model


def test_yarn_matches_transformers_batched_and_chunked(yarn_server) -> None:
    server, model = yarn_server
    assert_matches_hf(server, model, prompts())
