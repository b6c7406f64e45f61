"""The CUDA-graph runner's bucket choice and padding (CPU: the logic, not the capture; the
capture itself is checked on a GPU by benchmark/gpu_engine_check.py)."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.model_executor.cuda_graph_runner import DecodeInputBuffers, capture_batch_sizes, padded_batch_size
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode


def test_default_buckets_follow_sglang_list_up_to_max() -> None:
    assert capture_batch_sizes(40) == [1, 2, 4, 8, 12, 16, 24, 32, 40]
    assert capture_batch_sizes(256)[:8] == [1, 2, 4, 8, 12, 16, 24, 32] and capture_batch_sizes(256)[-1] == 256
    assert all(b - a == 8 for a, b in zip(capture_batch_sizes(256)[5:], capture_batch_sizes(256)[6:]))
    # A max that is not on the grid is captured too, so every batch up to it has a graph.
    assert capture_batch_sizes(10) == [1, 2, 4, 8, 10]
    assert capture_batch_sizes(1) == [1]


def test_explicit_buckets_sorted_and_validated() -> None:
    assert capture_batch_sizes(256, [8, 1, 8, 3]) == [1, 3, 8]
    with pytest.raises(ValueError, match="cuda-graph-bs"):
        capture_batch_sizes(256, [0, 4])
    with pytest.raises(ValueError, match="cuda-graph-max-bs"):
        capture_batch_sizes(0)


@pytest.mark.parametrize("bs,want", [(1, 1), (3, 4), (4, 4), (5, 8), (13, 16), (17, 24), (40, 40), (41, None)])
def test_padded_batch_size_is_smallest_bucket_that_fits(bs: int, want) -> None:
    assert padded_batch_size(bs, capture_batch_sizes(40)) == want


def _decode_batch(pool_rows: list[int], seq_lens: list[int], slots: list[int]) -> ForwardBatch:
    batch = ForwardBatch.init_new(
        ForwardMode.DECODE, [7] * len(pool_rows), pool_rows, [n - 1 for n in seq_lens], [1] * len(pool_rows),
        torch.tensor(slots), "cpu",
    )
    return batch


def test_padding_rows_point_at_padding_row_and_write_slot() -> None:
    buffers = DecodeInputBuffers(max_bs=8, pad_req_row=99, pad_write_slot=500, device=torch.device("cpu"))
    buffers.load(_decode_batch([0, 1, 2, 3, 4, 5], [10, 11, 12, 13, 14, 15], [21, 22, 23, 24, 25, 26]), padded=8)
    # Then a smaller batch: rows 2..3 held real requests a step ago and must become padding again.
    buffers.load(_decode_batch([5, 4], [30, 31], [41, 42]), padded=4)
    batch = buffers.batch(4)
    assert batch.req_pool_indices.tolist() == [5, 4, 99, 99]
    assert batch.seq_lens.tolist() == [30, 31, 1, 1]
    assert batch.out_cache_loc.tolist() == [41, 42, 500, 500]
    assert batch.positions[:2].tolist() == [29, 30] and batch.input_ids[:2].tolist() == [7, 7]
    # Rows past the padded size are not the graph's business (a size-4 graph never reads them).
    assert buffers.req_pool_indices[4:6].tolist() == [4, 5]


def test_padding_never_uses_a_real_slot() -> None:
    from sglang.srt.mem_cache.memory_pool import KVCache, ReqToTokenPool, TokenToKVPoolAllocator

    pool = ReqToTokenPool(4, 16, "cpu")
    cache = KVCache(32, 1, 1, 2, torch.float32, "cpu")
    allocator = TokenToKVPoolAllocator(32)
    handed_out = allocator.alloc(32).tolist()
    assert pool.padding_row not in pool.free_slots and pool.padding_row == 4
    assert cache.padding_write_slot not in handed_out and 0 not in handed_out
    assert cache.get_kv(0)[0].shape[0] == 34 and pool.req_to_token[pool.padding_row].eq(0).all()
