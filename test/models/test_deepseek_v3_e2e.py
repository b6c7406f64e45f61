"""DeepSeek-V3 (MLA over the compressed KV cache, YaRN, dense then MoE layers) against
transformers: tiny random checkpoints served in float32, every prompt sent at once, prompts
longer than a 16-token prefill chunk; the radix cache, the deterministic mode, and TP=2 sharded
logits equal to TP=1. The checkpoints carry a NextN (multi-token-prediction) module, which loads
into a draft head and leaves the outputs unchanged."""

from __future__ import annotations

import concurrent.futures

import pytest
import torch
import torch.multiprocessing as mp

from draft_head_utils import add_to_checkpoint, deepseek_nextn_tensors
from family_utils import assert_matches_hf, prompts, save_tiny, served, serving
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.test.server_process import free_port
from tp_workers import forward_logits, logits_worker

pytestmark = pytest.mark.e2e

LAYERS = 3
# One dense layer, then two MoE layers (8 experts in 4 groups, the best 2 groups compete, top-3).
SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=LAYERS, num_attention_heads=4,
             num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=24,
             moe_intermediate_size=32, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3,
             n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5, max_position_embeddings=1024)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 256,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8}
PLAIN_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
TP_ATOL = 1e-4


def _save_deepseek(folder: str, **config) -> torch.nn.Module:
    """A tiny checkpoint with a random correction bias (transformers initialises it to zeros) and
    a NextN module's tensors (`model.layers.{LAYERS}.*`)."""
    model = save_tiny(folder, "DeepseekV3Config", "DeepseekV3ForCausalLM", **{**SHAPE, **config})
    torch.manual_seed(1)
    with torch.no_grad():
        for layer in model.model.layers[SHAPE["first_k_dense_replace"]:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.2)
    model.save_pretrained(folder, safe_serialization=True)
    add_to_checkpoint(folder, deepseek_nextn_tensors(folder, model.config))
    return model


@pytest.fixture(scope="module")
def q_lora_folder(tmp_path_factory) -> tuple[str, torch.nn.Module]:
    folder = str(tmp_path_factory.mktemp("deepseek_v3"))
    return folder, _save_deepseek(folder, q_lora_rank=24, rope_parameters=YARN)


@pytest.fixture(scope="module")
def q_lora(q_lora_folder, gguf_path: str):
    folder, model = q_lora_folder
    with serving(folder, gguf_path, "--chunked-prefill-size", "16") as server:
        yield server, model


def test_deepseek_v3_matches_transformers_batched_and_chunked(q_lora) -> None:
    server, model = q_lora
    assert_matches_hf(server, model, prompts())


def test_deepseek_v3_prefix_cache_hit_matches_transformers(q_lora) -> None:
    server, model = q_lora
    # The second pass finds every prompt's prefix (compressed latent rows) in the radix cache.
    assert_matches_hf(server, model, prompts())


@pytest.fixture(scope="module")
def plain_q(tmp_path_factory, gguf_path: str):
    """q_proj without LoRA, rotate-half rope rows, no RoPE scaling, deterministic mode."""
    folder = str(tmp_path_factory.mktemp("deepseek_v3_plain_q"))
    model = _save_deepseek(folder, q_lora_rank=None, rope_interleave=False, rope_parameters=PLAIN_ROPE)
    with serving(folder, gguf_path, "--chunked-prefill-size", "16", "--enable-deterministic-inference") as server:
        yield server, model


def test_deepseek_v3_without_q_lora_matches_transformers(plain_q) -> None:
    server, model = plain_q
    assert_matches_hf(server, model, prompts())


def test_deepseek_v3_deterministic_alone_equals_batched(plain_q) -> None:
    server, _ = plain_q
    all_prompts = prompts()
    alone = served(server, all_prompts[2], 6)
    with concurrent.futures.ThreadPoolExecutor(len(all_prompts)) as pool:
        batched = list(pool.map(lambda p: served(server, p, 6), all_prompts))[2]
    assert batched["output_ids"] == alone["output_ids"]
    assert batched["meta_info"]["output_top_logprobs"] == alone["meta_info"]["output_top_logprobs"]


def test_deepseek_v3_tp2_logits_match_tp1(q_lora_folder, tmp_path) -> None:
    folder, _ = q_lora_folder
    out_path = str(tmp_path / "logits.pt")
    mp.spawn(logits_worker, args=(2, folder, f"tcp://127.0.0.1:{free_port()}", out_path), nprocs=2)
    sharded = torch.load(out_path)
    reference = forward_logits(ModelRunner(folder, max_total_tokens=128, max_running_requests=2))
    assert [a.shape for a in sharded] == [b.shape for b in reference]
    assert max((a - b).abs().max().item() for a, b in zip(sharded, reference)) < TP_ATOL


def test_deepseek_v3_nextn_head_loads(q_lora_folder) -> None:
    folder, model = q_lora_folder
    nextn = deepseek_nextn_tensors(folder, model.config)
    head = ModelRunner(folder, max_total_tokens=128, max_running_requests=2).model.nextn_heads[0]
    prefix = f"model.layers.{LAYERS}."
    assert torch.equal(head.eh_proj.weight, nextn[prefix + "eh_proj.weight"])
    assert torch.equal(head.shared_head.norm.weight, nextn[prefix + "shared_head.norm.weight"])
    kv_b = nextn[prefix + "self_attn.kv_b_proj.weight"].view(SHAPE["num_attention_heads"], -1, SHAPE["kv_lora_rank"])
    assert torch.equal(head.decoder.self_attn.w_uk, kv_b[:, : SHAPE["qk_nope_head_dim"]])
    gate = nextn[prefix + "mlp.experts.5.gate_proj.weight"]
    assert torch.equal(head.decoder.mlp.experts.w13_weight[5, : SHAPE["moe_intermediate_size"]], gate)


def test_deepseek_v3_nextn_shape_mismatch_is_refused(q_lora_folder, tmp_path) -> None:
    _, model = q_lora_folder
    folder = str(tmp_path)
    model.save_pretrained(folder, safe_serialization=True)
    tensors = deepseek_nextn_tensors(folder, model.config)
    tensors[f"model.layers.{LAYERS}.eh_proj.weight"] = torch.zeros(64, 64)
    add_to_checkpoint(folder, tensors)
    with pytest.raises(ValueError, match="eh_proj.weight"):
        ModelRunner(folder, max_total_tokens=128, max_running_requests=2)
