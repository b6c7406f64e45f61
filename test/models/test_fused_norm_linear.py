"""The decoder layer's norms fused into the projections after them (RMSNorm.fused_linear: the
input norm into qkv_proj, the post-attention norm into gate_up_proj with silu * up) against the
separate norm and projection, on a tiny random bf16 model's decode step.

The fused path runs on CUDA only. On a CPU the test opens it to the Triton interpreter (set before
triton is imported): the skinny-matmul kernel takes CPU tensors under its CUDA rule, the linears
keep plain weights, and every step gets a FusedRope (attention then rotates on its torch path).
The kernels round alike but may sum a row's squares in another order, so the logits are held to
bf16 rounding, not to the bit."""

from __future__ import annotations

import os
from typing import Optional

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from runner_utils import Driver  # noqa: E402
from sglang.srt.layers import linear  # noqa: E402
from sglang.srt.layers.layernorm import RMSNorm  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode  # noqa: E402
from sglang.srt.model_executor.model_runner import ModelRunner  # noqa: E402
from sglang.srt.models.llama import LlamaModel  # noqa: E402
from sglang.srt.models.llama_layers import FusedRope  # noqa: E402

LAYERS = 2
HIDDEN = 128
# family -> (config, model, config extras, fused launches per layer at 3 rows). The skinny-matmul
# kernel takes more than one row where its output is no wider than its input: the MLP's in both
# (128 -> 128); Qwen3's qkv (2 + 2 * 1 heads of 32 = 128) but not Llama's (heads of 64).
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, 1),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}, 2),
}


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> str:
    """cuda, or cpu with the CUDA decode path opened to the interpreter (module docstring)."""
    if torch.cuda.is_available():
        return "cuda"
    from sgl_kernel_ext.gemm import gemv_triton as gemv

    def gemv_for(x: torch.Tensor, weight: torch.Tensor, silu_mul: bool = False) -> Optional[object]:
        return gemv if gemv.gemv_rule(x, weight, silu_mul) else None  # gemv_applies without its x.is_cuda

    def step_rope(self: LlamaModel, forward_batch: ForwardBatch, x: torch.Tensor) -> FusedRope:
        rotary, positions = self.rotary_emb, forward_batch.positions
        return FusedRope(positions, rotary.cos_sin_cache, positions, None, rotary)

    monkeypatch.setattr(linear, "_gemv_for", gemv_for)
    monkeypatch.setattr(linear, "cpu_pack_supported", lambda weight: False)
    monkeypatch.setattr(LlamaModel, "_step_rope", step_rope)
    return "cpu"


def _tiny_runner(folder: str, family: str, device: str) -> ModelRunner:
    from family_utils import save_tiny

    config_cls, model_cls, extra, _ = FAMILIES[family]
    save_tiny(folder, config_cls, model_cls, hidden_size=HIDDEN, intermediate_size=HIDDEN, num_hidden_layers=LAYERS,
              num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, **extra)
    graphs = dict(disable_cuda_graph=True, disable_piecewise_cuda_graph=True) if device == "cuda" else {}
    return ModelRunner(folder, device=device, dtype="bfloat16", max_total_tokens=512, max_running_requests=8, **graphs)


def _decode_fused_and_separate(
    runner: ModelRunner, n: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(fused, separate) next-token logits [n, V] of one decode step of `n` requests after their
    prefill, and how many fused launches the fused step made."""
    fused_launches = []
    fused_linear = RMSNorm.fused_linear

    def counted(self: RMSNorm, *args, **kwargs) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        out = fused_linear(self, *args, **kwargs)
        fused_launches.append(out is not None)
        return out

    driver = Driver(runner)
    reqs = [driver.new_req() for _ in range(n)]
    driver.extend(reqs, [[5 + i, 6, 7 + 2 * i, 9][: 2 + i % 3] for i in range(n)])
    batch = driver.forward_batch(reqs, [[11 + i] for i in range(n)], ForwardMode.DECODE)
    with monkeypatch.context() as patch:
        patch.setattr(RMSNorm, "fused_linear", counted)
        fused = runner.forward(batch).next_token_logits.clone()
    with monkeypatch.context() as patch:
        patch.setattr(RMSNorm, "fused_linear", lambda *args, **kwargs: None)
        separate = runner.forward(batch).next_token_logits  # rewrites the step's K/V slots
    driver.release()
    return fused, separate, sum(fused_launches)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_norm_decode_matches_separate(family: str, device: str, tmp_path, monkeypatch) -> None:
    runner = _tiny_runner(str(tmp_path), family, device)
    for n, per_layer in ((1, 2), (3, FAMILIES[family][3])):
        fused, separate, launches = _decode_fused_and_separate(runner, n, monkeypatch)
        assert launches == per_layer * LAYERS  # at one row, both norms of every layer
        scale = float(separate.abs().max())
        assert fused.shape == separate.shape and (fused - separate).abs().max() <= 2**-7 * scale
