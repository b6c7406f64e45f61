"""Mixtral: a tiny random checkpoint written by transformers (block_sparse_moe, 4 experts of
w1/w3/w2, softmax top-2), served in float32 and compared with transformers: batched, chunked,
the radix cache, the deterministic mode; TP=2 and TP=2 with EP=2 on the CPU give TP=1's tokens."""

from __future__ import annotations

import pytest

from family_utils import assert_matches_hf, prompts, save_tiny, serving
from moe_family_utils import assert_same_outputs, served_outputs

pytestmark = pytest.mark.e2e

SHAPE = dict(hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, num_local_experts=4, num_experts_per_tok=2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("mixtral"))
    return folder, save_tiny(folder, "MixtralConfig", "MixtralForCausalLM", **SHAPE)


@pytest.fixture(scope="module")
def tp1_outputs(checkpoint, gguf_path: str):
    folder, model = checkpoint
    with serving(folder, gguf_path, "--chunked-prefill-size", "16") as server:
        assert_matches_hf(server, model, prompts())
        assert_matches_hf(server, model, prompts())  # every prompt's prefix now in the radix cache
        yield served_outputs(server, prompts())


def test_mixtral_matches_transformers_batched_chunked_and_cached(tp1_outputs) -> None:
    assert len(tp1_outputs) == len(prompts())


def test_mixtral_deterministic_mode_matches_transformers(checkpoint, gguf_path: str) -> None:
    folder, model = checkpoint
    with serving(folder, gguf_path, "--enable-deterministic-inference") as server:
        assert_matches_hf(server, model, prompts())


@pytest.mark.parametrize("flags", [("--tp-size", "2"), ("--tp-size", "2", "--ep-size", "2")], ids=["tp2", "tp2_ep2"])
def test_mixtral_tensor_and_expert_parallel_equal_tp1(checkpoint, gguf_path: str, tp1_outputs, flags) -> None:
    folder, _ = checkpoint
    with serving(folder, gguf_path, "--chunked-prefill-size", "16", *flags) as server:
        assert_same_outputs(served_outputs(server, prompts()), tp1_outputs)
