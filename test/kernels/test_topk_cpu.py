"""The CPU sampler's window kernel (sgl_kernel_ext/sampling/topk_cpu.c): the k largest values of
each row, descending, NaN first and ties by column, exactly as its reference (a stable descending
sort) in the AVX2 and portable builds; and the sampler's support computed from it."""

from __future__ import annotations

import ctypes

import pytest
import torch

import sgl_kernel_ext.sampling.topk_cpu as cpu_topk
from sgl_kernel_ext.cpu_build import load_kernel
from sgl_kernel_ext.sampling.support import compute_support
from sgl_kernel_ext.sampling.topk_cpu import topk_cpu, topk_reference

if not cpu_topk.topk_cpu_applies(torch.zeros(1, 1)):
    pytest.skip("no working C compiler: the CPU kernel is not built", allow_module_level=True)

PORTABLE = load_kernel(*cpu_topk._KERNEL, defines=("PORTABLE_ONLY",))


def portable_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    vals, idx = torch.empty(x.shape[0], k), torch.empty(x.shape[0], k, dtype=torch.int64)
    PORTABLE(x.data_ptr(), x.shape[0], x.shape[1], k, vals.data_ptr(), idx.data_ptr(), 1)
    return vals, idx


def rows(kind: str, shape: tuple[int, int], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if kind == "random":
        return torch.randn(*shape, generator=gen)
    if kind == "ties":  # few distinct values: most of the window is ties
        return torch.randint(0, 5, shape, generator=gen).float()
    if kind == "ascending":  # every column enters the heap
        return torch.arange(shape[1], dtype=torch.float32).repeat(shape[0], 1)
    x = torch.randn(*shape, generator=gen)  # special values
    x[:, 3::17] = float("nan")
    x[:, 5::23] = float("inf")
    x[:, 7::29] = float("-inf")
    x[:, 11::31] = -0.0
    return x


def same(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> bool:
    return torch.equal(got[1], want[1]) and torch.equal(got[0].view(torch.int32), want[0].view(torch.int32))


@pytest.mark.parametrize("kind", ["random", "ties", "ascending", "special"])
@pytest.mark.parametrize("shape,k", [((1, 49152), 51), ((3, 1000), 1), ((2, 100), 100), ((4, 4099), 513), ((2, 13), 5)])
def test_equals_a_stable_descending_sort(kind, shape, k) -> None:
    x = rows(kind, shape, seed=shape[1] + k)
    want = topk_reference(x, k)
    assert same(topk_cpu(x, k), want)
    assert same(portable_topk(x, k), want)


def test_native_build_uses_avx2_where_the_cpu_has_it() -> None:
    with open("/proc/cpuinfo") as f:
        flags = next((line.split() for line in f if line.startswith("flags")), [])
    if "avx2" not in flags:
        pytest.skip("this CPU has no AVX2")
    assert load_kernel(cpu_topk._KERNEL[0], "topk_uses_avx2", (), ctypes.c_int)() == 1


def test_refuses_what_it_cannot_read() -> None:
    with pytest.raises(ValueError, match="1 <= k <= N"):
        topk_cpu(torch.zeros(2, 5), 6)
    with pytest.raises(ValueError, match="float32 CPU tensor"):
        topk_cpu(torch.zeros(2, 5, dtype=torch.float64), 2)


def test_support_thresholds_are_those_of_a_full_sort() -> None:
    """The sampler's thresholds from the kernel's window equal those of the full sort path."""
    gen = torch.Generator().manual_seed(3)
    scaled = torch.randn(6, 2000, generator=gen) * 2
    scaled[1, :40] = scaled[1, 0]  # a tie across the top-k boundary
    top_ks = torch.tensor([5, 50, 30, 1, 20, 50], dtype=torch.int32)
    top_ps = torch.tensor([1.0, 0.9, 0.5, 1.0, 0.3, 0.99])
    min_ps = torch.tensor([0.0, 0.0, 0.1, 0.0, 0.05, 0.0])
    args = dict(need_top_p=True, need_min_p=True)
    windowed = compute_support(scaled, top_ks, top_ps, min_ps, window=50, **args)
    full = compute_support(scaled, top_ks, top_ps, min_ps, window=None, **args)
    assert windowed.vals.shape[1] == 51 and full.is_full
    assert torch.equal(windowed.threshold, full.threshold)
