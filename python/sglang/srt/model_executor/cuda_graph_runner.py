"""CUDA-graph decode: the decode forward captured once per batch size, replayed every step.

At start-up the model's decode forward is captured for a list of batch sizes (buckets). A
step of B requests is padded to the smallest bucket >= B: its inputs are copied into static
buffers (device to device, no host work per request), the padding rows point at the request
pool's all-zero padding row (so they read only the zeroed KV slot 0) and write their K/V to
the cache's padding write slot, then the graph replays and the first B rows of its logits
are the step's. A replay costs one launch instead of a few hundred, which is what bounds a
small batch on a fast GPU. Padding rows never touch a real request's KV slots, and every
kernel in the graph is row-wise or attends per request, so they never change a real row.

With the triton sampling backend each bucket also gets a sampling graph over the decode graph's
logits (sampling_graph.py), and its guided variants: a step that needs no host work in its
sampling replays both.
"""

from __future__ import annotations

import bisect
import logging
import time
from typing import Optional

import torch

from sglang.srt.layers.batch_invariant import batch_invariant
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.graph_host import GraphHost
from sglang.srt.model_executor.sampling_graph import (
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

# The default buckets: every small size, then steps of 8.
SMALL_BUCKETS = (1, 2, 4, 8, 12)
BUCKET_STEP = 8


def capture_batch_sizes(max_bs: int, explicit: Optional[list[int]] = None) -> list[int]:
    """The buckets to capture, ascending: `explicit` (--cuda-graph-bs) or the default list up to
    `max_bs` (--cuda-graph-max-bs), which always includes max_bs itself."""
    if explicit:
        if any(b < 1 for b in explicit):
            raise ValueError(f"--cuda-graph-bs sizes must be at least 1, got {sorted(explicit)}.")
        return sorted(set(explicit))
    if max_bs < 1:
        raise ValueError(f"--cuda-graph-max-bs must be at least 1, got {max_bs}.")
    sizes = {b for b in SMALL_BUCKETS if b <= max_bs}
    sizes.update(range(16, max_bs + 1, BUCKET_STEP))
    sizes.add(max_bs)
    return sorted(sizes)


def padded_batch_size(bs: int, batch_sizes: list[int]) -> Optional[int]:
    """The smallest captured size that holds `bs` rows; None when `bs` exceeds them all."""
    i = bisect.bisect_left(batch_sizes, bs)
    return batch_sizes[i] if i < len(batch_sizes) else None


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

    def load(self, forward_batch: ForwardBatch, padded: int) -> None:
        """Copy a real decode batch into rows [0, B) (device to device) and reset rows
        [B, padded) to padding: a larger batch may have left real values there."""
        bs = forward_batch.batch_size
        self.input_ids[:bs].copy_(forward_batch.input_ids)
        self.positions[:bs].copy_(forward_batch.positions)
        self.req_pool_indices[:bs].copy_(forward_batch.req_pool_indices)
        self.seq_lens[:bs].copy_(forward_batch.seq_lens)
        self.out_cache_loc[:bs].copy_(forward_batch.out_cache_loc)
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
        self.logits: dict[int, torch.Tensor] = {}  # bucket -> [bucket, V] float32 graph output
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
        return (
            forward_batch.forward_mode.is_decode()
            and not forward_batch.return_input_logits
            and forward_batch.batch_size <= self.max_bs
        )

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
            for variant in graph_variants(self.watermark is not None):
                prepare_capture(self.model_runner.device)
                key = (bs, variant)
                self.sampling_graphs[key], self.sampled_ids[key] = self._capture_one(lambda: self._sample(bs, variant), pool)
        torch.cuda.synchronize(self.model_runner.device)
        logger.info(
            "CUDA graphs: captured %d decode batch sizes (%s)%s in %.1f s.",
            len(self.batch_sizes), _describe(self.batch_sizes), " with their sampling step" if self.sampling else "",
            time.perf_counter() - started,
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
        runner = self.model_runner
        batch.kv_cache, batch.attn_backend = runner.kv_cache, runner.attn_backend
        batch.state_pool = runner.state_pool
        with batch_invariant(runner.deterministic):
            return runner.model(batch).next_token_logits  # [bs, V] float32

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
        batch's penalties need the eager path."""
        padded = padded_batch_size(bs, self.batch_sizes)
        if info.watermark is not None and self.watermark is None:
            return None
        if self.sampling is None or not prepare_replay(self.sampling, info, generator, self.guidance, padded, self.watermark):
            return None
        key = (padded, graph_variant(info))
        self.sampling_graphs[key].replay()
        finish_replay(info)
        return self.sampled_ids[key][: len(info)]

    def replayed_alpha(self, info: SamplingBatchInfo) -> torch.Tensor:
        """[G] float32 the alphas the last replay gave `info`'s guided rows (after replay_sampling)."""
        return self.guidance.alpha.index_select(0, info.guidance.rows)

    def replay(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        bs = forward_batch.batch_size
        padded = padded_batch_size(bs, self.batch_sizes)
        self.buffers.load(forward_batch, padded)
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
            bs, self.buffers.req_pool_indices[:padded], self.buffers.seq_lens[:padded]
        )
        self.graphs[padded].replay()
        return LogitsProcessorOutput(next_token_logits=self.logits[padded][:bs])


def _describe(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes)) if len(sizes) <= 8 else f"{sizes[0]}, {sizes[1]}, ..., {sizes[-1]}"
