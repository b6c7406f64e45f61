"""CUDA-graph decode: the decode forward captured once per batch size, replayed every step.

At start-up the model's decode forward is captured for a list of batch sizes (buckets), by
default up to the runner's max running requests (within what free memory holds). A step of B
requests is padded to the smallest bucket >= B: its inputs are copied into static buffers
(device to device, no host work per request), the padding rows point at the request pool's
all-zero padding row (so they read only the zeroed KV slot 0) and write their K/V to the
cache's padding write slot, then the graph replays and the first B rows of its logits are the
step's. A replay costs one launch instead of a few hundred, which is what bounds a small batch
on a fast GPU. Padding rows never touch a real request's KV slots, and every kernel in the graph
is row-wise or attends per request, so they never change a real row.

Every graph writes its [bucket, V] float32 logits into rows of one shared [max_bs, V] buffer. A
decode batch larger than the largest bucket replays as consecutive chunks of at most max_bs rows
(decode_chunks), each chunk's logits copied out before the next replays. This is exact: a row
reads only its request's KV, written by itself or by that request's earlier rows (a speculative
verify run as decode rows), which replay in the same or an earlier chunk.

With the triton sampling backend each bucket also gets a sampling graph over the decode graph's
logits (sampling_graph.py), and its guided variants: a step that needs no host work in its
sampling, within the largest bucket, replays both.
"""

from __future__ import annotations

import bisect
import logging
import time
from typing import Callable, Optional

import torch

from sglang.srt.layers.batch_invariant import batch_invariant
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.graph_host import GraphHost
from sglang.srt.model_executor.sampling_graph import (
    GUIDED_GRAPH_MAX_BS,
    GraphVariant,
    SamplingInputBuffers,
    finish_replay,
    graph_variant,
    graph_variants,
    prepare_capture,
    prepare_replay,
    sample_in_graph,
)
from sglang.srt.sampling.guidance_graph import GuidanceGraphInputs
from sglang.srt.sampling.watermarking.graph import WatermarkGraphInputs
from sglang.srt.sampling.watermarking.state import WatermarkState
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

logger = logging.getLogger(__name__)

# The default buckets: every small size, then from 16 on steps of 8 up to 256, of 32 up to 512,
# of 64 beyond ((up to, step) pairs).
SMALL_BUCKETS = (1, 2, 4, 8, 12)
FIRST_GRID_BUCKET = 16
BUCKET_GRID = ((256, 8), (512, 32), (1 << 62, 64))
# CUDA memory the decode graphs' state must leave free (piecewise graphs, eager prefill activations).
GRAPH_MEMORY_MARGIN_BYTES = 2 << 30
# [bs, V] float32 temporaries live at once in a guided sampling graph's mix (guidance_graph.mix_in_graph).
GUIDED_MIX_TEMPORARIES = 8


def capture_batch_sizes(max_bs: int, explicit: Optional[list[int]] = None) -> list[int]:
    """The buckets to capture, ascending: `explicit` (--cuda-graph-bs) or the default list up to
    `max_bs` (--cuda-graph-max-bs, default the max running requests): 1, 2, 4, 8, 12, then 16 to
    256 in steps of 8, to 512 in steps of 32, then steps of 64; max_bs itself always included."""
    if explicit:
        if any(b < 1 for b in explicit):
            raise ValueError(f"--cuda-graph-bs sizes must be at least 1, got {sorted(explicit)}.")
        return sorted(set(explicit))
    if max_bs < 1:
        raise ValueError(f"--cuda-graph-max-bs must be at least 1, got {max_bs}.")
    sizes = {b for b in SMALL_BUCKETS if b <= max_bs}
    b = FIRST_GRID_BUCKET
    while b <= max_bs:
        sizes.add(b)
        b += next(step for limit, step in BUCKET_GRID if b < limit)
    sizes.add(max_bs)
    return sorted(sizes)


def padded_batch_size(bs: int, batch_sizes: list[int]) -> Optional[int]:
    """The smallest captured size that holds `bs` rows; None when `bs` exceeds them all."""
    i = bisect.bisect_left(batch_sizes, bs)
    return batch_sizes[i] if i < len(batch_sizes) else None


def decode_chunks(bs: int, batch_sizes: list[int]) -> list[tuple[int, int, int]]:
    """How a decode batch of `bs` rows replays: (start, end, padded bucket) per chunk, consecutive
    runs of at most the largest bucket's rows, in row order (one chunk when `bs` fits a bucket)."""
    max_bs = batch_sizes[-1]
    return [
        (start, min(start + max_bs, bs), padded_batch_size(min(max_bs, bs - start), batch_sizes))
        for start in range(0, bs, max_bs)
    ]


def graph_state_bytes(host: GraphHost, max_bs: int, capture_sampling: bool) -> int:
    """Device bytes the graphs up to `max_bs` rows hold beyond their input buffers: the shared
    float32 logits, the largest temporaries of their memory pool (the logits head's rows, or the
    guided sampling mix's float32 rows), and the attention backend's state. A model without a
    LogitsHead is counted as one whose head finishes its logits in float32."""
    head = getattr(host.model, "logits_head", None)
    head_row = head.scratch_row_bytes(host.dtype) if head is not None else host.dtype.itemsize + 12
    guided_rows = min(max_bs, GUIDED_GRAPH_MAX_BS) if capture_sampling else 0
    pool = max(max_bs * head_row, guided_rows * 4 * GUIDED_MIX_TEMPORARIES) * host.vocab_size
    return max_bs * host.vocab_size * 4 + pool + host.attn_backend.cuda_graph_state_bytes(max_bs)


def largest_fitting(max_bs: int, bytes_for: Callable[[int], int], budget: int) -> int:
    """The largest bs <= max_bs with bytes_for(bs) <= budget (bytes_for non-decreasing); 0 if none."""
    low, high = 0, max_bs
    while low < high:
        mid = (low + high + 1) // 2
        if bytes_for(mid) <= budget:
            low = mid
        else:
            high = mid - 1
    return low


def lowered_sizes(sizes: list[int], fits: int, explicit: bool) -> list[int]:
    """`sizes` cut at `fits` (>= 1, below sizes[-1]), which becomes the largest bucket."""
    if explicit:
        return capture_batch_sizes(fits, [b for b in sizes if b < fits] + [fits])
    return capture_batch_sizes(fits)


def decode_graph_sizes(
    host: GraphHost, max_bs: int, explicit: Optional[list[int]], free: int, capture_sampling: bool
) -> list[int]:
    """capture_batch_sizes(max_bs, explicit), lowered (with a warning) to what `free` bytes of CUDA
    memory hold while leaving GRAPH_MEMORY_MARGIN_BYTES free; [] when not even one row fits."""
    sizes = capture_batch_sizes(max_bs, explicit)

    def need(bs: int) -> int:
        return graph_state_bytes(host, bs, capture_sampling)

    fits = largest_fitting(sizes[-1], need, free - GRAPH_MEMORY_MARGIN_BYTES)
    if fits >= sizes[-1]:
        return sizes
    gib, want = 2**30, need(sizes[-1])
    logger.warning(
        "CUDA graphs: decode graphs up to %d rows need %.2f GiB; %.2f GiB is free and %.1f GiB must stay free, "
        "so they are captured up to %d rows%s. Pass a smaller --cuda-graph-max-bs to choose, or a lower "
        "--mem-fraction-static to leave them more room.",
        sizes[-1], want / gib, free / gib, GRAPH_MEMORY_MARGIN_BYTES / gib, fits, "" if fits else " (none: graphs off)",
    )
    return lowered_sizes(sizes, fits, bool(explicit)) if fits else []


class DecodeInputBuffers:
    """The static inputs of the captured graphs, [max_bs] each. Rows past a step's batch hold a
    padding "request": one token in the request pool's all-zero padding row (so it reads only
    the zeroed KV slot 0), writing its K/V to the cache's padding write slot."""

    def __init__(self, max_bs: int, pad_req_row: int, pad_write_slot: int, device: torch.device) -> None:
        self.max_bs, self.pad_req_row, self.pad_write_slot = max_bs, pad_req_row, pad_write_slot

        def static(fill: int) -> torch.Tensor:
            return torch.full((max_bs,), fill, dtype=torch.int64, device=device)  # [max_bs] int64

        self.input_ids = static(0)
        self.positions = static(0)
        self.req_pool_indices = static(pad_req_row)
        self.seq_lens = static(1)
        self.out_cache_loc = static(pad_write_slot)
        self.ones = static(1)
        self.arange = torch.arange(max_bs, dtype=torch.int64, device=device)

    def batch(self, bs: int) -> ForwardBatch:
        """The forward batch a graph of size `bs` is captured with (views of the buffers)."""
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            extend_seq_lens=self.ones[:bs],
            extend_prefix_lens=self.positions[:bs],
            extend_start_loc=self.arange[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            # Host lengths are never read by a graph-capable backend's decode.
            seq_lens_cpu=[1] * bs,
            extend_seq_lens_cpu=[1] * bs,
            extend_prefix_lens_cpu=[0] * bs,
        )

    def load(self, forward_batch: ForwardBatch, padded: int, start: int = 0, end: Optional[int] = None) -> None:
        """Copy rows [start, end) of a real decode batch (default: all of it) into rows [0, B)
        (device to device) and reset rows [B, padded) to padding: a larger batch may have left
        real values there."""
        rows = slice(start, forward_batch.batch_size if end is None else end)
        bs = rows.stop - rows.start
        self.input_ids[:bs].copy_(forward_batch.input_ids[rows])
        self.positions[:bs].copy_(forward_batch.positions[rows])
        self.req_pool_indices[:bs].copy_(forward_batch.req_pool_indices[rows])
        self.seq_lens[:bs].copy_(forward_batch.seq_lens[rows])
        self.out_cache_loc[:bs].copy_(forward_batch.out_cache_loc[rows])
        if padded > bs:
            self.req_pool_indices[bs:padded].fill_(self.pad_req_row)
            self.seq_lens[bs:padded].fill_(1)
            self.out_cache_loc[bs:padded].fill_(self.pad_write_slot)


class CudaGraphRunner:
    def __init__(
        self, model_runner: GraphHost, batch_sizes: list[int], capture_sampling: bool,
        watermark: Optional[WatermarkState] = None,
    ) -> None:
        """`watermark`: the sampler's watermark state, whose rows the sampling graphs then force too."""
        self.model_runner = model_runner
        self.batch_sizes = batch_sizes
        self.max_bs = batch_sizes[-1]
        self.buffers = DecodeInputBuffers(
            self.max_bs, model_runner.req_to_token_pool.padding_row, model_runner.kv_cache.padding_write_slot,
            model_runner.device,
        )
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # Every graph's output: bucket b writes rows [0, b).
        self.logits_buffer = torch.empty(
            self.max_bs, model_runner.vocab_size, dtype=torch.float32, device=model_runner.device
        )  # [max_bs, V] float32
        self.logits: dict[int, torch.Tensor] = {}  # bucket -> [bucket, V] float32, a view of logits_buffer
        self.sampling: Optional[SamplingInputBuffers] = None
        self.guidance: Optional[GuidanceGraphInputs] = None
        self.watermark: Optional[WatermarkGraphInputs] = None
        if capture_sampling:
            self.sampling = SamplingInputBuffers(self.max_bs, model_runner.vocab_size, model_runner.device)
            self.guidance = GuidanceGraphInputs(self.max_bs, model_runner.device)
            if watermark is not None:
                self.watermark = WatermarkGraphInputs(watermark, self.max_bs, model_runner.device)
        # (bucket, variant of graph_variants) -> the sampling graph and its [bucket] int64 output
        self.sampling_graphs: dict[tuple[int, GraphVariant], torch.cuda.CUDAGraph] = {}
        self.sampled_ids: dict[tuple[int, GraphVariant], torch.Tensor] = {}
        model_runner.attn_backend.init_cuda_graph_state(self.max_bs)
        self.capture()

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        """Any decode batch: one above the largest bucket replays in chunks."""
        return forward_batch.forward_mode.is_decode() and not forward_batch.return_input_logits

    def capture(self) -> None:
        started = time.perf_counter()
        pool = None
        # Largest first: the smaller graphs then fit in the memory pool the first one reserved.
        for bs in reversed(self.batch_sizes):
            batch = self.buffers.batch(bs)
            self.model_runner.attn_backend.init_forward_metadata_capture_cuda_graph(
                bs, batch.req_pool_indices, batch.seq_lens
            )
            self.graphs[bs], self.logits[bs] = self._capture_one(lambda: self._forward(batch), pool)
            pool = self.graphs[bs].pool()
            if self.sampling is None:
                continue
            for variant in graph_variants(self.watermark is not None, bs):
                prepare_capture(self.model_runner.device)
                key = (bs, variant)
                self.sampling_graphs[key], self.sampled_ids[key] = self._capture_one(lambda: self._sample(bs, variant), pool)
        torch.cuda.synchronize(self.model_runner.device)
        logger.info(
            "CUDA graphs: captured %d decode batch sizes up to %d (%s)%s in %.1f s; larger decode batches replay "
            "in chunks of at most %d rows.",
            len(self.batch_sizes), self.max_bs, _describe(self.batch_sizes),
            " with their sampling step" if self.sampling else "", time.perf_counter() - started, self.max_bs,
        )

    def _capture_one(self, run, pool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        for _ in range(2):  # compiles the kernels, sizes the libraries' workspaces
            run()
        torch.cuda.synchronize(self.model_runner.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            output = run()
        return graph, output

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        """The decode forward of `batch`, its logits in the shared buffer's first rows."""
        runner = self.model_runner
        batch.kv_cache, batch.attn_backend = runner.kv_cache, runner.attn_backend
        batch.state_pool = runner.state_pool
        out = batch.logits_out = self.logits_buffer[: batch.batch_size]  # [bs, V] float32
        with batch_invariant(runner.deterministic):
            logits = runner.model(batch).next_token_logits
        if logits.data_ptr() != out.data_ptr():  # a model that does not write `logits_out`
            out.copy_(logits)
        return out

    def _sample(self, bs: int, variant: GraphVariant) -> torch.Tensor:
        return sample_in_graph(
            self.logits[bs], self.sampling, self.buffers.positions[:bs], self.buffers.req_pool_indices[:bs],
            self.model_runner.future_tokens, self.guidance, variant, self.watermark,
        )

    def replay_sampling(
        self, info: SamplingBatchInfo, bs: int, generator: Optional[torch.Generator]
    ) -> Optional[torch.Tensor]:
        """Sample the decode batch just replayed (`bs` forward rows: the rows of `info`, then their
        guide rows) from its bucket's sampling graph: [len(info)] int64 next ids, or None when the
        batch's penalties need the eager path, its bucket has no graph of its variant, or it replayed
        in chunks (the static buffers then hold its last chunk only)."""
        if bs > self.max_bs or self.sampling is None or (info.watermark is not None and self.watermark is None):
            return None
        padded = padded_batch_size(bs, self.batch_sizes)
        key = (padded, graph_variant(info))
        graph = self.sampling_graphs.get(key)  # a guided batch above GUIDED_GRAPH_MAX_BS has none
        if graph is None or not prepare_replay(self.sampling, info, generator, self.guidance, padded, self.watermark):
            return None
        graph.replay()
        finish_replay(info)
        return self.sampled_ids[key][: len(info)]

    def replayed_alpha(self, info: SamplingBatchInfo) -> torch.Tensor:
        """[G] float32 the alphas the last replay gave `info`'s guided rows (after replay_sampling)."""
        return self.guidance.alpha.index_select(0, info.guidance.rows)

    def replay(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        """next_token_logits [B, V] float32 of a decode batch: rows of the shared buffer when it
        fits a bucket, else a new tensor filled chunk by chunk."""
        bs = forward_batch.batch_size
        chunks = decode_chunks(bs, self.batch_sizes)
        if len(chunks) == 1:
            self._replay_rows(forward_batch, *chunks[0])
            return LogitsProcessorOutput(next_token_logits=self.logits_buffer[:bs])
        logits = self.logits_buffer.new_empty(bs, self.logits_buffer.shape[1])  # [B, V] float32
        for start, end, padded in chunks:
            self._replay_rows(forward_batch, start, end, padded)
            logits[start:end].copy_(self.logits_buffer[: end - start])
        return LogitsProcessorOutput(next_token_logits=logits)

    def _replay_rows(self, forward_batch: ForwardBatch, start: int, end: int, padded: int) -> None:
        """Replay bucket `padded` over rows [start, end) of a decode batch."""
        self.buffers.load(forward_batch, padded, start, end)
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
            end - start, self.buffers.req_pool_indices[:padded], self.buffers.seq_lens[:padded]
        )
        self.graphs[padded].replay()


def _describe(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes)) if len(sizes) <= 8 else f"{sizes[0]}, {sizes[1]}, ..., {sizes[-1]}"
