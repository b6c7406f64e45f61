"""A Llama with dynamic NTK RoPE (max_position_embeddings 32, factor 4), a tiny random checkpoint
written by transformers, served in float32 and compared with transformers: prompts within and
past 32 positions in one batch, from the radix cache, and in the deterministic mode."""

from __future__ import annotations

import concurrent.futures

import pytest
import torch

from family_utils import PROMPT_LENS, assert_matches_hf, prompts, save_tiny, served, serving

pytestmark = pytest.mark.e2e

SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=32,
             rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0})


@pytest.fixture(scope="module")
def dynamic_llama(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("llama_dynamic"))
    return folder, save_tiny(folder, "LlamaConfig", "LlamaForCausalLM", **SHAPE)


def test_dynamic_rope_first_token_matches_transformers(dynamic_llama, gguf_path: str) -> None:
    """One new token: transformers' forward over each whole prompt (the base stretched for the
    prompt's length past 32) against our prefill, all prompts batched."""
    folder, model = dynamic_llama
    with serving(folder, gguf_path) as server:
        assert_matches_hf(server, model, prompts(), new_tokens=1)
        assert_matches_hf(server, model, prompts(), new_tokens=1)  # from the radix cache
        _assert_generates_as_cached_transformers(server, model, prompts())


@torch.no_grad()
def _assert_generates_as_cached_transformers(server, model, prompt_list: list[list[int]]) -> None:
    """Greedy tokens past 32 positions equal transformers' generate with its KV cache, where each
    new token's RoPE is stretched for the length so far and earlier keys keep theirs, as ours.
    Transformers keeps the stretched frequencies between calls until a sequence shorter than 32
    resets them; prompts in increasing length make every call stretch them afresh."""
    assert prompt_list == sorted(prompt_list, key=len)
    with concurrent.futures.ThreadPoolExecutor(len(prompt_list)) as pool:
        results = list(pool.map(lambda p: served(server, p, 8), prompt_list))
    for prompt, result in zip(prompt_list, results):
        out = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, use_cache=True)
        assert result["output_ids"] == out[0, len(prompt):].tolist(), f"prompt of {len(prompt)} tokens"


def test_dynamic_rope_within_original_length_generates_as_transformers(dynamic_llama, gguf_path: str) -> None:
    """Prompts whose generation stays within 32 positions, chunked by 16, deterministic mode."""
    folder, model = dynamic_llama
    flags = ("--enable-deterministic-inference", "--chunked-prefill-size", "16")
    assert PROMPT_LENS[1] + 8 <= SHAPE["max_position_embeddings"]
    with serving(folder, gguf_path, *flags) as server:
        assert_matches_hf(server, model, prompts(2), new_tokens=8)
