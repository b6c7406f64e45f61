"""Softmax top-k routing in one Triton launch against the torch rule of select_experts.
TRITON_INTERPRET=1 on a CPU (set before triton is imported), native on CUDA."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from sgl_kernel_ext.moe.topk_softmax_triton import softmax_topk  # noqa: E402

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def _torch_rule(logits: torch.Tensor, k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    weights, ids = torch.topk(torch.softmax(logits.float(), dim=-1), k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


@pytest.mark.parametrize("n,experts,k", [(1, 128, 8), (5, 60, 4), (3, 8, 2)])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_topk_matches_torch(n, experts, k, renormalize, dtype) -> None:
    logits = torch.randn(n, experts, generator=torch.Generator().manual_seed(n + experts)).to(dtype).to(DEVICE)
    weights, ids = softmax_topk(logits, k, renormalize)
    ref_w, ref_ids = _torch_rule(logits, k, renormalize)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_w, rtol=1e-5, atol=1e-6)


def test_ties_go_to_the_lower_expert() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0]], device=DEVICE)
    _, ids = softmax_topk(logits, 3, True)
    assert ids.tolist() == [[1, 2, 4]]
