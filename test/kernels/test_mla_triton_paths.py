"""DeepSeek-V3's MLA through every Triton attention path, float32 under TRITON_INTERPRET=1 (native
on CUDA): the extend kernel on latent rows of V3's widths (576, padded to 1024: the wide-head
tiles) against the reference, and a tiny DeepSeek-V3 checkpoint whose steps (chunked prefill over
a cached prefix, split-KV decode, the batch-invariant mode) through the Triton backend equal the
torch_native backend's logits."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from family_utils import save_tiny  # noqa: E402
from paged_kv_utils import paged_kv_cache  # noqa: E402
from runner_utils import Driver  # noqa: E402
from sgl_kernel_ext.attention.paged_extend import paged_extend_attention  # noqa: E402
from sgl_kernel_ext.attention.reference import extend_attention_reference  # noqa: E402
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend  # noqa: E402
from sglang.srt.model_executor.model_runner import ModelRunner, first_attention  # noqa: E402

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
             q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=24,
             moe_intermediate_size=32, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3,
             n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5, max_position_embeddings=1024,
             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                              "original_max_position_embeddings": 256, "mscale": 1.0, "mscale_all_dim": 0.8})


def test_extend_on_v3_latent_rows_matches_reference() -> None:
    """Two heads over one shared 576-wide latent row per token (key and value buffer the same),
    prefixes of 0 and 37 tokens."""
    prefix, extend = [0, 37], [45, 20]
    lens = [p + e for p, e in zip(prefix, extend)]
    kv, _, r2t, pool, seq_lens = (t.to(DEVICE) for t in paged_kv_cache(1, 576, lens))
    q = torch.randn(sum(extend), 2, 576, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    starts = torch.tensor([0, extend[0]], device=DEVICE)
    prefix_t, extend_t = torch.tensor(prefix, device=DEVICE), torch.tensor(extend, device=DEVICE)
    got = paged_extend_attention(q, kv, kv, r2t, pool, starts, prefix_t, extend_t, max(extend), 192**-0.5)
    want = extend_attention_reference(q, kv, kv, r2t, pool, starts, prefix_t, extend_t, 192**-0.5)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("deepseek_v3_triton"))
    save_tiny(folder, "DeepseekV3Config", "DeepseekV3ForCausalLM", **SHAPE)
    return folder


def _steps(folder: str, triton: bool, deterministic: bool) -> list[torch.Tensor]:
    """Logits of: prompts prefilled in two chunks (the second over a cached prefix), then three
    batched decode steps."""
    runner = ModelRunner(folder, device=DEVICE, dtype="float32", max_total_tokens=512, max_running_requests=4,
                         attention_backend="torch_native", deterministic=deterministic, disable_cuda_graph=True)
    if triton:
        layout, attn = runner.kv_cache_layout, first_attention(runner.model)
        runner.attn_backend = TritonAttnBackend(runner.req_to_token_pool.req_to_token, attn.num_heads,
                                                layout.num_kv_heads, layout.head_dim)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 1000, (n,), generator=gen).tolist() for n in (5, 70, 33)]
    driver = Driver(runner)
    reqs = [driver.new_req() for _ in prompts]
    logits = [driver.extend(reqs, [p[:3] for p in prompts]).next_token_logits]
    logits.append(driver.extend(reqs, [p[3:] for p in prompts]).next_token_logits)
    for step in range(3):
        logits.append(driver.decode(reqs, [p[step] for p in prompts]))
    return logits


@pytest.mark.parametrize("deterministic", [False, True])
def test_tiny_deepseek_v3_triton_backend_matches_torch_native(checkpoint: str, deterministic: bool) -> None:
    want = _steps(checkpoint, False, deterministic)
    got = _steps(checkpoint, True, deterministic)
    for step, (a, b) in enumerate(zip(got, want)):
        assert (a - b).abs().max().item() < 1e-4, f"step {step}"
