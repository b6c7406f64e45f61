"""The int8-activation mode's SiLU(gate) * up (sgl_kernel_ext/activation/silu_mul_cpu.c): within a
few ulp of SiLU computed in float64, the AVX2 and portable builds equal bit for bit, NaN kept. That
the model's op-by-op MLP runs it in that mode is test_decode_layer_cpu's logits equality."""

from __future__ import annotations

import ctypes

import pytest
import torch

import sgl_kernel_ext.activation.silu_mul_cpu as cpu_silu
from sgl_kernel_ext.activation.reference import silu_mul_reference
from sgl_kernel_ext.activation.silu_mul_cpu import silu_mul_cpu
from sgl_kernel_ext.cpu_build import load_kernel

if not cpu_silu.silu_mul_cpu_available():
    pytest.skip("no working C compiler: the CPU kernel is not built", allow_module_level=True)

PORTABLE = load_kernel(*cpu_silu._KERNEL, defines=("PORTABLE_ONLY",))


def portable(gate_up: torch.Tensor) -> torch.Tensor:
    act = torch.empty(gate_up.shape[0], gate_up.shape[1] // 2)
    PORTABLE(gate_up.contiguous().data_ptr(), gate_up.shape[0], gate_up.shape[1] // 2, act.data_ptr(), 1)
    return act


def gates(values: torch.Tensor) -> torch.Tensor:
    """[1, 2n]: the gates `values`, every up 1, so the output is SiLU itself."""
    return torch.cat([values, torch.ones_like(values)]).view(1, -1)


def test_within_a_few_ulp_of_silu() -> None:
    g = torch.linspace(-87.0, 90.0, 400_003)  # an odd count: the AVX2 build's scalar tail runs too
    got = silu_mul_cpu(gates(g))[0].double()
    exact = g.double() * torch.sigmoid(g.double())
    ulp = (torch.nextafter(exact.float(), torch.tensor(float("inf"))).double() - exact.float().double()).abs()
    assert ((got - exact).abs() <= 2.5 * ulp).all()
    # Down to where exp(-g) overflows the result is SiLU within its own tiny size (from -88.4 it
    # is -0 already); beyond, -0 as torch's (its exp overflows to inf there), -inf gives NaN.
    deep = torch.linspace(-88.72, -87.0, 1001)
    assert (silu_mul_cpu(gates(deep)).abs() < 1e-35).all()
    beyond = torch.tensor([-89.0, -100.0, -2000.0, -1e30, -3e38, float("-inf")])
    for got in (silu_mul_cpu(gates(beyond)), portable(gates(beyond))):
        torch.testing.assert_close(got[0], torch.nn.functional.silu(beyond), rtol=0, atol=0, equal_nan=True)
        assert torch.equal(torch.signbit(got[0, :5]), torch.ones(5, dtype=torch.bool))


def test_gate_times_up_and_torch_close() -> None:
    gate_up = torch.randn(5, 2 * 203, generator=torch.Generator().manual_seed(0)) * 4
    torch.testing.assert_close(silu_mul_cpu(gate_up), silu_mul_reference(gate_up.clone()), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rows,width", [(3, 1), (3, 8), (3, 13), (3, 1536), (50, 1536)])  # 50 rows: threaded
def test_portable_build_gives_the_same_bits(rows, width) -> None:
    gate_up = torch.randn(rows, 2 * width, generator=torch.Generator().manual_seed(width)) * 10
    assert torch.equal(silu_mul_cpu(gate_up), portable(gate_up))


def test_nan_gates_stay_nan() -> None:
    gate_up = gates(torch.tensor([float("nan"), 1.0, float("nan"), -3.0, 0.5, 2.0, 7.0, 1.0, float("nan")]))
    for got in (silu_mul_cpu(gate_up), portable(gate_up)):
        assert torch.equal(torch.isnan(got[0]), torch.isnan(gate_up[0, :9]))


def test_native_build_uses_avx2_where_the_cpu_has_it() -> None:
    """Else the bit-equality above would compare the portable build with itself."""
    with open("/proc/cpuinfo") as f:
        flags = next((line.split() for line in f if line.startswith("flags")), [])
    if not {"avx2", "fma"} <= set(flags):
        pytest.skip("this CPU has no AVX2 / FMA")
    assert load_kernel(cpu_silu._KERNEL[0], "silu_mul_uses_avx2", (), ctypes.c_int)() == 1


def test_refuses_what_it_cannot_read() -> None:
    with pytest.raises(ValueError, match=r"float32 CPU tensor \[N, 2I\]"):
        silu_mul_cpu(torch.zeros(2, 5))
