"""The MLA decode kernel (sgl_kernel_ext/attention/mla_decode.py) against its plain-torch reference:
DeepSeek-V3's widths (kv_lora_rank 512, rope 64) with a few heads, a width that is not a power of
two, bf16, padding rows, and a captured-graph-style call with caller-given output and workspace.
TRITON_INTERPRET=1 on a CPU (set before triton is imported), native on CUDA."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from sgl_kernel_ext.attention.mla_decode import BLOCK_N, mla_decode_attention, mla_decode_workspace  # noqa: E402
from sgl_kernel_ext.attention.reference import mla_decode_reference  # noqa: E402
from paged_kv_utils import paged_kv_cache  # noqa: E402

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
F32, BF16 = torch.float32, torch.bfloat16
# Shorter than a block, block edges, and one spanning several blocks of every split.
LENS = [1, BLOCK_N, BLOCK_N + 1, 5 * BLOCK_N + 7]


def _case(heads: int, rank: int, rope: int, lens: list[int], dtype: torch.dtype, seed: int = 0):
    kv, _, r2t, pool, seq_lens = paged_kv_cache(1, rank + rope, lens, dtype, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(len(lens), heads, rank + rope, generator=gen).to(dtype)
    scale = (128 + rope) ** -0.5  # the softmax scale of the decompressed head width d_nope + d_rope
    return tuple(t.to(DEVICE) for t in (q, kv, r2t, pool, seq_lens)) + (scale,)


@pytest.mark.parametrize(
    "heads,rank,rope,dtype,splits",
    [(4, 512, 64, F32, 1), (4, 512, 64, F32, 3), (20, 512, 64, F32, 2), (3, 96, 32, F32, 4), (4, 32, 16, F32, 2),
     (4, 512, 64, BF16, 3)],
)
def test_mla_decode_matches_reference(heads: int, rank: int, rope: int, dtype: torch.dtype, splits: int) -> None:
    q, kv, r2t, pool, seq_lens, scale = _case(heads, rank, rope, LENS, dtype)
    got = mla_decode_attention(q, kv, r2t, pool, seq_lens, scale, rank, num_kv_splits=splits)
    want = mla_decode_reference(q, kv, r2t, pool, seq_lens, scale, rank)
    assert got.shape == (len(LENS), heads, rank) and got.dtype == dtype
    tol = 1e-5 if dtype == F32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_mla_decode_into_wider_output_with_padding_row() -> None:
    """As the attention backend calls it: out is the first R values of [B, H, R + P] rows, the
    workspace is sized for a larger batch and poisoned, and a CUDA-graph padding row (seq_len 0)
    gives zeros without touching the other rows."""
    heads, rank, rope, splits = 4, 512, 64, 2
    q, kv, r2t, pool, seq_lens, scale = _case(heads, rank, rope, [BLOCK_N + 3, 9], F32)
    kv[0] = float("nan")  # slot 0: owned by no request
    pad = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    q = torch.cat([q[:1], q[:1] * 0 + 1, q[1:]])
    pool, seq_lens = torch.cat([pool[:1], pad, pool[1:]]), torch.cat([seq_lens[:1], pad, seq_lens[1:]])
    partial, lse = mla_decode_workspace(8, heads, 4, rank, DEVICE)
    partial.fill_(float("nan"))
    lse.fill_(float("nan"))
    wide = torch.full((3, heads, rank + rope), 7.0, device=DEVICE)
    got = mla_decode_attention(q, kv, r2t, pool, seq_lens, scale, rank, wide[..., :rank], (partial, lse), splits)
    assert torch.equal(wide[..., rank:], torch.full_like(wide[..., rank:], 7.0))  # the rope part is not written
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    want = mla_decode_reference(q[[0, 2]], kv, r2t, pool[[0, 2]], seq_lens[[0, 2]], scale, rank)
    torch.testing.assert_close(got[[0, 2]], want, atol=1e-5, rtol=1e-5)
