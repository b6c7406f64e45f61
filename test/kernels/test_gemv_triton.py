"""gemv_triton (a decode step's few rows times a weight) against its plain-torch reference.
TRITON_INTERPRET=1 on a CPU (set before triton is imported), native on CUDA.

The kernel and the reference both sum in float32, in different orders, then round to the model
dtype: results agree within one unit in the last place (of the mean output magnitude where an
output nearly cancels), nearly all bit for bit. The fused
silu(gate) * up equals the unfused kernel's matmul followed by the reference activation to the
bit, and a row's result does not depend on the other rows of the call.

With the norm prologue, the kernel multiplies the products of rmsnorm_triton followed by the plain
kernel; only the order of the row's sum of squares may differ (one float32 ulp of rstd), so the
fused result is within one ulp of the two launches, nearly all bit for bit, and the residual sum
it writes is torch's x + residual exactly."""

from __future__ import annotations

import os
from typing import Optional

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from sgl_kernel_ext.activation.reference import silu_mul_reference  # noqa: E402
from sgl_kernel_ext.gemm.gemv_reference import gemv_reference  # noqa: E402
from sgl_kernel_ext.gemm.gemv_triton import (  # noqa: E402
    GEMV_MAX_WEIGHT_ROWS,
    GEMV_MAX_ROWS,
    NORM_MAX_BLOCK,
    gemv_applies,
    gemv_triton,
)
from sgl_kernel_ext.norm.rmsnorm_triton import rmsnorm_triton  # noqa: E402

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
_MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10}
# (N, K): tiles with a partial column block and a partial K tile, and the shapes of Qwen3-0.6B's linears.
SHAPES = [(40, 72), (96, 256), (300, 520)] if DEVICE == "cpu" else [(40, 72), (4096, 1024), (1024, 2048), (1024, 3072), (6144, 1024)]
# (N, K) of the norm prologue: a partial K tile, and on CUDA Qwen3-0.6B's qkv and gate | up.
NORM_SHAPES = [(40, 72), (96, 520)] if DEVICE == "cpu" else [(40, 72), (4096, 1024), (6144, 1024)]


def _randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    """Scaled on the host: a weight written by the kernel just before gemv_triton would break its
    contract (it loads the first weight tile before waiting for that kernel under PDL)."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(DEVICE)


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
    x, w = _randn(rows, k, dtype=dtype, seed=1), _randn(n, k, dtype=dtype, seed=2, scale=0.05)
    _assert_close_ulp(gemv_triton(x, w), gemv_reference(x, w))


def test_bias_and_strided_rows() -> None:
    x = _randn(4, 2 * 96, dtype=torch.bfloat16, seed=3)[:, :96]  # row stride 192
    w, b = _randn(72, 96, dtype=torch.bfloat16, seed=4, scale=0.1), _randn(72, dtype=torch.bfloat16, seed=5)
    _assert_close_ulp(gemv_triton(x, w, b), gemv_reference(x, w, b))


@pytest.mark.parametrize("bias", [False, True])
def test_fused_silu_mul_equals_unfused(bias: bool) -> None:
    x, w = _randn(2, 128, dtype=torch.bfloat16, seed=6), _randn(2 * 48, 128, dtype=torch.bfloat16, seed=7, scale=0.1)
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


def _norm_inputs(rows: int, n: int, k: int, dtype: torch.dtype, with_residual: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """x [M, K], weight [N, K], norm weight [K], residual [M, K] or None."""
    x = _randn(rows, k, dtype=dtype, seed=20) * 3.0
    weight = _randn(n, k, dtype=dtype, seed=21, scale=0.05)
    norm_weight = _randn(k, dtype=dtype, seed=22)
    return x, weight, norm_weight, _randn(rows, k, dtype=dtype, seed=23) if with_residual else None


def _fused_and_separate(
    x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor, residual: Optional[torch.Tensor], silu_mul: bool
) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """(the fused launch's output, the residual sum it wrote, rmsnorm_triton then gemv_triton);
    asserts that x and the residual stay unchanged."""
    x_before, res_before = x.clone(), None if residual is None else residual.clone()
    residual_out = None if residual is None else torch.empty_like(residual)  # [M, K]
    fused = gemv_triton(x, weight, silu_mul=silu_mul, norm_weight=norm_weight, eps=1e-6, residual=residual,
                        residual_out=residual_out)
    assert torch.equal(x, x_before) and (residual is None or torch.equal(residual, res_before))
    separate_res = None if residual is None else residual.clone()  # rmsnorm_triton adds into it
    separate = gemv_triton(rmsnorm_triton(x, norm_weight, 1e-6, separate_res), weight, silu_mul=silu_mul)
    return fused, residual_out, separate


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("silu_mul", [False, True])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("rows", [1, GEMV_MAX_ROWS])
@pytest.mark.parametrize("shape", NORM_SHAPES)
def test_norm_prologue_equals_norm_then_gemv(
    shape: tuple[int, int], rows: int, with_residual: bool, silu_mul: bool, dtype: torch.dtype
) -> None:
    n, k = shape
    x, weight, norm_weight, residual = _norm_inputs(rows, n, k, dtype, with_residual)
    fused, residual_out, separate = _fused_and_separate(x, weight, norm_weight, residual, silu_mul)
    assert fused.shape == (rows, n // 2 if silu_mul else n)
    _assert_close_ulp(fused, separate)
    # The interpreter sums the squares of a row in one numpy sum in both kernels: no order to differ.
    assert DEVICE != "cpu" or torch.equal(fused, separate)
    if with_residual:
        assert torch.equal(residual_out, x + residual)  # torch rounds the model-dtype sum once


def test_norm_prologue_rows_independent_of_batch() -> None:
    """Three rows (one padding row in the kernel): each row's result and residual sum alone equal
    its batched ones to the bit."""
    x, weight, norm_weight, residual = _norm_inputs(3, 40, 72, torch.bfloat16, True)
    batched_res = torch.empty_like(residual)  # [3, K]
    batched = gemv_triton(x, weight, norm_weight=norm_weight, residual=residual, residual_out=batched_res)
    for i in range(3):
        alone_res = torch.empty_like(residual[i:i + 1])  # [1, K]
        alone = gemv_triton(x[i:i + 1], weight, norm_weight=norm_weight, residual=residual[i:i + 1],
                            residual_out=alone_res)
        assert torch.equal(alone, batched[i:i + 1]) and torch.equal(alone_res, batched_res[i:i + 1])


def test_norm_prologue_over_several_row_blocks() -> None:
    """A row wider than NORM_MAX_BLOCK is summed block by block: still within one ulp."""
    x, weight, norm_weight, residual = _norm_inputs(2, 8, NORM_MAX_BLOCK + 72, torch.bfloat16, True)
    fused, residual_out, separate = _fused_and_separate(x, weight, norm_weight, residual, False)
    _assert_close_ulp(fused, separate)
    assert torch.equal(residual_out, x + residual)


@pytest.mark.parametrize("with_residual", [False, True])
def test_norm_prologue_matches_reference(with_residual: bool) -> None:
    x, weight, norm_weight, residual = _norm_inputs(3, 96, 520, torch.bfloat16, with_residual)
    bias = _randn(96, dtype=torch.bfloat16, seed=24)
    outs = [None if residual is None else torch.empty_like(residual) for _ in range(2)]  # [M, K] each
    norm = dict(norm_weight=norm_weight, eps=1e-5, residual=residual)
    got = gemv_triton(x, weight, bias, **norm, residual_out=outs[0])
    _assert_close_ulp(got, gemv_reference(x, weight, bias, **norm, residual_out=outs[1]))
    assert with_residual is False or torch.equal(outs[0], outs[1])


def test_norm_prologue_refuses_bad_arguments() -> None:
    x, weight, norm_weight, residual = _norm_inputs(2, 16, 32, torch.bfloat16, True)
    with pytest.raises(ValueError, match="residual needs norm_weight"):
        gemv_triton(x, weight, residual=residual, residual_out=torch.empty_like(residual))
    with pytest.raises(ValueError, match="both or neither"):
        gemv_triton(x, weight, norm_weight=norm_weight, residual=residual)
    with pytest.raises(ValueError, match="apart from x and residual"):
        gemv_triton(x, weight, norm_weight=norm_weight, residual=residual, residual_out=residual)
    with pytest.raises(ValueError, match="norm takes"):
        gemv_triton(x, weight, norm_weight=norm_weight.float())


def test_refuses_what_it_does_not_take() -> None:
    with pytest.raises(ValueError, match="gemv_triton"):
        gemv_triton(_randn(1, 32, dtype=torch.float32, seed=12), _randn(16, 32, dtype=torch.float32, seed=11))
    with pytest.raises(ValueError, match="gemv_triton"):
        gemv_triton(_randn(GEMV_MAX_ROWS + 1, 32, dtype=torch.bfloat16, seed=12), _randn(16, 32, dtype=torch.bfloat16, seed=11))
