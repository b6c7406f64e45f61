"""Linear layers from integer blocks (the C kernel in sgl_kernel_ext/gemm): exact recovery of the
blocks a GGUF Q4_1 / Q8_0 tensor dequantises to, the kernel (AVX2 and portable builds) against its
plain-torch reference, rows independent of the batch, and the embedded model's weights."""

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
)

if not bq.block_quant_kernel_available():
    pytest.skip("no working C compiler: the CPU kernel is not built", allow_module_level=True)


def q4_1_weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """A float32 weight as GGUF's Q4_1 dequantises: float16 scale d and minimum m per block of 32,
    codes 0..15 with both ends used, W = d * code + m in float32."""
    gen = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // 32, 1, generator=gen) * 0.02).half().float()
    m = (-torch.rand(n, k // 32, 1, generator=gen) * 0.1).half().float()
    codes = torch.randint(0, 16, (n, k // 32, 32), generator=gen).float()
    codes[..., 0], codes[..., 1] = 0, 15
    return (d * codes + m).reshape(n, k)


def q8_0_weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """GGUF's Q8_0: float16 scale d = max|x| / 127 per block, codes -127..127, W = d * code."""
    gen = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // 32, 1, generator=gen) * 0.01).half().float()
    codes = torch.randint(-127, 128, (n, k // 32, 32), generator=gen).float()
    codes[..., 0] = 127 * torch.where(torch.rand(n, k // 32, generator=gen) < 0.5, -1.0, 1.0)
    return (d * codes).reshape(n, k)


@pytest.mark.parametrize("make,bits", [(q4_1_weight, 4), (q8_0_weight, 8)])
def test_blocks_are_recovered_exactly(make, bits) -> None:
    weight = make(48, 320)
    blocks = decompose_block_quant(weight)
    assert blocks is not None and blocks.bits == bits
    assert torch.equal(dequantize_block_quant(blocks), weight)


def test_zero_blocks_and_zero_rows_are_blocks_too() -> None:
    weight = q4_1_weight(32, 64)
    weight[3] = 0.0
    weight[7, :32] = weight[7, 0]  # a constant block: scale 0
    blocks = decompose_block_quant(weight)
    assert blocks is not None and torch.equal(dequantize_block_quant(blocks), weight)


@pytest.mark.parametrize(
    "weight",
    [
        torch.randn(32, 64),  # arbitrary float32 values
        q4_1_weight(32, 64) * 1.0001,  # almost blocks: one rounding off
        q4_1_weight(24, 64),  # out not a multiple of 16
        q4_1_weight(32, 64)[:, :48],  # in not a multiple of 32
        q4_1_weight(32, 64).double(),
    ],
    ids=["random", "almost", "out-24", "in-48", "float64"],
)
def test_weights_not_made_of_blocks_are_left_alone(weight) -> None:
    assert decompose_block_quant(weight) is None


def linear_inputs(rows: int, k: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, k] and a bias [n], standard normal."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, k, generator=gen), torch.randn(n, generator=gen)


@pytest.fixture(params=["native", "portable"])
def kernel_variant(request, monkeypatch):
    if request.param == "portable":
        portable = load_kernel(*bq._KERNEL, defines=("PORTABLE_ONLY",))
        monkeypatch.setattr(bq, "_kernel", lambda: portable)
    return request.param


@pytest.mark.parametrize("make", [q4_1_weight, q8_0_weight])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 16, 33])  # 1-4: the in-register GEMV path
@pytest.mark.parametrize("n,k", [(16, 32), (48, 288), (32, 576)])  # 288: a partial 256-wide chunk
def test_kernel_matches_reference(kernel_variant, make, rows, n, k) -> None:
    blocks = decompose_block_quant(make(n, k, seed=rows))
    x, bias = linear_inputs(rows, k, n, seed=rows)
    for b in (None, bias):
        got = block_quant_linear(x, blocks, b)
        want = block_quant_linear_reference(x, blocks, b)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_rows_do_not_depend_on_the_batch() -> None:
    blocks = decompose_block_quant(q4_1_weight(64, 576))
    x = torch.randn(23, 576)
    full = block_quant_linear(x, blocks)
    for r in (0, 5, 22):
        assert torch.equal(block_quant_linear(x[r : r + 1], blocks)[0], full[r])
    assert torch.equal(block_quant_linear(x.flip(0), blocks).flip(0), full)


@pytest.mark.parametrize("make", [q4_1_weight, q8_0_weight])
def test_gemv_rows_equal_the_buffered_path_bit_for_bit(kernel_variant, make) -> None:
    """Up to 4 rows take the GEMV path, 5 and more the buffered one: the same sums in the same
    order, so a row's bits never depend on which path its batch size picked."""
    blocks = decompose_block_quant(make(48, 320))
    x = torch.randn(7, 320, generator=torch.Generator().manual_seed(3))
    bias = torch.randn(48, generator=torch.Generator().manual_seed(4))
    for b in (None, bias):
        buffered = block_quant_linear(x, blocks, b)  # 7 rows
        for rows in (1, 2, 3, 4):
            assert torch.equal(block_quant_linear(x[:rows], blocks, b), buffered[:rows])


def test_bad_inputs_are_refused() -> None:
    blocks = decompose_block_quant(q4_1_weight(16, 64))
    with pytest.raises(ValueError, match="x must be float32"):
        block_quant_linear(torch.randn(2, 32), blocks)
    with pytest.raises(ValueError, match="x must be float32"):
        block_quant_linear(torch.randn(2, 64).double(), blocks)
    with pytest.raises(ValueError, match="bias must be"):
        block_quant_linear(torch.randn(2, 64), blocks, torch.randn(8))


def test_embedded_model_weights_are_blocks(gguf_path: str) -> None:
    """SmolLM2's GGUF: Q4_1 projections and a Q8_0 embedding, recovered bit for bit."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.gguf_loader import iter_gguf_weights

    wanted = {"model.layers.0.mlp.down_proj.weight": 4, "model.layers.7.self_attn.q_proj.weight": 4,
              "model.embed_tokens.weight": 8}
    for name, weight in iter_gguf_weights(gguf_path, ModelConfig.from_path(gguf_path)):
        if name in wanted:
            blocks = decompose_block_quant(weight)
            assert blocks is not None and blocks.bits == wanted.pop(name), name
            assert torch.equal(dequantize_block_quant(blocks), weight), name
    assert not wanted
