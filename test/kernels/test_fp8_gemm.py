"""FP8 W8A8 linears: the plain-torch reference against a float64 matmul of the dequantised
operands, and the Triton kernels (sgl_kernel_ext/gemm/fp8_block_triton.py) against the
reference. TRITON_INTERPRET=1 on a CPU (set before triton is imported), native on CUDA.

The interpreter runs the kernels on fp8 tensors, but its float32 -> e4m3 conversion rounds a
value just below a power of two (e.g. 124.3 -> 64 instead of 128) wrongly. So in the
interpreter the quantisation kernel is checked on inputs it quantises without rounding, and the
GEMM kernel on the reference's codes; the random-input comparison of the whole layer is a GPU
test (and benchmark/gpu_fp8_check.py)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from sgl_kernel_ext.gemm.fp8_block_triton import (  # noqa: E402
    GROUP,
    fp8_block_matmul,
    fp8_linear_triton,
    quantize_rows_fp8,
)
from sgl_kernel_ext.gemm.fp8_reference import (  # noqa: E402
    FP8_DTYPE,
    FP8_MAX,
    dequantize_weight,
    fp8_linear_reference,
    quantize_rows_reference,
    quantize_weight_blocks,
    quantize_weight_rows,
)
from sglang.srt.layers.quantization import fp8_gemm  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED else "cuda"
BLOCK = (128, 128)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("block", [None, BLOCK])
def test_reference_equals_float64_dequantised_matmul(block):
    x, w, bias = _randn(7, 300, seed=0), _randn(200, 300, seed=1), _randn(200, seed=2)
    codes, scale = quantize_weight_rows(w) if block is None else quantize_weight_blocks(w, block)
    out = fp8_linear_reference(x, codes, scale, block, GROUP, bias)
    x_codes, x_scales = quantize_rows_reference(x, GROUP)
    x_dq = x_codes.double() * x_scales.double().repeat_interleave(GROUP, 1)[:, :300]
    w_dq = codes.double() * (scale.double().reshape(-1, 1) if block is None
                             else scale.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[:200, :300])
    expected = x_dq @ w_dq.t() + bias.double()
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-4)
    # And the quantised layer is close to the exact float64 product (FP8's 3 mantissa bits).
    exact = x.double() @ w.double().t() + bias.double()
    assert (out.double() - exact).abs().max() < 0.1 * exact.abs().max()


def test_weight_quantisation_round_trips_within_fp8_precision():
    w = _randn(256, 384, seed=3)
    for codes, scale, block in (quantize_weight_rows(w) + (None,), quantize_weight_blocks(w, BLOCK) + (BLOCK,)):
        assert codes.dtype == FP8_DTYPE
        dq = dequantize_weight(codes, scale, block)
        assert ((dq - w).abs() <= w.abs() / 16 + scale.max() * 2**-9).all()  # half of e4m3's 2^-3 step


def _exact_input(rows: int, cols: int, seed: int) -> torch.Tensor:
    """x whose every group of 128 columns holds +-448 * 2^e and e4m3 values times 2^e: its scale
    is 2^e and each x / scale is an e4m3 value, so quantising involves no rounding."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randn(rows, cols, generator=gen).clamp(-400, 400).to(FP8_DTYPE).float()
    codes[:, ::GROUP] = FP8_MAX
    exponents = torch.randint(-8, 4, (rows, -(-cols // GROUP)), generator=gen).float()
    return codes * torch.exp2(exponents).repeat_interleave(GROUP, 1)[:, :cols]


@pytest.mark.parametrize("group", [GROUP, 300])
def test_quantize_rows_kernel(group):
    # One group per row (300): every 128 columns share their exponent, so the row's scale is it too.
    x = _exact_input(5, 300, seed=4) if group == GROUP else _exact_input(5, 128, seed=4).repeat(1, 3)[:, :300]
    codes, scales = quantize_rows_fp8(x.to(DEVICE), group, padded_rows=8)
    ref_codes, ref_scales = quantize_rows_reference(x, group)
    assert torch.equal(codes[:5].float().cpu(), ref_codes.float())
    torch.testing.assert_close(scales[:5].cpu(), ref_scales, rtol=0, atol=0)
    assert codes[5:].float().abs().sum() == 0  # padding rows are zeros


@pytest.mark.parametrize("rows", [1, 5, 40])
@pytest.mark.parametrize("block", [BLOCK, (1, 384)])
def test_block_matmul_kernel_on_reference_codes(rows, block):
    x, w, bias = _randn(rows, 300, seed=5), _randn(200, 300, seed=6), _randn(200, seed=7)
    if block == BLOCK:
        codes, scale = quantize_weight_blocks(w, block)
    else:  # per output row: one block of the whole (padded) K per row
        codes, scale = quantize_weight_rows(w)
        scale = scale.view(-1, 1)
    x_codes, x_scales = quantize_rows_reference(x, GROUP)
    out = fp8_block_matmul(x_codes.to(DEVICE), x_scales.to(DEVICE), codes.to(DEVICE), scale.to(DEVICE), block,
                           torch.float32, bias.to(DEVICE))
    expected = fp8_linear_reference(x, codes, scale, block, GROUP, bias)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETED, reason="random inputs round in the interpreter's faulty e4m3 conversion")
@pytest.mark.parametrize("rows", [1, 64, 256])
def test_triton_linear_matches_reference_on_random_inputs(rows):
    x = _randn(rows, 1024, seed=8).to(DEVICE, torch.bfloat16)
    codes, scale = quantize_weight_blocks(_randn(768, 1024, seed=9).to(DEVICE), BLOCK)
    out = fp8_linear_triton(x, codes, scale, BLOCK)
    expected = fp8_linear_reference(x, codes, scale, BLOCK, GROUP)
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETED, reason="torch._scaled_mm runs on CUDA only")
@pytest.mark.parametrize("rows", [17, 256])
def test_blockwise_scaled_mm_matches_reference(rows):
    x = _randn(rows, 1024, seed=12).to(DEVICE, torch.bfloat16)
    codes, scale = quantize_weight_blocks(_randn(768, 1024, seed=13).to(DEVICE), BLOCK)
    out = fp8_gemm.scaled_mm_blockwise(x, codes, scale)
    expected = fp8_linear_reference(x, codes, scale, BLOCK, GROUP)
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)
