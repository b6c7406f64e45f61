"""The split-KV decode and the paged extend attention kernels against their plain-torch references.
TRITON_INTERPRET=1 on a CPU (set before triton is imported), native on CUDA."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from sgl_kernel_ext.attention.paged_decode import (  # noqa: E402
    BLOCK_N,
    decode_workspace,
    default_num_kv_splits,
    paged_decode_attention,
)
from sgl_kernel_ext.attention.paged_extend import BLOCK_M, paged_extend_attention  # noqa: E402
from sgl_kernel_ext.attention.paged_extend import BLOCK_N as EXTEND_BLOCK_N  # noqa: E402
from sgl_kernel_ext.attention.reference import decode_attention_reference, extend_attention_reference  # noqa: E402
from paged_kv_utils import paged_kv_cache  # noqa: E402

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
HEAD_DIM = 16


def _tol(dtype: torch.dtype) -> float:
    return 1e-5 if dtype == torch.float32 else 2e-2


def _cache(num_kv_heads: int, head_dim: int, lens: list[int], dtype: torch.dtype, seed: int = 0):
    return tuple(t.to(DEVICE) for t in paged_kv_cache(num_kv_heads, head_dim, lens, dtype, seed))


def _randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


# --- decode -------------------------------------------------------------------------------------

# Block edges, shorter than the split count, and one spanning several blocks of every split.
DECODE_LENS = [1, BLOCK_N - 1, BLOCK_N, BLOCK_N + 1, 3, 7 * 2 * BLOCK_N + 5]


def _decode(q, k, v, r2t, pool, seq_lens, splits: int, **kw) -> torch.Tensor:
    return paged_decode_attention(q, k, v, r2t, pool, seq_lens, q.shape[-1] ** -0.5, num_kv_splits=splits, **kw)


F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


# GQA groups 1, 2, 3, 4, 8 over fp32, bf16 and fp16, with 1, 4 and 7 splits (not the full product: the
# interpreter is slow).
@pytest.mark.parametrize(
    "heads,kv_heads,dtype,splits",
    [(4, 4, F32, 1), (4, 4, F32, 7), (8, 4, F32, 4), (9, 3, F32, 1), (9, 3, F32, 4), (9, 3, F32, 7),
     (8, 1, F32, 7), (8, 2, BF16, 4), (9, 3, BF16, 7), (8, 1, BF16, 1), (6, 3, F16, 4)],
)
def test_decode_matches_reference(heads: int, kv_heads: int, dtype: torch.dtype, splits: int) -> None:
    k, v, r2t, pool, seq_lens = _cache(kv_heads, HEAD_DIM, DECODE_LENS, dtype)
    q = _randn(len(DECODE_LENS), heads, HEAD_DIM, dtype=dtype)
    got = _decode(q, k, v, r2t, pool, seq_lens, splits)
    want = decode_attention_reference(q, k, v, r2t, pool, seq_lens, HEAD_DIM**-0.5)
    assert got.shape == q.shape and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), atol=_tol(dtype), rtol=_tol(dtype))


# Windows of one position, inside a block, across blocks and splits, and past every length; a cap.
@pytest.mark.parametrize(
    "window,cap,splits,dtype",
    [(1, None, 4, F32), (5, 0.5, 7, F32), (BLOCK_N + 3, None, 4, F32), (3 * BLOCK_N + 1, 0.5, 7, F32),
     (10_000, 0.5, 1, F32), (BLOCK_N + 3, 0.5, 4, BF16)],
)
def test_decode_window_and_cap_match_reference(window: int, cap, splits: int, dtype: torch.dtype) -> None:
    k, v, r2t, pool, seq_lens = _cache(2, HEAD_DIM, DECODE_LENS, dtype)
    q = (_randn(len(DECODE_LENS), 8, HEAD_DIM) * 4).to(dtype)
    opts = dict(sliding_window=window, logit_cap=cap)
    got = _decode(q, k, v, r2t, pool, seq_lens, splits, **opts)
    want = decode_attention_reference(q, k, v, r2t, pool, seq_lens, HEAD_DIM**-0.5, **opts)
    torch.testing.assert_close(got.float(), want.float(), atol=_tol(dtype), rtol=_tol(dtype))


def test_decode_head_dim_not_a_power_of_two() -> None:
    lens = [5, BLOCK_N + 3]
    k, v, r2t, pool, seq_lens = _cache(2, 24, lens, torch.float32)
    q = _randn(len(lens), 4, 24)
    got = _decode(q, k, v, r2t, pool, seq_lens, 3)
    torch.testing.assert_close(got, decode_attention_reference(q, k, v, r2t, pool, seq_lens, 24**-0.5), atol=1e-5, rtol=1e-5)


def test_decode_padding_row_gives_zeros() -> None:
    """A CUDA-graph padding row (seq_len 0, req_to_token row 0 -> slot 0) reads nothing: poisoned
    slot 0, workspace and output stay out of every row, and the other rows are unchanged bits."""
    heads, kv_heads, splits = 8, 2, 4
    lens = [BLOCK_N + 9, 2, 3 * BLOCK_N]
    k, v, r2t, pool, seq_lens = _cache(kv_heads, HEAD_DIM, lens, torch.float32)
    k[0], v[0] = float("nan"), float("nan")  # no request owns slot 0
    q = _randn(len(lens), heads, HEAD_DIM)
    alone = _decode(q, k, v, r2t, pool, seq_lens, splits)

    pad = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    q_pad = torch.cat([q[:1], _randn(1, heads, HEAD_DIM, seed=9), q[1:]])  # padding row at index 1
    pool_pad = torch.cat([pool[:1], pad, pool[1:]])
    lens_pad = torch.cat([seq_lens[:1], pad, seq_lens[1:]])
    partial, lse = decode_workspace(8, heads, splits, HEAD_DIM, DEVICE)  # sized for a larger batch
    partial.fill_(float("nan"))
    lse.fill_(float("nan"))
    out = torch.full_like(q_pad, float("nan"))
    got = _decode(q_pad, k, v, r2t, pool_pad, lens_pad, splits, out=out, workspace=(partial, lse))
    assert got is out
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    assert torch.equal(got[[0, 2, 3]], alone)


def test_decode_one_split_writes_out_without_the_workspace() -> None:
    """With one split the split kernel writes the output itself (no merge launch): a poisoned
    workspace stays untouched, a padding row gives zeros, and the rows match the reference."""
    heads, kv_heads = 8, 2
    lens = [BLOCK_N + 9, 0, 3 * BLOCK_N]
    k, v, r2t, pool, seq_lens = _cache(kv_heads, HEAD_DIM, lens, torch.bfloat16)
    q = _randn(len(lens), heads, HEAD_DIM, dtype=torch.bfloat16)
    partial, lse = decode_workspace(len(lens), heads, 1, HEAD_DIM, DEVICE)
    partial.fill_(float("nan"))
    lse.fill_(float("nan"))
    got = _decode(q, k, v, r2t, pool, seq_lens, 1, workspace=(partial, lse))
    assert partial.isnan().all() and lse.isnan().all()
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    want = decode_attention_reference(q, k, v, r2t, pool, seq_lens, HEAD_DIM**-0.5)
    torch.testing.assert_close(got[[0, 2]].float(), want[[0, 2]].float(), atol=_tol(torch.bfloat16), rtol=_tol(torch.bfloat16))


def test_decode_noncontiguous_q() -> None:
    """q as the head slice of a fused qkv projection output: row stride != Hq * D."""
    heads, kv_heads = 6, 2
    lens = [BLOCK_N + 1, 7]
    k, v, r2t, pool, seq_lens = _cache(kv_heads, HEAD_DIM, lens, torch.float32)
    qkv = _randn(len(lens), (heads + 2 * kv_heads) * HEAD_DIM)  # [B, (Hq + 2 Hk) * D]
    q = qkv[:, : heads * HEAD_DIM].view(len(lens), heads, HEAD_DIM)
    assert not q.is_contiguous()
    got = _decode(q, k, v, r2t, pool, seq_lens, 4)
    want = decode_attention_reference(q.contiguous(), k, v, r2t, pool, seq_lens, HEAD_DIM**-0.5)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_decode_reads_exactly_the_visible_slots() -> None:
    """Poisoning the slot every position past a request's end maps to changes nothing; changing a
    request's last slot changes its row and only its row."""
    lens = [BLOCK_N + 2, 9]
    k, v, r2t, pool, seq_lens = _cache(2, HEAD_DIM, lens, torch.float32)
    q = _randn(len(lens), 4, HEAD_DIM)
    clean = _decode(q, k, v, r2t, pool, seq_lens, 4)
    assert (r2t[pool, max(lens)] == 0).all()
    k[0], v[0] = float("nan"), float("nan")  # slot 0: past every request's end, owned by none
    base = _decode(q, k, v, r2t, pool, seq_lens, 4)
    assert torch.equal(base, clean)
    v[r2t[pool[0], lens[0] - 1]] += 1.0
    moved = _decode(q, k, v, r2t, pool, seq_lens, 4)
    assert not torch.allclose(moved[0], base[0]) and torch.equal(moved[1], base[1])


def test_default_num_kv_splits() -> None:
    assert default_num_kv_splits(1, 8) == 16  # capped
    assert default_num_kv_splits(16, 8) == 3  # 2 waves of 132 SMs over 128 programs per split
    assert default_num_kv_splits(256, 8) == 1
    assert default_num_kv_splits(0, 8) >= 1


# --- extend -------------------------------------------------------------------------------------

# (prefix, extend) per request: from scratch, the one-token recompute, chunked prefill, and
# lengths at and across the BLOCK_M / BLOCK_N edges.
MIXED = [(0, 1), (5, BLOCK_M), (EXTEND_BLOCK_N + 6, 17), (EXTEND_BLOCK_N, BLOCK_M + 1), (EXTEND_BLOCK_N - 1, 2 * BLOCK_M + 2),
         (EXTEND_BLOCK_N - 2, 3)]


def _extend_batch(reqs: list[tuple[int, int]], heads: int, kv_heads: int, dtype: torch.dtype, head_dim: int = HEAD_DIM):
    k, v, r2t, pool, _ = _cache(kv_heads, head_dim, [p + e for p, e in reqs], dtype)
    prefix_lens = torch.tensor([p for p, _ in reqs], dtype=torch.int64, device=DEVICE)
    extend_lens = torch.tensor([e for _, e in reqs], dtype=torch.int64, device=DEVICE)
    q_starts = torch.cumsum(extend_lens, 0) - extend_lens
    q = _randn(int(extend_lens.sum()), heads, head_dim, dtype=dtype)  # [N, Hq, D]
    return q, k, v, r2t, pool, q_starts, prefix_lens, extend_lens


def _extend(q, k, v, r2t, pool, q_starts, prefix_lens, extend_lens, **kw) -> torch.Tensor:
    max_extend = int(extend_lens.max())
    return paged_extend_attention(q, k, v, r2t, pool, q_starts, prefix_lens, extend_lens, max_extend, q.shape[-1] ** -0.5, **kw)


@pytest.mark.parametrize(
    "reqs,heads,kv_heads,dtype,head_dim",
    [
        ([(0, BLOCK_M + 3)], 4, 4, torch.float32, HEAD_DIM),
        (MIXED, 8, 2, torch.float32, HEAD_DIM),
        (MIXED, 9, 3, torch.bfloat16, HEAD_DIM),
        ([(2 * EXTEND_BLOCK_N + 3, 1), (40, 3)], 8, 1, torch.float32, HEAD_DIM),
        ([(3, 40), (0, BLOCK_M + 6)], 4, 2, torch.float32, 24),
        ([(EXTEND_BLOCK_N, 20)], 4, 2, torch.float16, 64),
    ],
)
def test_extend_matches_reference(reqs, heads: int, kv_heads: int, dtype: torch.dtype, head_dim: int) -> None:
    args = _extend_batch(reqs, heads, kv_heads, dtype, head_dim)
    got = _extend(*args)
    want = extend_attention_reference(*args[:6], args[6], args[7], head_dim**-0.5)
    assert got.shape == args[0].shape and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), atol=_tol(dtype), rtol=_tol(dtype))


# Windows of one position, inside a block, across the BLOCK_M / BLOCK_N edges and past every
# length, over prefixes (chunked prefill: the window reaches back into the cached chunk); a cap.
@pytest.mark.parametrize(
    "window,cap,dtype",
    [(1, None, F32), (5, 0.5, F32), (EXTEND_BLOCK_N + 3, None, F32), (BLOCK_M + EXTEND_BLOCK_N + 1, 0.5, F32),
     (10_000, 0.5, F32), (EXTEND_BLOCK_N - 7, 0.5, BF16)],
)
def test_extend_window_and_cap_match_reference(window: int, cap, dtype: torch.dtype) -> None:
    q, *rest = _extend_batch(MIXED, 8, 2, dtype)
    args = (q * 4, *rest)
    opts = dict(sliding_window=window, logit_cap=cap)
    got = _extend(*args, **opts)
    want = extend_attention_reference(*args, HEAD_DIM**-0.5, **opts)
    torch.testing.assert_close(got.float(), want.float(), atol=_tol(dtype), rtol=_tol(dtype))


def test_extend_is_causal() -> None:
    """Changing the last new token's K/V changes only that token's output (exactly)."""
    q, k, v, r2t, pool, q_starts, prefix_lens, extend_lens = _extend_batch([(7, BLOCK_M + 5)], 4, 2, torch.float32)
    base = _extend(q, k, v, r2t, pool, q_starts, prefix_lens, extend_lens)
    last = 7 + BLOCK_M + 5 - 1
    k[r2t[pool[0], last]] += 3.0
    moved = _extend(q, k, v, r2t, pool, q_starts, prefix_lens, extend_lens)
    assert torch.equal(moved[:-1], base[:-1])
    assert not torch.allclose(moved[-1], base[-1])


def test_extend_strided_q_and_gaps_in_out() -> None:
    """q rows of no request (a gap between requests) keep out's contents; q may be a strided view."""
    reqs = [(4, 9), (0, 20)]
    heads, kv_heads = 4, 2
    k, v, r2t, pool, _ = _cache(kv_heads, HEAD_DIM, [p + e for p, e in reqs], torch.float32)
    prefix_lens = torch.tensor([4, 0], dtype=torch.int64, device=DEVICE)
    extend_lens = torch.tensor([9, 20], dtype=torch.int64, device=DEVICE)
    q_starts = torch.tensor([0, 12], dtype=torch.int64, device=DEVICE)  # rows 9..11 belong to nobody
    qkv = _randn(32, (heads + 2 * kv_heads) * HEAD_DIM)
    q = qkv[:, : heads * HEAD_DIM].view(32, heads, HEAD_DIM)
    out = torch.full((32, heads, HEAD_DIM), 7.0, device=DEVICE)
    got = _extend(q, k, v, r2t, pool, q_starts, prefix_lens, extend_lens, out=out)
    want = extend_attention_reference(q, k, v, r2t, pool, q_starts, prefix_lens, extend_lens, HEAD_DIM**-0.5)
    rows = torch.cat([torch.arange(0, 9), torch.arange(12, 32)])
    torch.testing.assert_close(got[rows], want[rows], atol=1e-5, rtol=1e-5)
    assert (got[9:12] == 7.0).all()
