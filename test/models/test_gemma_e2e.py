"""Gemma2 and Gemma3 (text), each a tiny random checkpoint written by transformers, served in
float32 and compared with transformers: sliding-window layers (window 32) with prompts past the
window, a 16-token prefill chunk, attention and final-logit soft-capping, the radix cache, and
the deterministic mode."""

from __future__ import annotations

import pytest
import torch

from family_utils import assert_matches_hf, hf_reference, prompts, save_tiny, served, serving

pytestmark = pytest.mark.e2e

SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=512, sliding_window=32,
             query_pre_attn_scalar=24)
# Caps small enough that the tiny model's scores and logits reach them.
GEMMA2 = dict(attn_logit_softcapping=5.0, final_logit_softcapping=3.0, **SHAPE)
GEMMA3 = dict(
    final_logit_softcapping=3.0,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                     "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000_000.0}},
    **SHAPE,
)
MODES = {"default": (), "deterministic": ("--enable-deterministic-inference",)}


@pytest.fixture(scope="module", params=sorted(MODES))
def gemma2(request, tmp_path_factory, gguf_path: str):
    folder = str(tmp_path_factory.mktemp("gemma2"))
    model = save_tiny(folder, "Gemma2Config", "Gemma2ForCausalLM", **GEMMA2)
    with serving(folder, gguf_path, "--chunked-prefill-size", "16", *MODES[request.param]) as server:
        yield server, model


@pytest.fixture(scope="module", params=sorted(MODES))
def gemma3(request, tmp_path_factory, gguf_path: str):
    folder = str(tmp_path_factory.mktemp("gemma3"))
    model = save_tiny(folder, "Gemma3TextConfig", "Gemma3ForCausalLM", **GEMMA3)
    with serving(folder, gguf_path, "--chunked-prefill-size", "16", *MODES[request.param]) as server:
        yield server, model


def test_gemma2_matches_transformers_batched_chunked_and_cached(gemma2) -> None:
    server, model = gemma2
    assert_matches_hf(server, model, prompts())
    # The second pass finds every prompt's prefix in the radix cache.
    assert_matches_hf(server, model, prompts())


def test_gemma3_matches_transformers_batched_chunked_and_cached(gemma3) -> None:
    server, model = gemma3
    assert_matches_hf(server, model, prompts())
    assert_matches_hf(server, model, prompts())


def test_gemma2_logprobs_are_the_capped_distribution(gemma2) -> None:
    """The served first-token logprobs are transformers' capped ones (checked above to 1e-4) and
    far from the uncapped ones: the cap is visible to the sampler, not applied after it."""
    server, model = gemma2
    prompt = prompts(3)[2]
    top = served(server, prompt, 1)["meta_info"]["output_top_logprobs"][0]
    values = torch.tensor([entry[0] for entry in top], dtype=torch.float64)
    model.config.final_logit_softcapping = None
    try:
        _, uncapped = hf_reference(model, prompt, 1)
    finally:
        model.config.final_logit_softcapping = GEMMA2["final_logit_softcapping"]
    uncapped_values = uncapped.double()[[entry[1] for entry in top]]
    assert (values - uncapped_values).abs().max() > 1e-2
