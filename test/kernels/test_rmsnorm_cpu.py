"""The CPU RMSNorm kernel (C) against its plain-torch reference (transformers' formula), with and
without the fused residual add, and the model's RMSNorm module taking it."""

from __future__ import annotations

import pytest
import torch

from sgl_kernel_ext.norm.rmsnorm_cpu import rmsnorm_cpu, rmsnorm_cpu_applies, rmsnorm_reference
from sglang.srt.layers.layernorm import RMSNorm

if not rmsnorm_cpu_applies(torch.zeros(1, 8), torch.zeros(8)):
    pytest.skip("no working C compiler: the CPU kernel is not built", allow_module_level=True)


@pytest.mark.parametrize("rows,hidden", [(1, 576), (16, 576), (3, 13), (200, 1024)])  # 200 x 1024: threaded
@pytest.mark.parametrize("with_residual", [False, True])
def test_matches_reference(rows, hidden, with_residual) -> None:
    gen = torch.Generator().manual_seed(rows * hidden)
    x = torch.randn(rows, hidden, generator=gen) * 3
    weight = torch.randn(hidden, generator=gen)
    residual = torch.randn(rows, hidden, generator=gen) if with_residual else None
    want_residual = None if residual is None else residual.clone()
    want = rmsnorm_reference(x, weight, 1e-5, want_residual)
    got = rmsnorm_cpu(x, weight, 1e-5, residual)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if with_residual:
        assert torch.equal(residual, want_residual)  # the sum, written in place


def test_module_returns_the_sum_as_next_residual() -> None:
    norm = RMSNorm(64, 1e-6)
    norm.weight.data.copy_(torch.linspace(0.5, 1.5, 64))
    x, residual = torch.randn(4, 64), torch.randn(4, 64)
    expected_sum = x + residual
    out, new_residual = norm(x, residual)
    assert torch.equal(new_residual, expected_sum)
    torch.testing.assert_close(out, rmsnorm_reference(expected_sum, norm.weight.data, 1e-6), rtol=1e-5, atol=1e-6)


def test_layouts_it_cannot_take_fall_back() -> None:
    x = torch.randn(4, 64)
    assert not rmsnorm_cpu_applies(x.t(), torch.ones(4))
    assert not rmsnorm_cpu_applies(x.double(), torch.ones(64))
    with pytest.raises(ValueError, match="residual"):
        rmsnorm_cpu(x, torch.ones(64), 1e-6, torch.randn(4, 32))
