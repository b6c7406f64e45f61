"""The int8-activation block kernel (sgl_kernel_ext/gemm/block_quant_linear_q8.c, opt-in by
--cpu-int8-activations): its packing keeps the weights exactly, it computes what its plain-torch
reference computes (x rounded to 8 bits per block of 32 against the exact weights), the AVX2 and
portable builds agree bit for bit, rows are independent of the batch, and its distance from the
exact kernel stays inside the bound the rounding of x allows."""

from __future__ import annotations

import ctypes
import logging

import pytest
import torch

import sgl_kernel_ext.gemm.block_quant_linear as bq
from sgl_kernel_ext.cpu_build import load_kernel
from sgl_kernel_ext.gemm.block_quant_linear import (
    block_quant_linear,
    block_quant_linear_reference,
    decompose_block_quant,
    dequantize_block_quant,
    quantize_activations_reference,
)
from sglang.srt.layers import linear
from sglang.srt.layers.linear import block_quant_int8_activations, find_block_quant
from test_block_quant_linear import linear_inputs, q4_1_weight, q8_0_weight

if not bq.block_quant_kernel_available(int8_activations=True):
    pytest.skip("no working C compiler: the CPU kernel is not built", allow_module_level=True)

PORTABLE = load_kernel(*bq._Q8_KERNEL, defines=("PORTABLE_ONLY",))


def q8_blocks(make, n: int, k: int, seed: int = 0):
    return decompose_block_quant(make(n, k, seed), int8_activations=True)


def portable_linear(monkeypatch, x, blocks, bias=None) -> torch.Tensor:
    with monkeypatch.context() as m:
        m.setattr(bq, "_q8_kernel", lambda: PORTABLE)
        return block_quant_linear(x, blocks, bias)


def rounding_bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[M, N] float64: sum over blocks of (dx / 2) * sum |w| -- how far rounding x to 8 bits can
    move an output."""
    blocks = x.double().reshape(x.shape[0], -1, 32)
    half_step = blocks.abs().amax(-1) / 127 / 2  # [M, K / 32]
    w_abs = weight.double().abs().reshape(weight.shape[0], -1, 32).sum(-1)  # [N, K / 32]
    return half_step @ w_abs.T


def magnitude(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[M, N]: sum |x| |w|, the scale float32 rounding errors of a dot product grow with."""
    return x.double().abs() @ weight.double().abs().T


@pytest.mark.parametrize("make,bits", [(q4_1_weight, 4), (q8_0_weight, 8)])
def test_packing_keeps_the_weights_exactly(make, bits) -> None:
    weight = make(48, 320)
    blocks = decompose_block_quant(weight, int8_activations=True)
    assert blocks.int8_activations and blocks.bits == bits
    assert blocks.packed.shape == (48 // 8, 320 // 32, 8 * (20 if bits == 4 else 34))  # GGUF's bytes per block
    assert torch.equal(dequantize_block_quant(blocks), weight)


@pytest.mark.parametrize("make", [q4_1_weight, q8_0_weight])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 33])  # 4 rows per register group, 9 and 33 leave partial ones
@pytest.mark.parametrize("n,k", [(16, 32), (48, 288), (32, 576)])
def test_kernel_matches_reference_and_the_portable_build(monkeypatch, make, rows, n, k) -> None:
    weight = make(n, k, seed=rows)
    blocks = decompose_block_quant(weight, int8_activations=True)
    x, bias = linear_inputs(rows, k, n, seed=rows)
    for b in (None, bias):
        got = block_quant_linear(x, blocks, b)
        want = block_quant_linear_reference(x, blocks, b)
        tolerance = 1e-6 * magnitude(quantize_activations_reference(x), weight) + 1e-6
        assert ((got.double() - want.double()).abs() <= tolerance).all()
        assert torch.equal(portable_linear(monkeypatch, x, blocks, b), got)


@pytest.mark.parametrize("make", [q4_1_weight, q8_0_weight])
def test_distance_from_the_exact_kernel_is_the_rounding_of_x(make) -> None:
    weight = make(64, 576, seed=3)
    x = torch.randn(5, 576, generator=torch.Generator().manual_seed(3))
    got = block_quant_linear(x, decompose_block_quant(weight, int8_activations=True))
    exact = block_quant_linear(x, decompose_block_quant(weight))
    distance = (got.double() - exact.double()).abs()
    assert (distance <= rounding_bound(x, weight) + 1e-5 * magnitude(x, weight)).all()
    assert distance.max() > 0  # it does round: not the exact kernel under another name


def test_extreme_codes_and_activations_do_not_saturate(monkeypatch) -> None:
    """Codes at their ends against q = +-127 everywhere: the largest integer sums the kernel's
    16-bit products and pair sums must hold (15 x 127 x 2 x 8 for 4-bit, 127 x 127 x 2 for 8-bit)."""
    x = torch.full((2, 64), 3.0)
    x[1, 32:] = -3.0
    q4 = torch.full((16, 64), 15.0)  # Q4_1 blocks with d = 1, m = 0: every code but one 15
    q4[:, 0] = q4[:, 32] = 0.0
    q8 = torch.full((16, 64), 127.0)  # Q8_0 blocks with d = 1
    q8[8:] = -127.0
    for weight in (q4, q8):
        blocks = decompose_block_quant(weight, int8_activations=True)
        want = block_quant_linear_reference(x, blocks).double()  # a saturated sum would be off by thousands of steps
        tolerance = 1e-6 * magnitude(x, weight)
        for got in (block_quant_linear(x, blocks), portable_linear(monkeypatch, x, blocks)):
            assert ((got.double() - want).abs() <= tolerance).all()


def test_native_build_multiplies_with_avx2_where_the_cpu_has_it() -> None:
    """Else "portable equals native" below would compare the portable build with itself."""
    with open("/proc/cpuinfo") as f:
        flags = next((line.split() for line in f if line.startswith("flags")), [])
    if not {"avx2", "fma", "f16c"} <= set(flags):
        pytest.skip("this CPU has no AVX2 / FMA / F16C")
    uses_avx2 = load_kernel(bq._Q8_KERNEL[0], "block_quant_linear_q8_uses_avx2", (), ctypes.c_int)
    assert uses_avx2() == 1


def test_subnormal_and_non_finite_blocks(monkeypatch) -> None:
    """A row of subnormals, where max|x| / 127 rounds down so far that x / dx = 190: q must be
    clamped to 127 and the block sum taken over the clamped q, in both builds as in the reference.
    Scales and minimums of 1024 keep every product exact, so the outputs must be equal. A block
    holding NaN or inf makes every output NaN, as the exact kernel would (the sampler then flags
    the row), not finite noise."""
    codes = torch.randint(0, 16, (16, 64), generator=torch.Generator().manual_seed(5)).float()
    codes[:, 0::32], codes[:, 1::32] = 0, 15
    blocks = decompose_block_quant(1024 * codes + 1024, int8_activations=True)  # Q4_1, d = m = 1024
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(5))
    x[0] = torch.tensor(190, dtype=torch.int32).view(torch.float32)  # 2.7e-43: dx = 1.4e-45
    x[1, 40] = float("nan")
    x[2, 3] = float("inf")
    got = block_quant_linear(x, blocks)
    torch.testing.assert_close(portable_linear(monkeypatch, x, blocks), got, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(got[0], block_quant_linear_reference(x[:1], blocks)[0])
    assert got[1:].isnan().all()
    assert block_quant_linear_reference(x[1:], blocks).isnan().all()


def test_constant_and_zero_weight_blocks_pack_exactly() -> None:
    """A Q4_1 block with scale 0 (all weights equal) and an all-zero row, in the int8 layout."""
    weight = q4_1_weight(16, 64)
    weight[2] = 0.0
    weight[5, :32] = weight[5, 0]
    blocks = decompose_block_quant(weight, int8_activations=True)
    assert torch.equal(dequantize_block_quant(blocks), weight)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(6))
    torch.testing.assert_close(block_quant_linear(x, blocks), block_quant_linear_reference(x, blocks), rtol=1e-5, atol=1e-5)


def test_zero_blocks_of_x_give_zero() -> None:
    blocks = q8_blocks(q4_1_weight, 16, 96)
    x = torch.randn(2, 96, generator=torch.Generator().manual_seed(1))
    x[0] = 0.0
    x[1, 32:64] = 0.0  # one block of zeros: dx = 0, no division by it
    got = block_quant_linear(x, blocks)
    assert torch.equal(got[0], torch.zeros(16))
    torch.testing.assert_close(got, block_quant_linear_reference(x, blocks), rtol=1e-5, atol=1e-5)


def test_rows_do_not_depend_on_the_batch() -> None:
    blocks = q8_blocks(q4_1_weight, 64, 576)
    x = torch.randn(23, 576, generator=torch.Generator().manual_seed(2))
    full = block_quant_linear(x, blocks)
    for r in (0, 5, 22):
        assert torch.equal(block_quant_linear(x[r : r + 1], blocks)[0], full[r])
    assert torch.equal(block_quant_linear(x.flip(0), blocks).flip(0), full)


def test_a_load_with_the_flag_reports_what_it_packed(caplog, monkeypatch) -> None:
    """--cpu-int8-activations says how many weights took it, warns when none could (no GGUF
    blocks: the flag would do nothing), and keeps the exact kernel when its own did not build."""
    caplog.set_level(logging.INFO, logger=linear.__name__)
    with block_quant_int8_activations(True):
        assert find_block_quant(torch.randn(32, 64)) is None
    assert "has no effect on this model" in caplog.text
    caplog.clear()
    with block_quant_int8_activations(True):
        assert find_block_quant(q4_1_weight(32, 64)).int8_activations
        assert find_block_quant(q8_0_weight(16, 32)).int8_activations
    assert "2 weights round their inputs to 8 bits" in caplog.text
    assert not find_block_quant(q4_1_weight(32, 64)).int8_activations  # outside a load with the flag
    caplog.clear()
    monkeypatch.setattr(bq, "_q8_kernel", lambda: None)
    with block_quant_int8_activations(True):
        assert not find_block_quant(q4_1_weight(32, 64)).int8_activations
    assert "its kernel did not build" in caplog.text
