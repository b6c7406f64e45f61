"""The MoE families, each a tiny random checkpoint written by transformers, served in float32 and
compared with transformers: batched, chunked, the radix cache, the deterministic mode; TP=2 and
TP=2 with EP=2 on the CPU give TP=1's tokens.
- Mixtral: block_sparse_moe, 4 experts of w1/w3/w2, softmax top-2.
- Qwen3-MoE: 8 experts, top-2, renormalised, a dense layer from mlp_only_layers."""

from __future__ import annotations

import pytest

from family_utils import assert_matches_hf, prompts, save_tiny, serving
from moe_family_utils import assert_same_outputs, served_outputs

pytestmark = pytest.mark.e2e

ATTENTION = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
FAMILIES = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(
        ATTENTION, intermediate_size=48, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        ATTENTION, intermediate_size=96, num_hidden_layers=3, head_dim=32, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1])),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def checkpoint(request, tmp_path_factory):
    config_cls, model_cls, shape = FAMILIES[request.param]
    folder = str(tmp_path_factory.mktemp(request.param))
    return folder, save_tiny(folder, config_cls, model_cls, **shape)


@pytest.fixture(scope="module")
def tp1_outputs(checkpoint, gguf_path: str):
    folder, model = checkpoint
    with serving(folder, gguf_path, "--chunked-prefill-size", "16") as server:
        assert_matches_hf(server, model, prompts())
        assert_matches_hf(server, model, prompts())  # every prompt's prefix now in the radix cache
        yield served_outputs(server, prompts())


def test_matches_transformers_batched_chunked_and_cached(tp1_outputs) -> None:
    assert len(tp1_outputs) == len(prompts())


def test_deterministic_mode_matches_transformers(checkpoint, gguf_path: str) -> None:
    folder, model = checkpoint
    with serving(folder, gguf_path, "--enable-deterministic-inference") as server:
        assert_matches_hf(server, model, prompts())


@pytest.mark.parametrize("flags", [("--tp-size", "2"), ("--tp-size", "2", "--ep-size", "2")], ids=["tp2", "tp2_ep2"])
def test_tensor_and_expert_parallel_equal_tp1(checkpoint, gguf_path: str, tp1_outputs, flags) -> None:
    folder, _ = checkpoint
    with serving(folder, gguf_path, "--chunked-prefill-size", "16", *flags) as server:
        assert_same_outputs(served_outputs(server, prompts()), tp1_outputs)
