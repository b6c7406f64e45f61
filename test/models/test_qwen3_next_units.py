"""Qwen3-Next at the ModelRunner level (no server): the checkpoint loads with its MTP tensors
(into the draft head, not run), the KV cache holds only the full-attention layers, the state pool one row per request
slot; logits equal transformers' for a whole prompt, for the same prompt in chunks followed by
decode steps, and on a request slot a previous request used."""

from __future__ import annotations

import pytest
import torch

from draft_head_utils import add_to_checkpoint, qwen3_next_mtp_tensors
from family_utils import save_tiny
from runner_utils import Driver
from sglang.srt.model_executor.model_runner import ModelRunner

ATOL = 1e-4
SHAPE = dict(
    vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, max_position_embeddings=256, linear_num_key_heads=2,
    linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4,
    num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
)


@pytest.fixture(scope="module")
def model_and_runner(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("qwen3_next_units"))
    model = save_tiny(folder, "Qwen3NextConfig", "Qwen3NextForCausalLM", **SHAPE)
    # A multi-token-prediction head beside the model's own tensors: loaded, not run.
    add_to_checkpoint(folder, qwen3_next_mtp_tensors(folder, model.config))
    # One running request: two request slots, so the second request after a release reuses a slot.
    runner = ModelRunner(folder, max_total_tokens=1024, max_running_requests=1)
    return model, runner


@torch.no_grad()
def _hf_logits(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids]), use_cache=False).logits[0]  # [T, V]


def test_layouts(model_and_runner) -> None:
    _, runner = model_and_runner
    assert runner.kv_cache_layout.num_layers == 1  # layer 3 is the only full-attention layer (the MTP head owns none)
    assert runner.model.mtp is not None and len(runner.model.mtp.layers) == 1
    assert len(runner.kv_cache.k_buffers) == 1
    state = runner.state_pool.state
    assert tuple(state.shape) == (3, runner.req_to_token_pool.size + 1, 4, 16, 16)
    assert tuple(runner.state_pool.conv.shape) == (3, runner.req_to_token_pool.size + 1, 2 * 32 + 64, 3)


def test_whole_prompt_matches_transformers(model_and_runner) -> None:
    model, runner = model_and_runner
    ids = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    driver = Driver(runner)
    try:
        out = driver.extend([driver.new_req()], [ids], input_logits=True).input_token_logits
    finally:
        driver.release()
    torch.testing.assert_close(out, _hf_logits(model, ids), atol=ATOL, rtol=0)


def test_chunks_then_decode_on_reused_slots_match_transformers(model_and_runner) -> None:
    model, runner = model_and_runner
    ids = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = _hf_logits(model, ids)
    for _ in range(3):  # the slots alternate: every run after the first starts on a used slot
        driver = Driver(runner)
        try:
            req = driver.new_req()
            driver.extend([req], [ids[:16]])
            last = driver.extend([req], [ids[16:30]]).next_token_logits[0]
            torch.testing.assert_close(last, ref[29], atol=ATOL, rtol=0)
            for t in range(30, 40):
                last = driver.decode([req], [ids[t]])[0]
            torch.testing.assert_close(last, ref[39], atol=ATOL, rtol=0)
        finally:
            driver.release()
