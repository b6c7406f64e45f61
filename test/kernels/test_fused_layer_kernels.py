"""The fused Triton layer kernels (RMSNorm with residual add, q/k norm + RoPE + KV store,
silu * up) against their plain-torch references, which are the model's torch path.
TRITON_INTERPRET=1 on a CPU (set before triton is imported), native on CUDA.

Tolerances, in units in the last place (ulp) of the reference in the model dtype. bfloat16: the
kernels round where the torch ops round, so all but rare values match bit for bit (at least 99%
are asserted equal; in the interpreter all are); a float32 statistic differing in its last bit
(row-sum order, torch's non-IEEE rsqrt on some devices) can flip a rounding, so 2 ulp are
allowed (of max(|x|, 1) after a q/k norm, where RoPE can cancel). float32: RMSNorm 4 ulp;
silu and RoPE after a q/k norm 128 ulp (~1.5e-5 relative: the GPU's exp is ex2.approx, and
RoPE's cancellation); RoPE without a norm and the residual sum 1 ulp / exact."""

from __future__ import annotations

import os
from typing import Optional

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from sgl_kernel_ext.activation.reference import silu_mul_reference  # noqa: E402
from sgl_kernel_ext.activation.silu_mul_triton import silu_mul_triton  # noqa: E402
from sgl_kernel_ext.norm.reference import rmsnorm_reference  # noqa: E402
from sgl_kernel_ext.norm.rmsnorm_triton import rmsnorm_triton  # noqa: E402
from sgl_kernel_ext.rotary.reference import rope_store_reference  # noqa: E402
from sgl_kernel_ext.rotary.rope_store_triton import rope_store_triton  # noqa: E402

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
DTYPES = [torch.float32, torch.bfloat16]
_MANTISSA_BITS = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}


def _randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(DEVICE)


def _assert_within_ulps(got: torch.Tensor, want: torch.Tensor, ulps: float, floor: float = 0.0) -> None:
    """|got - want| <= ulps units in the last place of max(|want|, floor), in want's dtype (the
    floor keeps near-cancelled values from demanding more than the inputs' precision); in a
    16-bit dtype also at least 99% of values bit-equal."""
    assert got.shape == want.shape and got.dtype == want.dtype
    if want.dtype != torch.float32:
        assert (got == want).float().mean() >= 0.99
    magnitude = want.double().abs().clamp_min(max(floor, torch.finfo(want.dtype).tiny))
    _, exponent = torch.frexp(magnitude)  # magnitude = m * 2^exponent, m in [0.5, 1)
    ulp = torch.ldexp(torch.ones_like(magnitude), exponent - 1 - _MANTISSA_BITS[want.dtype])
    err = (got.double() - want.double()).abs()
    bad = err > ulps * ulp
    worst = float((err / ulp).max())
    assert not bad.any(), f"{int(bad.sum())}/{bad.numel()} values beyond {ulps} ulp, worst {worst:.2f}"


# ---- RMSNorm --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [576, 13])  # 576: the embedded model's hidden size, not a power of two
@pytest.mark.parametrize("with_residual", [False, True])
def test_rmsnorm_matches_reference(dtype: torch.dtype, hidden: int, with_residual: bool) -> None:
    rows = 7
    x = _randn(rows, hidden, dtype=dtype, seed=hidden, scale=3.0)  # [N, H]
    weight = _randn(hidden, dtype=dtype, seed=1)  # [H]
    residual = _randn(rows, hidden, dtype=dtype, seed=2) if with_residual else None  # [N, H]
    want_residual = None if residual is None else residual.clone()
    x_before = x.clone()
    got = rmsnorm_triton(x, weight, 1e-6, residual)
    want = rmsnorm_reference(x, weight, 1e-6, want_residual)
    _assert_within_ulps(got, want, 4 if dtype == torch.float32 else 2)
    assert torch.equal(x, x_before)
    if with_residual:
        assert torch.equal(residual, want_residual)  # x + residual, written in place and rounded like torch


def test_rmsnorm_takes_strided_rows_and_leading_dims() -> None:
    wide = _randn(5, 2, 40, dtype=torch.bfloat16, seed=3)  # [N, 2, 40] bfloat16
    x = wide[:, :, :24]  # [N, 2, H=24]: strided rows, as a per-head norm sees them
    weight = _randn(24, dtype=torch.bfloat16, seed=4)
    got = rmsnorm_triton(x, weight, 1e-5)
    assert got.shape == x.shape and got.is_contiguous()
    _assert_within_ulps(got, rmsnorm_reference(x, weight, 1e-5), 2)


def test_rmsnorm_rows_do_not_depend_on_the_batch() -> None:
    x = _randn(9, 576, dtype=torch.float32, seed=5)
    weight = _randn(576, dtype=torch.float32, seed=6)
    full = rmsnorm_triton(x, weight, 1e-6)
    assert torch.equal(rmsnorm_triton(x[4:5], weight, 1e-6), full[4:5])
    assert torch.equal(rmsnorm_triton(x.flip(0), weight, 1e-6).flip(0), full)


def test_rmsnorm_rejects_a_mismatched_residual() -> None:
    x = _randn(3, 16, dtype=torch.float32, seed=7)
    with pytest.raises(ValueError, match="residual"):
        rmsnorm_triton(x, torch.ones(16, device=DEVICE), 1e-6, torch.zeros(3, 8, device=DEVICE))


# ---- silu(gate) * up ------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # the interpreter's exp(1e4) = inf, as wanted
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [1536, 13])  # 1536: the embedded model's intermediate size
def test_silu_mul_matches_reference(dtype: torch.dtype, inter: int) -> None:
    gate_up = _randn(5, 2 * inter, dtype=dtype, seed=inter, scale=4.0)  # [N, 2I]
    gate_up[0, :4] = torch.tensor([-1e4, 1e4, -100.0, 0.0])  # silu -> -0, x, -0, 0
    got = silu_mul_triton(gate_up)
    assert got.shape == (5, inter)
    _assert_within_ulps(got, silu_mul_reference(gate_up), 128 if dtype == torch.float32 else 2)


def test_silu_mul_takes_strided_rows() -> None:
    wide = _randn(3, 40, dtype=torch.bfloat16, seed=8)
    gate_up = wide[:, :26]  # [N, 2I = 26], row stride 40
    _assert_within_ulps(silu_mul_triton(gate_up), silu_mul_reference(gate_up), 2)


# ---- q/k norm + RoPE + KV store -------------------------------------------------------------


def _cos_sin_cache(positions: int, head_dim: int) -> torch.Tensor:
    """[P, D] float32 = [cos | sin] of D / 2 frequencies, as layers.rotary.RotaryEmbedding."""
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(positions).float(), inv_freq)  # [P, D / 2]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(DEVICE)


def _rope_inputs(tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, qk_norm: bool,
                 seed: int, pad_cols: int = 0):
    """qkv (with pad_cols extra columns per row, not read), unsorted positions, shuffled slots
    and randomly filled caches."""
    gen = torch.Generator().manual_seed(seed)
    width = (heads + 2 * kv_heads) * head_dim
    qkv = _randn(tokens, width + pad_cols, dtype=dtype, seed=seed, scale=2.0)  # [N, (Hq + 2 Hk) * D + pad]
    table_len, slots = 300, 40
    positions = torch.randperm(table_len, generator=gen)[:tokens].to(DEVICE)  # [N] int64, not sorted
    loc = torch.randperm(slots, generator=gen)[:tokens].to(DEVICE)  # [N] int64, shuffled
    k_buf = _randn(slots, kv_heads, head_dim, dtype=dtype, seed=seed + 1)  # [S, Hk, D]
    v_buf = _randn(slots, kv_heads, head_dim, dtype=dtype, seed=seed + 2)  # [S, Hk, D]
    norms: dict[str, Optional[torch.Tensor]] = {}
    if qk_norm:
        norms = dict(q_norm_weight=_randn(head_dim, dtype=dtype, seed=seed + 3),
                     k_norm_weight=_randn(head_dim, dtype=dtype, seed=seed + 4), eps=1e-6)
    return qkv, positions, _cos_sin_cache(table_len, head_dim), loc, k_buf, v_buf, norms


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,heads,kv_heads,head_dim", [(5, 9, 3, 64), (3, 16, 8, 128)])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_store_matches_reference(
    dtype: torch.dtype, tokens: int, heads: int, kv_heads: int, head_dim: int, qk_norm: bool
) -> None:
    qkv, positions, table, loc, k_buf, v_buf, norms = _rope_inputs(
        tokens, heads, kv_heads, head_dim, dtype, qk_norm, seed=heads + head_dim, pad_cols=8 if qk_norm else 0
    )
    qkv_before, k_want, v_want = qkv.clone(), k_buf.clone(), v_buf.clone()
    got_q = rope_store_triton(qkv, heads, positions, table, loc, k_buf, v_buf, **norms)
    want_q = rope_store_reference(qkv, heads, positions, table, loc, k_want, v_want, **norms)
    assert got_q.shape == (tokens, heads, head_dim) and got_q.is_contiguous()
    assert torch.equal(qkv, qkv_before)  # q goes to its own tensor
    if not qk_norm:
        ulps, floor = 1, 0.0  # the same roundings and one FMA: exact but for the FMA on some devices
    else:
        ulps, floor = (128, 1.0) if dtype == torch.float32 else (2, 1.0)
    _assert_within_ulps(got_q, want_q, ulps, floor)
    _assert_within_ulps(k_buf, k_want, ulps, floor)
    assert torch.equal(v_buf, v_want)  # a copy
    untouched = torch.ones(k_buf.shape[0], dtype=torch.bool, device=DEVICE)
    untouched[loc] = False
    assert torch.equal(k_buf[untouched], k_want[untouched]) and torch.equal(v_buf[untouched], v_want[untouched])


def test_rope_store_head_dim_not_a_power_of_two() -> None:
    qkv, positions, table, loc, k_buf, v_buf, norms = _rope_inputs(3, 2, 1, 80, torch.bfloat16, True, seed=9)
    k_want, v_want = k_buf.clone(), v_buf.clone()
    got_q = rope_store_triton(qkv, 2, positions, table, loc, k_buf, v_buf, **norms)
    _assert_within_ulps(got_q, rope_store_reference(qkv, 2, positions, table, loc, k_want, v_want, **norms), 2, 1.0)
    _assert_within_ulps(k_buf, k_want, 2, 1.0)
    assert torch.equal(v_buf, v_want)


def test_rope_store_rows_do_not_depend_on_the_batch() -> None:
    qkv, positions, table, loc, k_buf, v_buf, norms = _rope_inputs(4, 4, 2, 64, torch.float32, True, seed=10)
    full = rope_store_triton(qkv, 4, positions, table, loc, k_buf, v_buf, **norms)
    k_full = k_buf.clone()
    k_buf.zero_()
    alone = rope_store_triton(qkv[2:3], 4, positions[2:3], table, loc[2:3], k_buf, v_buf, **norms)
    assert torch.equal(alone[0], full[2]) and torch.equal(k_buf[loc[2]], k_full[loc[2]])


def test_rope_store_rejects_bad_arguments() -> None:
    qkv, positions, table, loc, k_buf, v_buf, norms = _rope_inputs(2, 2, 1, 64, torch.float32, True, seed=11)
    with pytest.raises(ValueError, match="both"):
        rope_store_triton(qkv, 2, positions, table, loc, k_buf, v_buf, q_norm_weight=norms["q_norm_weight"])
    with pytest.raises(ValueError, match="cos_sin_cache"):
        rope_store_triton(qkv, 2, positions, table[:, :32], loc, k_buf, v_buf)
    with pytest.raises(ValueError, match="fewer"):
        rope_store_triton(qkv[:, :-1], 2, positions, table, loc, k_buf, v_buf)
