"""The kl_symmetry alpha kernel (sgl_kernel_ext/sampling/kl_alpha_triton.py) against its torch
reference (kl_alpha_reference.py): TRITON_INTERPRET=1 on a CPU (set before triton is imported),
native on CUDA. Both bisect the same monotone function, so their alphas agree to within the
bisection's resolution; the kernel's alpha also satisfies KL(q || pc) = KL(q || pg) itself."""

from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from sgl_kernel_ext.sampling.kl_alpha_reference import KL_BISECTION_TOL, kl_alpha_reference  # noqa: E402
from sgl_kernel_ext.sampling.kl_alpha_triton import BLOCK, kl_alpha_triton  # noqa: E402

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
NEG_INF = -math.inf


def _rows(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """lc, diff ([8, V] float32): random rows; tokens both contexts rule out; tokens only the main
    context rules out (diff = +inf); tokens only the guide rules out (diff = -inf); a peaked main
    row; equal contexts (diff = 0); a guide that rules out everything but one token; a main row
    whose only survivors sit in the last block."""
    gen = torch.Generator().manual_seed(seed)
    main = torch.randn(8, vocab, generator=gen) * 3  # [8, V]
    guide = torch.randn(8, vocab, generator=gen) * 3  # [8, V]
    main[1, ::3] = NEG_INF
    guide[1, ::3] = NEG_INF
    main[2, 1::4] = NEG_INF
    guide[3, 2::5] = NEG_INF
    main[4, 7] = 40.0
    guide[5] = main[5]
    guide[6] = NEG_INF
    guide[6, 11] = 0.0
    main[7, : vocab - 3] = NEG_INF
    lc, lg = torch.log_softmax(main, -1), torch.log_softmax(guide, -1)
    return lc.to(DEVICE), (lg - lc).to(DEVICE)


def _kl_gap(lc: torch.Tensor, lg: torch.Tensor, a: float) -> tuple[float, float]:
    """KL(q || pc) - KL(q || pg) at alpha a, and its slope's magnitude Var_q(lg - lc) (float64,
    over the tokens q can reach)."""
    live = torch.isfinite(lc) & torch.isfinite(lg)
    lc, lg = lc[live].double(), lg[live].double()
    q = torch.softmax(a * lc + (1 - a) * lg, -1)
    d = lg - lc
    return float((q * d).sum()), float((q * d * d).sum() - (q * d).sum() ** 2)


@pytest.mark.parametrize("vocab", [257, BLOCK + 5, 3 * BLOCK])
def test_kernel_alphas_match_the_reference(vocab):
    lc, diff = _rows(vocab, seed=vocab)
    got = kl_alpha_triton(lc, diff).cpu()
    want = kl_alpha_reference(lc.cpu(), diff.cpu())
    assert got.shape == want.shape == (8, 1)
    assert torch.all((got - want).abs() <= 2 * KL_BISECTION_TOL), (got.squeeze(1), want.squeeze(1))
    lg = (lc + diff).cpu()  # +inf where only the main context rules a token out; unreachable either way
    for i in (0, 1, 3, 4):  # rows whose root lies inside (0, 1)
        gap, slope = _kl_gap(lc[i].cpu(), lg[i], got[i].item())
        assert abs(gap) <= slope * KL_BISECTION_TOL + 1e-7, (i, gap, slope)
    assert got[5].item() < KL_BISECTION_TOL  # equal contexts: every alpha is a root, the bisection runs to 0
    assert 0.01 < got[[0, 1, 3, 4]].min() and got[[0, 1, 3, 4]].max() < 0.99


def test_rows_are_independent_of_the_batch():
    lc, diff = _rows(BLOCK + 5, seed=4)
    batched = kl_alpha_triton(lc, diff)
    for i in range(8):
        assert torch.equal(kl_alpha_triton(lc[i : i + 1], diff[i : i + 1]), batched[i : i + 1])
    assert kl_alpha_triton(lc[:0], diff[:0]).shape == (0, 1)
