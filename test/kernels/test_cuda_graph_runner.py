"""The CUDA-graph runner's buckets, chunking, padding and memory fit (CPU: the logic, and the
replay with each graph run eagerly in its place); on a GPU the captured graphs themselves (chunked
replay equal to the eager forward, one shared logits buffer), also checked by
benchmark/gpu_engine_check.py."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Optional

import pytest
import torch

from runner_utils import Driver
from sglang.srt.model_executor.cuda_graph_runner import (
    GRAPH_MEMORY_MARGIN_BYTES,
    GUIDED_MIX_TEMPORARIES,
    CudaGraphRunner,
    DecodeInputBuffers,
    capture_batch_sizes,
    decode_chunks,
    decode_graph_sizes,
    graph_state_bytes,
    largest_fitting,
    padded_batch_size,
)
from sglang.srt.layers.logits_processor import LogitsHead
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.model_executor.sampling_graph import GUIDED_GRAPH_MAX_BS

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_default_buckets_follow_sglang_list_up_to_max() -> None:
    assert capture_batch_sizes(40) == [1, 2, 4, 8, 12, 16, 24, 32, 40]
    assert capture_batch_sizes(256)[:8] == [1, 2, 4, 8, 12, 16, 24, 32] and capture_batch_sizes(256)[-1] == 256
    assert all(b - a == 8 for a, b in zip(capture_batch_sizes(256)[5:], capture_batch_sizes(256)[6:]))
    # A max that is not on the grid is captured too, so every batch up to it has a graph.
    assert capture_batch_sizes(10) == [1, 2, 4, 8, 10]
    assert capture_batch_sizes(1) == [1]


def test_default_buckets_widen_past_256() -> None:
    """Steps of 8 up to 256, of 32 up to 512, of 64 beyond: the max running requests (up to 2048)
    take 68 graphs."""
    sizes = capture_batch_sizes(2048)
    assert sizes == [1, 2, 4, 8, 12, *range(16, 257, 8), *range(288, 513, 32), *range(576, 2049, 64)]
    assert len(sizes) == 68
    assert capture_batch_sizes(300)[-4:] == [248, 256, 288, 300]
    assert capture_batch_sizes(600)[-4:] == [480, 512, 576, 600]
    assert capture_batch_sizes(1000)[-2:] == [960, 1000]


def test_explicit_buckets_sorted_and_validated() -> None:
    assert capture_batch_sizes(256, [8, 1, 8, 3]) == [1, 3, 8]
    assert capture_batch_sizes(4096, [8, 1, 8, 3]) == [1, 3, 8]
    with pytest.raises(ValueError, match="cuda-graph-bs"):
        capture_batch_sizes(256, [0, 4])
    with pytest.raises(ValueError, match="cuda-graph-max-bs"):
        capture_batch_sizes(0)


@pytest.mark.parametrize("bs,want", [(1, 1), (3, 4), (4, 4), (5, 8), (13, 16), (17, 24), (40, 40), (41, None)])
def test_padded_batch_size_is_smallest_bucket_that_fits(bs: int, want) -> None:
    assert padded_batch_size(bs, capture_batch_sizes(40)) == want


@pytest.mark.parametrize(
    "bs,sizes,want",
    [
        (5, [1, 2, 4, 8], [(0, 5, 8)]),
        (8, [1, 2, 4, 8], [(0, 8, 8)]),
        (9, [1, 2, 4, 8], [(0, 8, 8), (8, 9, 1)]),
        (21, [1, 2, 4, 8], [(0, 8, 8), (8, 16, 8), (16, 21, 8)]),
        (19, [1, 2, 4, 8], [(0, 8, 8), (8, 16, 8), (16, 19, 4)]),
        (600, capture_batch_sizes(256), [(0, 256, 256), (256, 512, 256), (512, 600, 88)]),
        (7, [3], [(0, 3, 3), (3, 6, 3), (6, 7, 3)]),
    ],
)
def test_decode_chunks_cover_the_batch_in_order(bs: int, sizes: list[int], want) -> None:
    assert decode_chunks(bs, sizes) == want


@pytest.mark.parametrize("bs", [1, 255, 256, 257, 1000, 2048])
def test_decode_chunks_fit_their_buckets(bs: int) -> None:
    sizes = capture_batch_sizes(256)
    chunks = decode_chunks(bs, sizes)
    assert [c[0] for c in chunks] == [0] + [c[1] for c in chunks[:-1]] and chunks[-1][1] == bs
    assert all(end - start <= padded and padded in sizes for start, end, padded in chunks)
    assert all(padded == padded_batch_size(end - start, sizes) for start, end, padded in chunks)


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


def test_load_copies_one_chunk_of_a_batch() -> None:
    buffers = DecodeInputBuffers(max_bs=4, pad_req_row=99, pad_write_slot=500, device=torch.device("cpu"))
    batch = _decode_batch([0, 1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14, 15, 16], [21, 22, 23, 24, 25, 26, 27])
    buffers.load(batch, 4, 0, 4)
    buffers.load(batch, 4, 4, 7)  # the last chunk: 3 rows in the size-4 graph
    assert buffers.req_pool_indices.tolist() == [4, 5, 6, 99]
    assert buffers.seq_lens.tolist() == [14, 15, 16, 1]
    assert buffers.out_cache_loc.tolist() == [25, 26, 27, 500]
    assert buffers.positions[:3].tolist() == [13, 14, 15]


def test_padding_never_uses_a_real_slot() -> None:
    from sglang.srt.mem_cache.memory_pool import KVCache, ReqToTokenPool, TokenToKVPoolAllocator

    pool = ReqToTokenPool(4, 16, "cpu")
    cache = KVCache(32, 1, 1, 2, torch.float32, "cpu")
    allocator = TokenToKVPoolAllocator(32)
    handed_out = allocator.alloc(32).tolist()
    assert pool.padding_row not in pool.free_slots and pool.padding_row == 4
    assert cache.padding_write_slot not in handed_out and 0 not in handed_out
    assert cache.get_kv(0)[0].shape[0] == 34 and pool.req_to_token[pool.padding_row].eq(0).all()


def test_largest_fitting_batch() -> None:
    cost = lambda bs: 100 * bs + 50  # noqa: E731
    assert largest_fitting(64, cost, 100 * 64 + 50) == 64
    assert largest_fitting(64, cost, 100 * 20 + 99) == 20
    assert largest_fitting(64, cost, 149) == 0
    assert largest_fitting(64, cost, -5) == 0


def _graph_host(vocab: int = 1000, attention_bytes_per_row: int = 24, softcap: Optional[float] = None) -> SimpleNamespace:
    backend = SimpleNamespace(cuda_graph_state_bytes=lambda bs: attention_bytes_per_row * bs)
    model = SimpleNamespace(logits_head=LogitsHead(vocab, final_logit_softcapping=softcap))
    return SimpleNamespace(vocab_size=vocab, dtype=torch.bfloat16, attn_backend=backend, model=model)


def test_graph_state_bytes_per_row() -> None:
    host = _graph_host()
    # Shared float32 logits + the bf16 projection (1000 x (4 + 2)) + 24 attention bytes.
    assert graph_state_bytes(host, 10, capture_sampling=False) == 10 * 6024
    # The guided sampling mix's float32 temporaries outweigh the projection in the graph pool.
    assert graph_state_bytes(host, 10, capture_sampling=True) == 10 * (1000 * (4 + 4 * GUIDED_MIX_TEMPORARIES) + 24)
    # A head that finishes its logits in float32 (here soft-capping) leaves three more float32 rows.
    assert graph_state_bytes(_graph_host(softcap=30.0), 10, capture_sampling=False) == 10 * (1000 * (4 + 2 + 12) + 24)
    # Guided variants are captured up to GUIDED_GRAPH_MAX_BS rows only.
    big = GUIDED_GRAPH_MAX_BS * 4
    assert graph_state_bytes(host, big, capture_sampling=True) == (
        big * 1000 * 4 + GUIDED_GRAPH_MAX_BS * 1000 * 4 * GUIDED_MIX_TEMPORARIES + big * 24)


def test_graph_sizes_kept_when_memory_holds_them(caplog) -> None:
    host = _graph_host()
    with caplog.at_level(logging.WARNING):
        sizes = decode_graph_sizes(host, 2048, None, GRAPH_MEMORY_MARGIN_BYTES + 2048 * 6024, False)
    assert sizes == capture_batch_sizes(2048) and not caplog.records


def test_graph_sizes_lowered_to_what_fits_with_a_warning(caplog) -> None:
    host = _graph_host()  # a row: 6024 bytes without the sampling graphs
    free = GRAPH_MEMORY_MARGIN_BYTES + 700 * 6024 + 10
    with caplog.at_level(logging.WARNING):
        assert decode_graph_sizes(host, 2048, None, free, False) == capture_batch_sizes(700)
    assert "--cuda-graph-max-bs" in caplog.text and "700 rows" in caplog.text
    # An explicit list keeps its sizes below what fits, which becomes its largest.
    assert decode_graph_sizes(host, 2048, [1, 64, 512, 1024], free, False) == [1, 64, 512, 700]
    assert decode_graph_sizes(host, 2048, None, GRAPH_MEMORY_MARGIN_BYTES, False) == []
    assert decode_graph_sizes(host, 2048, None, free, True)[-1] < 700


class _EagerGraph:
    """Stands in for a captured graph on the CPU: its replay runs the bucket's forward eagerly
    over the static buffers, as the graph would."""

    def __init__(self, runner: CudaGraphRunner, bs: int) -> None:
        self.runner, self.bs = runner, bs

    def replay(self) -> None:
        self.runner._forward(self.runner.buffers.batch(self.bs))

    def pool(self) -> None:
        return None


def _eager_graph_runner(model_runner: ModelRunner, sizes: list[int], monkeypatch) -> CudaGraphRunner:
    def capture_one(self: CudaGraphRunner, run, pool):
        out = run()
        return _EagerGraph(self, out.shape[0]), out

    monkeypatch.setattr(CudaGraphRunner, "_capture_one", capture_one)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    backend = model_runner.attn_backend
    for hook in ("init_cuda_graph_state", "init_forward_metadata_capture_cuda_graph",
                 "init_forward_metadata_replay_cuda_graph"):
        monkeypatch.setattr(backend, hook, lambda *args: None)
    with torch.inference_mode():
        return CudaGraphRunner(model_runner, sizes, capture_sampling=False)


def _decode_both_ways(model_runner: ModelRunner, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(replayed, eager) next-token logits of one decode step of `n` requests after their prefill."""
    graphs = model_runner.cuda_graph_runner
    driver = Driver(model_runner)
    reqs = [driver.new_req() for _ in range(n)]
    driver.extend(reqs, [[5 + i, 6, 7 + 2 * i][: 1 + i % 3] for i in range(n)])
    batch = driver.forward_batch(reqs, [[11 + i] for i in range(n)], ForwardMode.DECODE)
    assert graphs.can_run(batch)
    replayed = model_runner.forward(batch).next_token_logits.clone()
    model_runner.cuda_graph_runner = None
    try:
        eager = model_runner.forward(batch).next_token_logits  # rewrites the same K/V slots with the same values
    finally:
        model_runner.cuda_graph_runner = graphs
    driver.release()
    return replayed, eager


def test_chunked_replay_equals_eager_forward_on_cpu(gguf_path: str, monkeypatch) -> None:
    """Batch-invariant CPU kernels, the graphs run eagerly over the static buffers: a batch above
    the largest bucket replays in chunks (the last one padded) and equals the eager forward exactly;
    every bucket's output is a view of the one shared buffer."""
    runner = ModelRunner(gguf_path, max_total_tokens=512, max_running_requests=12, deterministic=True)
    graphs = runner.cuda_graph_runner = _eager_graph_runner(runner, [1, 2, 4], monkeypatch)
    assert all(t.data_ptr() == graphs.logits_buffer.data_ptr() for t in graphs.logits.values())
    for n in (3, 11):  # one padded bucket; chunks 4 + 4 + 3 (padded to 4)
        replayed, eager = _decode_both_ways(runner, n)
        assert replayed.shape == eager.shape == (n, runner.vocab_size)
        assert torch.equal(replayed, eager)


@pytest.fixture(scope="module")
def cuda_runner(tmp_path_factory) -> ModelRunner:
    """A tiny random Llama on the GPU in float32 with the batch-invariant kernels (a row's logits
    do not depend on its batch), decode graphs up to 8 rows with the sampling graphs."""
    from family_utils import save_tiny

    folder = str(tmp_path_factory.mktemp("tiny_llama"))
    save_tiny(folder, "LlamaConfig", "LlamaForCausalLM", hidden_size=256, intermediate_size=512, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return ModelRunner(folder, device="cuda", dtype="float32", max_total_tokens=2048, max_running_requests=32,
                       deterministic=True, cuda_graph_max_bs=8, disable_piecewise_cuda_graph=True,
                       sampling_backend="triton")


@pytest.mark.gpu
@cuda_only
def test_cuda_chunked_replay_equals_eager_logits(cuda_runner: ModelRunner) -> None:
    graphs = cuda_runner.cuda_graph_runner
    assert graphs.batch_sizes == [1, 2, 4, 8]
    for n in (5, 8, 21):  # one padded bucket; one full bucket; chunks 8 + 8 + 5 (padded to 8)
        replayed, eager = _decode_both_ways(cuda_runner, n)
        assert replayed.dtype == torch.float32 and torch.equal(replayed, eager)


@pytest.mark.gpu
@cuda_only
def test_cuda_graphs_share_one_logits_buffer(cuda_runner: ModelRunner) -> None:
    graphs = cuda_runner.cuda_graph_runner
    shared = graphs.logits_buffer
    assert shared.shape == (8, cuda_runner.vocab_size) and shared.dtype == torch.float32
    for bs, logits in graphs.logits.items():
        assert logits.shape == (bs, cuda_runner.vocab_size) and logits.data_ptr() == shared.data_ptr()
        assert logits.untyped_storage().data_ptr() == shared.untyped_storage().data_ptr()


@pytest.mark.gpu
@cuda_only
def test_cuda_oversize_batch_leaves_sampling_to_the_eager_path(cuda_runner: ModelRunner) -> None:
    """The static buffers hold only the last chunk of a batch above the largest bucket, so its
    sampling graph is never replayed (nor is the step's noise drawn: the eager sampler draws it)."""
    from sampling_utils import make_info
    from sglang.srt.sampling.sampling_params import SamplingParams

    graphs = cuda_runner.cuda_graph_runner
    assert graphs.sampling is not None
    generator = torch.Generator(device="cuda").manual_seed(0)
    state = generator.get_state()
    oversize = make_info([SamplingParams(temperature=0.7)] * 12, cuda_runner.vocab_size, device="cuda")
    assert graphs.replay_sampling(oversize, 12, generator) is None
    assert torch.equal(generator.get_state(), state)
    fits = make_info([SamplingParams(temperature=0.7)] * 8, cuda_runner.vocab_size, device="cuda")
    with torch.inference_mode():  # as ModelRunner.run: the graphs' static buffers are inference tensors
        assert graphs.replay_sampling(fits, 8, generator).shape == (8,)
