"""The FP8 W8A16 GEMV (sgl_kernel_ext/gemm/fp8_gemv_triton.py) against its plain-torch reference,
block-scaled and per-row weights, 1..4 rows and shapes off the tiles. TRITON_INTERPRET=1 on a
CPU (set before triton is imported), native on CUDA."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from sgl_kernel_ext.gemm.fp8_gemv_triton import BLOCK_K, fp8_gemv, fp8_gemv_applies, fp8_gemv_reference  # noqa: E402
from sgl_kernel_ext.gemm.fp8_reference import quantize_weight_blocks, quantize_weight_rows  # noqa: E402

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def _operands(m: int, n: int, k: int, block, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(m, k, generator=g).to(dtype), torch.randn(n, k, generator=g)
    if block is None:
        codes, scale = quantize_weight_rows(w)
        scale, block = scale.view(-1, 1), (1, -(-k // BLOCK_K) * BLOCK_K)
    else:
        codes, scale = quantize_weight_blocks(w, block)
    return x.to(DEVICE), codes.to(DEVICE), scale.to(DEVICE), block


@pytest.mark.parametrize("m", [1, 3, 4])
@pytest.mark.parametrize("block", [(128, 128), None])
@pytest.mark.parametrize("n,k", [(200, 300), (64, 256)])
def test_gemv_matches_reference(m, block, n, k) -> None:
    x, codes, scale, block = _operands(m, n, k, block, torch.float32)
    assert fp8_gemv_applies(x, block)
    got = fp8_gemv(x, codes, scale, block)
    torch.testing.assert_close(got, fp8_gemv_reference(x, codes, scale, block), rtol=1e-5, atol=1e-4)


def test_gemv_bf16_rows_and_strided_input() -> None:
    x, codes, scale, block = _operands(2, 160, 384, (128, 128), torch.bfloat16, seed=1)
    wide = torch.zeros(2, 512, dtype=x.dtype, device=x.device)
    wide[:, :384] = x
    got = fp8_gemv(wide[:, :384], codes, scale, block)  # row stride 512
    expected = fp8_gemv_reference(x, codes, scale, block)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-2, atol=1e-2)


def test_gemv_refuses_more_rows_and_straddling_scale_blocks() -> None:
    x = torch.zeros(5, 128)
    assert not fp8_gemv_applies(x, (128, 128))
    assert not fp8_gemv_applies(x[:1], (128, 64))
