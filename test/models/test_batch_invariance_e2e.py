"""The deterministic mode on every family, at widths that are not multiples of the CPU's vector
step (hidden 48, intermediate 40, 5-6 experts, 20-wide experts): each of four prompts alone gives
bit for bit the logits it gets in a batch of four, at the prefill and over four decode steps.
Contiguous narrow tensors (a router's [N, E] scores, a [N, 1] gate) run partly through ATen's
scalar remainder loop at some batch sizes and not others; batch_invariant.pointwise must keep
every family's rows apart."""

from __future__ import annotations

import pytest
import torch

from family_utils import save_tiny
from runner_utils import Driver
from sglang.srt.model_executor.model_runner import ModelRunner

pytestmark = pytest.mark.e2e

ODD = dict(hidden_size=48, intermediate_size=40, num_attention_heads=4, num_key_value_heads=2,
           max_position_embeddings=512, num_hidden_layers=2)
EXPERTS = dict(num_experts_per_tok=2, moe_intermediate_size=20)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", ODD),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(ODD, head_dim=12)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(ODD, sliding_window=8)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(ODD, head_dim=12, sliding_window=8, query_pre_attn_scalar=12,
                                                          attn_logit_softcapping=5.0, final_logit_softcapping=3.0)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", ODD),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", ODD),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", dict(ODD, head_dim=12, pad_token_id=0)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(ODD, num_local_experts=5, num_experts_per_tok=2)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(ODD, head_dim=12, num_experts=6, norm_topk_prob=True,
                                                                **EXPERTS)),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", dict(
        ODD, num_hidden_layers=4, head_dim=16, num_experts=6, shared_expert_intermediate_size=24,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=12, linear_value_head_dim=12,
        linear_conv_kernel_dim=4, **EXPERTS)),
}
PROMPT_LENS = (11, 5, 19, 8)
DECODE_STEPS = 4


def _logits(runner: ModelRunner, prompts: list[list[int]]) -> list[torch.Tensor]:
    """The prefill's last-token logits [B, V], then each decode step's [B, V]."""
    driver = Driver(runner)
    reqs = [driver.new_req() for _ in prompts]
    out = [driver.extend(reqs, prompts).next_token_logits]
    for step in range(DECODE_STEPS):
        out.append(driver.decode(reqs, [7 + step + 3 * len(p) for p in prompts]))
    driver.release()
    return out


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_rows_alone_equal_rows_in_a_batch_bit_for_bit(family: str, tmp_path) -> None:
    config_cls, model_cls, shape = FAMILIES[family]
    save_tiny(str(tmp_path), config_cls, model_cls, **shape)
    runner = ModelRunner(str(tmp_path), max_total_tokens=512, max_running_requests=8, deterministic=True)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (n,), generator=g).tolist() for n in PROMPT_LENS]
    batched = _logits(runner, prompts)
    for i, prompt in enumerate(prompts):
        alone = _logits(runner, [prompt])
        for step, (one, many) in enumerate(zip(alone, batched)):
            assert torch.equal(one[0], many[i]), f"prompt {i}, step {step}"
