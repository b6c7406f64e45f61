"""The int8-activation block kernel (sgl_kernel_ext/gemm/block_quant_linear_q8.c, opt-in by
--cpu-int8-activations): its packing keeps the weights exactly, it computes what its plain-torch
reference computes (x rounded to 8 bits per block of 32 against the exact weights), the AVX2 and
portable builds agree bit for bit, rows are independent of the batch, and its distance from the
exact kernel stays inside the bound the rounding of x allows."""

from __future__ import annotations

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
