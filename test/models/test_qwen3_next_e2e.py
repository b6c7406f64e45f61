"""Qwen3-Next (hybrid: Gated DeltaNet + gated full attention, MoE with a shared expert): a tiny
random checkpoint written by transformers (3 linear-attention layers, 1 full-attention layer;
sparse and dense MLPs), served in float32 and compared with transformers. The per-request
recurrent state must survive chunked prefill (16-token chunks), batching, `n = 2`, an abort
mid-decode (the next requests reuse its slot), and give the same tokens with and without
--disable-radix-cache (prefix reuse is off for hybrid models) and the overlap schedule, and in
deterministic mode. The checkpoint carries a multi-token-prediction head (`mtp.*`), which loads into
the model's draft head and leaves the outputs unchanged."""

from __future__ import annotations

import concurrent.futures

import pytest
import requests
import torch
from draft_head_utils import add_to_checkpoint, qwen3_next_mtp_tensors
from engine_utils import generate_ok, iter_stream
from family_utils import assert_matches_hf, hf_reference, prompts, save_tiny, served, serving
from sglang.srt.model_executor.model_runner import ModelRunner

pytestmark = pytest.mark.e2e

SHAPE = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, max_position_embeddings=2048,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=48, mlp_only_layers=[1],
)
CHUNK = ("--chunked-prefill-size", "16")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("qwen3_next"))
    model = save_tiny(folder, "Qwen3NextConfig", "Qwen3NextForCausalLM", **SHAPE)
    add_to_checkpoint(folder, qwen3_next_mtp_tensors(folder, model.config))
    return folder, model


@pytest.fixture(scope="module")
def default_server(checkpoint, gguf_path: str):
    folder, model = checkpoint
    with serving(folder, gguf_path, *CHUNK) as server:
        yield server, model


@pytest.fixture(scope="module")
def one_slot_server(checkpoint, gguf_path: str):
    """No radix cache, no overlap schedule, one running request (two request slots): requests take
    turns on the rows."""
    folder, model = checkpoint
    flags = ("--disable-radix-cache", "--disable-overlap-schedule", "--max-running-requests", "1")
    with serving(folder, gguf_path, *CHUNK, *flags) as server:
        yield server, model


def test_matches_transformers_batched_and_chunked(default_server) -> None:
    server, model = default_server
    assert_matches_hf(server, model, prompts())


def test_mtp_head_loads(checkpoint) -> None:
    folder, model = checkpoint
    mtp = qwen3_next_mtp_tensors(folder, model.config)
    head = ModelRunner(folder, max_total_tokens=128, max_running_requests=2).model.mtp

    def dense(w: torch.Tensor) -> torch.Tensor:  # a CPU linear's weight is packed for oneDNN after loading
        return w.to_dense() if w.is_mkldnn else w

    assert torch.equal(dense(head.fc.weight), mtp["mtp.fc.weight"])
    assert torch.equal(head.norm.weight, mtp["mtp.norm.weight"])
    assert torch.equal(head.pre_fc_norm_hidden.weight, mtp["mtp.pre_fc_norm_hidden.weight"])
    k_rows = SHAPE["num_key_value_heads"] * SHAPE["head_dim"]
    qkv = dense(head.layers[0].self_attn.qkv_proj.weight)
    assert torch.equal(qkv[-2 * k_rows : -k_rows], mtp["mtp.layers.0.self_attn.k_proj.weight"])
    expert_down = mtp["mtp.layers.0.mlp.experts.3.down_proj.weight"]
    assert torch.equal(head.layers[0].mlp.experts.w2_weight[3], expert_down)


def test_repeated_prompts_match_transformers(default_server) -> None:
    server, model = default_server
    # Sent again: with prefix reuse off for hybrid models, nothing of the first pass is reused.
    assert_matches_hf(server, model, prompts())
    assert "Prefix reuse off" in server.output


def test_n2_children_each_match_transformers(default_server) -> None:
    server, model = default_server
    prompt = prompts()[2]
    expected, _ = hf_reference(model, prompt, 6)
    body = dict(sampling_params={"temperature": 0, "max_new_tokens": 6, "ignore_eos": True, "n": 2})
    results = generate_ok(server, prompt, **body)
    assert [r["output_ids"] for r in results] == [expected, expected]


def test_radix_cache_off_gives_the_same_outputs(default_server, one_slot_server) -> None:
    default, _ = default_server
    plain, _ = one_slot_server
    for prompt in prompts():
        a, b = served(default, prompt, 8), served(plain, prompt, 8)
        assert a["output_ids"] == b["output_ids"]
        assert a["meta_info"]["output_top_logprobs"] == b["meta_info"]["output_top_logprobs"]


def test_abort_mid_decode_then_reused_slot_matches_transformers(one_slot_server) -> None:
    server, model = one_slot_server
    body = {"input_ids": prompts()[3], "rid": "to-abort",
            "sampling_params": {"temperature": 0, "max_new_tokens": 1500, "ignore_eos": True}}
    last = None
    for last in iter_stream(server, body):
        if last["meta_info"]["completion_tokens"] == 2:  # decoding: abort it
            requests.post(server.url + "/abort_request", json={"rid": "to-abort"}, timeout=60).raise_for_status()
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert last["meta_info"]["completion_tokens"] < 1500
    # Two request slots: of the next two requests (run one at a time) one takes the aborted row.
    for prompt in prompts(3)[1:]:
        assert_matches_hf(server, model, [prompt])


def test_deterministic_mode_batch_equals_solo(checkpoint, gguf_path: str) -> None:
    folder, model = checkpoint
    prompt_list = prompts()
    with serving(folder, gguf_path, *CHUNK, "--enable-deterministic-inference") as server:
        solo = [served(server, p, 8) for p in prompt_list]
        with concurrent.futures.ThreadPoolExecutor(len(prompt_list)) as pool:
            batched = list(pool.map(lambda p: served(server, p, 8), prompt_list))
    for a, b in zip(solo, batched):
        assert a["output_ids"] == b["output_ids"]
        assert a["meta_info"]["output_top_logprobs"] == b["meta_info"]["output_top_logprobs"]
    # The longest prompt (5 chunks of 16) against transformers.
    assert solo[-1]["output_ids"] == hf_reference(model, prompt_list[-1], 8)[0]
