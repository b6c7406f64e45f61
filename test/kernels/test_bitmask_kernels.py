"""The grammar bitmask's Triton kernel against its plain-torch reference (sgl_kernel_ext/sampling/
bitmask.py): TRITON_INTERPRET=1 on a CPU (set before triton is imported), native on CUDA. The
function is exact: -inf where a bit is 0 (and past 32 * W), the logit unchanged elsewhere."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from sgl_kernel_ext.sampling.bitmask import apply_token_bitmask_reference  # noqa: E402
from sgl_kernel_ext.sampling.bitmask_triton import apply_token_bitmask_triton  # noqa: E402

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


@pytest.mark.parametrize(
    "rows, vocab, words",
    [(3, 100, 4), (2, 2100, 66), (4, 1500, 40), (1, 1024, 32)],  # W > V/32 (padding bits), W < V/32 (masked tail), exact
)
def test_triton_matches_reference(rows, vocab, words):
    gen = torch.Generator().manual_seed(rows * vocab)
    wide = torch.randn(rows, vocab + 7, generator=gen).to(DEVICE)
    logits = wide[:, :vocab]  # a row stride past the vocabulary: the kernel must not write there
    mask = torch.randint(-(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, generator=gen).to(DEVICE)
    mask[0] = -1  # an unconstrained row stays untouched
    expected, tail = logits.clone(), wide[:, vocab:].clone()
    apply_token_bitmask_reference(expected, mask)
    apply_token_bitmask_triton(logits, mask)
    assert torch.equal(logits, expected)
    assert torch.equal(wide[:, vocab:], tail)
    assert torch.isfinite(logits[0, : min(vocab, 32 * words)]).all()


def test_triton_refuses_other_dtypes():
    with pytest.raises(ValueError, match="float32"):
        apply_token_bitmask_triton(torch.zeros(1, 8, dtype=torch.float16, device=DEVICE), torch.zeros(1, 1, dtype=torch.int32, device=DEVICE))
