"""The CPU decode-attention kernel (C, built at run time) against its plain-torch reference: its
AVX2 and portable variants, head dims on and off the vector width, one-token and long requests,
small batches that split their heads over threads, rows independent of the batch, and the
layout checks in front of the raw pointers."""

from __future__ import annotations

import pytest
import torch

import sgl_kernel_ext.attention.decode_attention_cpu as cpu_attention
from sgl_kernel_ext.attention.decode_attention_cpu import decode_attention_cpu
from sgl_kernel_ext.attention.reference import decode_attention_reference
from sgl_kernel_ext.cpu_build import load_kernel
from paged_kv_utils import paged_kv_cache

if not cpu_attention.cpu_decode_attention_available():
    pytest.skip("no working C compiler: the CPU kernel is not built", allow_module_level=True)


CASES = [
    # (KV heads, query heads per KV head, head_dim, lens)
    (3, 3, 64, [1, 17, 200, 33, 64]),  # SmolLM2's shape
    (2, 4, 128, [5, 300]),
    (1, 1, 72, [40]),  # a multiple of 8 that is not one of 16 or 64
    (4, 2, 12, [3, 19, 1]),  # not a multiple of 8: the portable loops
    (8, 1, 64, [250]),  # one request: its heads are split over the threads
]


@pytest.fixture(params=["native", "portable"])
def kernel_variant(request, monkeypatch):
    if request.param == "portable":
        portable = load_kernel(*cpu_attention._KERNEL, defines=("PORTABLE_ONLY",))
        monkeypatch.setattr(cpu_attention, "_kernel", lambda: portable)
    return request.param


@pytest.mark.parametrize("num_kv_heads,group,head_dim,lens", CASES)
def test_matches_reference(kernel_variant, num_kv_heads, group, head_dim, lens) -> None:
    k, v, r2t, pool, seq_lens = paged_kv_cache(num_kv_heads, head_dim, lens)
    q = torch.randn(len(lens), num_kv_heads * group, head_dim, generator=torch.Generator().manual_seed(1))
    scale = head_dim**-0.5
    got = decode_attention_cpu(q, k, v, r2t, pool, seq_lens, scale)
    want = decode_attention_reference(q, k, v, r2t, pool, seq_lens, scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# Windows of one position, shorter than some rows, and longer than every row; with and without a cap.
@pytest.mark.parametrize("window", [None, 1, 16, 1000])
@pytest.mark.parametrize("cap", [None, 0.5])
def test_window_and_cap_match_reference(kernel_variant, window, cap) -> None:
    lens = [1, 17, 200, 33, 16]
    k, v, r2t, pool, seq_lens = paged_kv_cache(3, 64, lens)
    q = torch.randn(len(lens), 9, 64, generator=torch.Generator().manual_seed(1)) * 4  # scores past the cap
    opts = dict(sliding_window=window, logit_cap=cap)
    got = decode_attention_cpu(q, k, v, r2t, pool, seq_lens, 0.125, **opts)
    want = decode_attention_reference(q, k, v, r2t, pool, seq_lens, 0.125, **opts)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_one_token_request_returns_its_value_row() -> None:
    k, v, r2t, pool, seq_lens = paged_kv_cache(3, 64, [1])
    q = torch.randn(1, 9, 64)
    got = decode_attention_cpu(q, k, v, r2t, pool, seq_lens, 0.125)
    slot = r2t[pool[0], 0]
    assert torch.equal(got[0], v[slot].repeat_interleave(3, dim=0))


def test_strided_query_rows_are_read_in_place() -> None:
    """The model hands over q as a slice of the fused q/k projection."""
    k, v, r2t, pool, seq_lens = paged_kv_cache(3, 64, [9, 30])
    qk = torch.randn(2, 9 + 3, 64)
    q = qk[:, :9]
    assert not q.is_contiguous()
    got = decode_attention_cpu(q, k, v, r2t, pool, seq_lens, 0.125)
    assert torch.equal(got, decode_attention_cpu(q.contiguous(), k, v, r2t, pool, seq_lens, 0.125))


def test_rows_do_not_depend_on_the_batch() -> None:
    lens = [7, 150, 64, 1, 99]
    k, v, r2t, pool, seq_lens = paged_kv_cache(3, 64, lens)
    q = torch.randn(len(lens), 9, 64)
    full = decode_attention_cpu(q, k, v, r2t, pool, seq_lens, 0.125)
    for b in range(len(lens)):
        alone = decode_attention_cpu(q[b : b + 1], k, v, r2t, pool[b : b + 1], seq_lens[b : b + 1], 0.125)
        assert torch.equal(alone[0], full[b])
    flipped = decode_attention_cpu(q.flip(0), k, v, r2t, pool.flip(0), seq_lens.flip(0), 0.125)
    assert torch.equal(flipped.flip(0), full)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda a: {**a, "q": a["q"].double()}, "q must be a torch.float32"),
        (lambda a: {**a, "k_buf": a["k_buf"].transpose(0, 1).contiguous().transpose(0, 1)}, "contiguous"),
        (lambda a: {**a, "seq_lens": a["seq_lens"] + 100}, "seq_lens must lie in"),
        (lambda a: {**a, "seq_lens": a["seq_lens"] * 0}, "seq_lens must lie in"),
        (lambda a: {**a, "req_pool_indices": a["req_pool_indices"] + 10}, "req_pool_indices must lie in"),
        (lambda a: {**a, "q": a["q"][:, :5]}, "Shapes do not fit"),
    ],
)
def test_layouts_it_cannot_read_are_refused(change, message) -> None:
    k, v, r2t, pool, seq_lens = paged_kv_cache(3, 64, [4, 6])
    args = dict(q=torch.randn(2, 9, 64), k_buf=k, v_buf=v, req_to_token=r2t, req_pool_indices=pool, seq_lens=seq_lens)
    with pytest.raises(ValueError, match=message):
        decode_attention_cpu(**change(args), scale=0.125)


@pytest.mark.parametrize("bad_slot", [16, 10**12, -1], ids=["cache-size", "far-out", "negative"])
def test_a_corrupted_table_row_is_a_clear_error(kernel_variant, bad_slot) -> None:
    """A req_to_token entry outside the cache is named, with the cache's size, before any row is read."""
    k, v, r2t, pool, seq_lens = paged_kv_cache(3, 64, [4, 11])  # 16 slots
    r2t[pool[1], 7] = bad_slot
    with pytest.raises(ValueError, match=rf"req_to_token\[3, 7\] holds KV slot {bad_slot}, outside the KV cache of 16 slots"):
        decode_attention_cpu(torch.randn(2, 9, 64), k, v, r2t, pool, seq_lens, 0.125)


def test_table_entries_past_a_rows_length_are_not_checked() -> None:
    """Only the slots a request reads count: the rest of its table row may hold anything."""
    k, v, r2t, pool, seq_lens = paged_kv_cache(3, 64, [4, 11])
    q = torch.randn(2, 9, 64)
    want = decode_attention_cpu(q, k, v, r2t, pool, seq_lens, 0.125)
    r2t[pool[0], 4:] = -5
    assert torch.equal(decode_attention_cpu(q, k, v, r2t, pool, seq_lens, 0.125), want)
