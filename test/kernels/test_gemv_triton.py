"""gemv_triton (a decode step's few rows times a weight) against its plain-torch reference.
TRITON_INTERPRET=1 on a CPU (set before triton is imported), native on CUDA.

The kernel and the reference both sum in float32, in different orders, then round to the model
dtype: results agree within one unit in the last place (of the mean output magnitude where an
output nearly cancels), nearly all bit for bit. The fused
silu(gate) * up equals the unfused kernel's matmul followed by the reference activation to the
bit, and a row's result does not depend on the other rows of the call."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from sgl_kernel_ext.activation.reference import silu_mul_reference  # noqa: E402
from sgl_kernel_ext.gemm.gemv_reference import gemv_reference  # noqa: E402
from sgl_kernel_ext.gemm.gemv_triton import GEMV_MAX_WEIGHT_ROWS, GEMV_MAX_ROWS, gemv_applies, gemv_triton  # noqa: E402

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
_MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10}
# (N, K): tiles with a partial column block and a partial K tile, and the shapes of Qwen3-0.6B's linears.
SHAPES = [(40, 72), (96, 256), (300, 520)] if DEVICE == "cpu" else [(40, 72), (4096, 1024), (1024, 2048), (1024, 3072), (6144, 1024)]


def _randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)


def _assert_close_ulp(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    # Near-cancelled outputs are held to the ulp of the typical output, not their own.
    magnitude = want.double().abs().clamp_min(float(want.double().abs().mean()))
    _, exponent = torch.frexp(magnitude)
    ulp = torch.ldexp(torch.ones_like(magnitude), exponent - 1 - _MANTISSA_BITS[want.dtype])
    assert ((got.double() - want.double()).abs() <= ulp).all()
    assert (got == want).float().mean() >= 0.9


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 3, GEMV_MAX_ROWS])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_reference(shape: tuple[int, int], rows: int, dtype: torch.dtype) -> None:
    n, k = shape
    x, w = _randn(rows, k, dtype=dtype, seed=1), _randn(n, k, dtype=dtype, seed=2) * 0.05
    _assert_close_ulp(gemv_triton(x, w), gemv_reference(x, w))


def test_bias_and_strided_rows() -> None:
    x = _randn(4, 2 * 96, dtype=torch.bfloat16, seed=3)[:, :96]  # row stride 192
    w, b = _randn(72, 96, dtype=torch.bfloat16, seed=4) * 0.1, _randn(72, dtype=torch.bfloat16, seed=5)
    _assert_close_ulp(gemv_triton(x, w, b), gemv_reference(x, w, b))


@pytest.mark.parametrize("bias", [False, True])
def test_fused_silu_mul_equals_unfused(bias: bool) -> None:
    x, w = _randn(2, 128, dtype=torch.bfloat16, seed=6), _randn(2 * 48, 128, dtype=torch.bfloat16, seed=7) * 0.1
    b = _randn(2 * 48, dtype=torch.bfloat16, seed=8) if bias else None
    fused = gemv_triton(x, w, b, silu_mul=True)  # [2, 48]
    assert torch.equal(fused, silu_mul_reference(gemv_triton(x, w, b)))


def test_rows_independent_of_batch() -> None:
    x, w = _randn(GEMV_MAX_ROWS, 256, dtype=torch.bfloat16, seed=9), _randn(64, 256, dtype=torch.bfloat16, seed=10)
    batched = gemv_triton(x, w)
    for i in range(GEMV_MAX_ROWS):
        assert torch.equal(gemv_triton(x[i:i + 1], w), batched[i:i + 1])


@pytest.mark.skipif(DEVICE != "cuda", reason="the dispatch rule sends CUDA tensors only")
def test_dispatch_rule() -> None:
    def applies(rows: int, n: int, k: int, dtype: torch.dtype = torch.bfloat16, silu_mul: bool = False) -> bool:
        return gemv_applies(torch.zeros(rows, k, dtype=dtype, device=DEVICE), torch.zeros(n, k, dtype=dtype, device=DEVICE), silu_mul)

    assert applies(1, 4096, 1024) and applies(1, 6144, 1024, silu_mul=True)
    assert applies(GEMV_MAX_ROWS, 1024, 3072) and not applies(2, 4096, 1024) and not applies(2, 6144, 1024, silu_mul=True)
    assert not applies(GEMV_MAX_ROWS + 1, 1024, 3072) and not applies(1, GEMV_MAX_WEIGHT_ROWS + 1, 1024)
    assert not applies(1, 1024, 1024, dtype=torch.float32)
    assert applies(1, GEMV_MAX_WEIGHT_ROWS, 1024, silu_mul=True) and not applies(1, GEMV_MAX_WEIGHT_ROWS + 2, 1024, silu_mul=True)


def test_refuses_what_it_does_not_take() -> None:
    with pytest.raises(ValueError, match="gemv_triton"):
        gemv_triton(_randn(1, 32, dtype=torch.float32, seed=12), _randn(16, 32, dtype=torch.float32, seed=11))
    with pytest.raises(ValueError, match="gemv_triton"):
        gemv_triton(_randn(GEMV_MAX_ROWS + 1, 32, dtype=torch.bfloat16, seed=12), _randn(16, 32, dtype=torch.bfloat16, seed=11))
