"""The CPU sampler's window kernels (sgl_kernel_ext/sampling/window_cpu.c): thresholds and
inverse-CDF draws equal to the torch code they replace (support._support_in_torch,
sampling_ops.inverse_cdf_draw_torch), on random windows, windows full of ties and rows holding
NaN / inf, so that the sampler's tokens do not change with the path that computed them."""

from __future__ import annotations

import pytest
import torch

import sgl_kernel_ext.sampling.support as support
from sgl_kernel_ext.sampling.window_cpu import window_cpu_applies, window_draw_cpu
from sglang.srt.layers.sampling_ops import inverse_cdf_draw_torch

if not window_cpu_applies(torch.zeros(1, 1)):
    pytest.skip("no working C compiler: the CPU kernel is not built", allow_module_level=True)

VOCAB = 3000


def logits(kind: str, rows: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if kind == "ties":
        return torch.randint(0, 6, (rows, VOCAB), generator=gen).float() / 2
    x = torch.randn(rows, VOCAB, generator=gen) * 3
    if kind == "special":
        x[0, 10] = float("nan")
        x[1, :] = float("-inf")
        x[2, 5] = float("inf")
    return x


def row_params(rows: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return dict(
        top_ks=torch.randint(1, 80, (rows,), generator=gen, dtype=torch.int32).index_fill_(0, torch.tensor([0]), VOCAB),
        top_ps=torch.rand(rows, generator=gen).index_fill_(0, torch.tensor([1]), 1.0),
        log_min_ps=torch.log(torch.rand(rows, generator=gen) * 0.2).index_fill_(0, torch.tensor([2]), float("-inf")),
    )


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values: NaN equals NaN whatever its payload, -0 equals +0 (torch.maximum's own bits
    for those differ between its scalar and vectorised loops, i.e. with the batch size)."""
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


@pytest.mark.parametrize("kind", ["random", "ties", "special"])
@pytest.mark.parametrize("width", [1, 51, 513])
@pytest.mark.parametrize("filters", [(False, False), (True, False), (False, True), (True, True)], ids=["k", "k+p", "k+minp", "all"])
@pytest.mark.parametrize("rows", [6, 17])  # 17: torch's vectorised loops
def test_thresholds_equal_the_torch_code(kind, width, filters, rows) -> None:
    need_top_p, need_min_p = filters
    scaled = logits(kind, rows, seed=width)
    params = row_params(rows, seed=width + 1)
    vals, idx = torch.topk(scaled, width, dim=-1)
    args = (params["top_ks"], params["top_ps"], params["log_min_ps"], need_top_p, need_min_p)
    c_support, c_exact = support._support_in(scaled, vals, idx, support.Rule(*args))
    t_support, t_exact = support._support_in_torch(scaled, vals, idx, support.Rule(*args))
    assert same_values(c_support.threshold, t_support.threshold)
    assert torch.equal(c_exact, t_exact)


@pytest.mark.parametrize("kind", ["random", "ties", "special"])
@pytest.mark.parametrize("width", [1, 51, VOCAB])
def test_draws_equal_the_torch_code(kind, width) -> None:
    """Many u per row, thresholds from the window's own values (some keeping one column, some
    all, some none: a -inf row, a NaN threshold)."""
    gen = torch.Generator().manual_seed(width)
    values = torch.topk(logits(kind, 6, seed=width + 2), width, dim=-1).values
    for trial in range(40):
        cut = torch.randint(0, width, (6, 1), generator=gen)
        threshold = values.gather(1, cut)
        threshold[3] = float("nan") if trial % 2 else float("-inf")
        u = 1.0 - torch.rand(6, 1, generator=gen)
        assert torch.equal(window_draw_cpu(values, threshold, u), inverse_cdf_draw_torch(values, threshold, u))


def test_draws_at_the_cdf_boundaries_equal_the_torch_code() -> None:
    """u placed exactly on each column's cumulative share, where a sum in another precision or
    order would move the pick by one column."""
    values = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.15, 0.25, 1e-8, 0.0]])).sort(descending=True).values
    threshold = torch.full((1, 1), float("-inf"))
    weights = torch.exp(values - values.amax(dim=-1, keepdim=True))
    cdf = torch.cumsum(weights, dim=-1)
    for j in range(values.shape[1]):
        for u in (cdf[0, j] / cdf[0, -1], torch.nextafter(cdf[0, j] / cdf[0, -1], torch.tensor(0.0))):
            u = u.clamp(max=1.0).reshape(1, 1)
            assert torch.equal(window_draw_cpu(values, threshold, u), inverse_cdf_draw_torch(values, threshold, u))


def test_top_p_at_the_mass_boundaries_equals_the_torch_code() -> None:
    """top_p placed on (and one float step above) the mass before a column, as the torch code sums
    it in double: a sum kept in float32, or in another order, moves the boundary in some rows.
    Finite rows: here the thresholds are the same bits."""
    gen = torch.Generator().manual_seed(7)
    rows, width = 64, 513
    scaled = torch.randn(rows, VOCAB, generator=gen) * 2
    vals, idx = torch.topk(scaled, width, dim=-1)
    probs = support._softmax_at(scaled, idx).double()
    before = torch.cumsum(probs, dim=-1) - probs  # [rows, width]
    cols = torch.randint(1, width, (rows, 1), generator=gen)
    top_ps = before.gather(1, cols).squeeze(1).float()
    top_ps[::2] = torch.nextafter(top_ps[::2], torch.tensor(1.0))
    args = (torch.full((rows,), VOCAB, dtype=torch.int32), top_ps, None, True, False)
    c_support, c_exact = support._support_in(scaled, vals, idx, support.Rule(*args))
    t_support, t_exact = support._support_in_torch(scaled, vals, idx, support.Rule(*args))
    assert torch.equal(c_support.threshold.view(torch.int32), t_support.threshold.view(torch.int32))
    assert torch.equal(c_exact, t_exact)


def test_draws_on_a_long_row_at_the_cdf_boundaries_equal_the_torch_code() -> None:
    gen = torch.Generator().manual_seed(8)
    values = torch.randn(1, VOCAB, generator=gen) * 2
    threshold = torch.full((1, 1), float("-inf"))
    cdf = torch.cumsum(torch.exp(values - values.amax(dim=-1, keepdim=True)), dim=-1)
    for j in torch.randint(0, VOCAB, (200,), generator=gen).tolist():
        u = (cdf[0, j] / cdf[0, -1]).reshape(1, 1)
        for candidate in (u, torch.nextafter(u, torch.zeros(1, 1)), torch.nextafter(u, torch.ones(1, 1))):
            candidate = candidate.clamp(max=1.0)
            assert torch.equal(window_draw_cpu(values, threshold, candidate), inverse_cdf_draw_torch(values, threshold, candidate))
