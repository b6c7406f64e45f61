"""The batch-invariant decode-attention kernel against its plain-torch reference, and its rows
independent of the batch. TRITON_INTERPRET=1 on a CPU (set before triton is imported), native
on CUDA (benchmark/gpu_check.sh)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from sgl_kernel_ext.attention.decode_attention import BLOCK_N, decode_attention_triton  # noqa: E402
from sgl_kernel_ext.attention.reference import decode_attention_reference  # noqa: E402
from paged_kv_utils import paged_kv_cache  # noqa: E402

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def _cache(num_kv_heads: int, head_dim: int, lens: list[int], dtype: torch.dtype, seed: int = 0):
    return tuple(t.to(DEVICE) for t in paged_kv_cache(num_kv_heads, head_dim, lens, dtype, seed))


@pytest.mark.parametrize("heads,kv_heads,dtype", [(9, 3, torch.float32), (4, 4, torch.float32), (8, 2, torch.bfloat16)])
def test_matches_reference(heads: int, kv_heads: int, dtype: torch.dtype) -> None:
    head_dim = 16
    lens = [1, BLOCK_N - 1, BLOCK_N, BLOCK_N + 1, 2 * BLOCK_N + 7]
    k, v, r2t, pool, seq_lens = _cache(kv_heads, head_dim, lens, dtype)
    q = torch.randn(len(lens), heads, head_dim, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEVICE)
    got = decode_attention_triton(q, k, v, r2t, pool, seq_lens, head_dim**-0.5)
    want = decode_attention_reference(q, k, v, r2t, pool, seq_lens, head_dim**-0.5)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert got.shape == q.shape and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


# Windows of one position, inside a block, across blocks, and past every length; with and without a cap.
@pytest.mark.parametrize("window,cap", [(1, None), (5, 0.5), (BLOCK_N + 3, None), (BLOCK_N + 3, 0.5), (10_000, 0.5)])
def test_window_and_cap_match_reference(window: int, cap) -> None:
    head_dim, heads, kv_heads = 16, 6, 2
    lens = [1, 4, BLOCK_N + 3, 2 * BLOCK_N + 7]
    k, v, r2t, pool, seq_lens = _cache(kv_heads, head_dim, lens, torch.float32)
    q = torch.randn(len(lens), heads, head_dim, generator=torch.Generator().manual_seed(1)).to(DEVICE) * 4
    opts = dict(sliding_window=window, logit_cap=cap)
    got = decode_attention_triton(q, k, v, r2t, pool, seq_lens, head_dim**-0.5, **opts)
    want = decode_attention_reference(q, k, v, r2t, pool, seq_lens, head_dim**-0.5, **opts)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_rows_do_not_depend_on_the_batch() -> None:
    """A request's output is the same bits alone, next to longer and shorter requests, and at
    any row of the batch."""
    head_dim, heads, kv_heads = 16, 6, 2
    lens = [70, 3, 150, 70, 129]
    k, v, r2t, pool, seq_lens = _cache(kv_heads, head_dim, lens, torch.float32)
    q = torch.randn(len(lens), heads, head_dim, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    q[3] = q[0]
    r2t[pool[3]] = r2t[pool[0]]  # row 3 is row 0 again
    scale = head_dim**-0.5
    full = decode_attention_triton(q, k, v, r2t, pool, seq_lens, scale)
    alone = decode_attention_triton(q[:1], k, v, r2t, pool[:1], seq_lens[:1], scale)
    assert torch.equal(full[0], alone[0]) and torch.equal(full[3], alone[0])
    flipped = decode_attention_triton(q.flip(0), k, v, r2t, pool.flip(0), seq_lens.flip(0), scale)
    assert torch.equal(flipped.flip(0), full)


def test_a_request_of_no_tokens_gives_zeros_and_leaves_the_others_alone() -> None:
    """A padding row (seq_len 0) comes out as zeros, not NaN; the other rows keep their bits."""
    head_dim, heads, kv_heads = 16, 4, 2
    k, v, r2t, pool, seq_lens = _cache(kv_heads, head_dim, [5, 0, 70], torch.float32)
    q = torch.randn(3, heads, head_dim, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    got = decode_attention_triton(q, k, v, r2t, pool, seq_lens, head_dim**-0.5)
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    for row in (0, 2):
        alone = decode_attention_triton(q[row:row + 1], k, v, r2t, pool[row:row + 1], seq_lens[row:row + 1],
                                        head_dim**-0.5)
        assert torch.equal(got[row:row + 1], alone)
