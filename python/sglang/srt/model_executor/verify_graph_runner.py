"""CUDA graphs of the speculative verify forward: every request extends by the same width W
(its last token and W - 1 drafts, padded where it has fewer), so the whole extend has a fixed
shape per batch size and is captured once per bucket, as a decode step is (cuda_graph_runner.py).

The verify forward is an extend of [B * W] tokens returning every token's logits. With W fixed,
nothing in it reads a length on the host: the extend attention's grid is (B, heads, W / BLOCK_M)
and its per-request prefix lengths are device tensors. A step of B requests is padded to the
smallest bucket >= B; padding requests sit in the request pool's all-zero padding row, read only
the zeroed KV slot 0 and write their K/V to the cache's padding write slot, so they never touch
a real request's slots. Their logits are never read.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.cuda_graph_runner import capture_batch_sizes, padded_batch_size
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.graph_host import GraphHost

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerifyGraphShape:
    width: int  # tokens per request: the last token and the drafts (--speculative-num-draft-tokens)
    max_bs: int  # the largest verify batch captured


class VerifyInputBuffers:
    """The static inputs, [max_bs] per request and [max_bs * W] per token."""

    def __init__(self, shape: VerifyGraphShape, pad_req_row: int, pad_write_slot: int, device: torch.device) -> None:
        self.width, self.pad_req_row, self.pad_write_slot = shape.width, pad_req_row, pad_write_slot
        tokens = shape.max_bs * shape.width
        self.input_ids = torch.zeros(tokens, dtype=torch.int64, device=device)  # [max_bs * W]
        self.positions = torch.zeros(tokens, dtype=torch.int64, device=device)  # [max_bs * W]
        self.out_cache_loc = torch.full((tokens,), pad_write_slot, dtype=torch.int64, device=device)  # [max_bs * W]
        self.req_pool_indices = torch.full((shape.max_bs,), pad_req_row, dtype=torch.int64, device=device)  # [max_bs]
        self.prefix_lens = torch.zeros(shape.max_bs, dtype=torch.int64, device=device)  # [max_bs]
        self.seq_lens = torch.full((shape.max_bs,), shape.width, dtype=torch.int64, device=device)  # [max_bs]
        self.extend_lens = torch.full((shape.max_bs,), shape.width, dtype=torch.int64, device=device)  # [max_bs]
        self.starts = torch.arange(shape.max_bs, dtype=torch.int64, device=device) * shape.width  # [max_bs]

    def batch(self, bs: int) -> ForwardBatch:
        """The forward batch a bucket is captured with (views of the buffers)."""
        tokens = bs * self.width
        return ForwardBatch(
            forward_mode=ForwardMode.EXTEND, batch_size=bs, input_ids=self.input_ids[:tokens],
            positions=self.positions[:tokens], req_pool_indices=self.req_pool_indices[:bs], seq_lens=self.seq_lens[:bs],
            extend_seq_lens=self.extend_lens[:bs], extend_prefix_lens=self.prefix_lens[:bs],
            extend_start_loc=self.starts[:bs], out_cache_loc=self.out_cache_loc[:tokens],
            # The graph-capable backend's extend reads no host length but the width it is given.
            seq_lens_cpu=[self.width] * bs, extend_seq_lens_cpu=[self.width] * bs, extend_prefix_lens_cpu=[0] * bs,
            return_input_logits=True, verify_width=self.width,
        )

    def load(self, forward_batch: ForwardBatch, padded: int) -> None:
        """Copy a real verify batch into the first rows (device to device) and reset the rest of
        the bucket to padding: a larger batch may have left real values there."""
        bs, tokens = forward_batch.batch_size, forward_batch.input_ids.shape[0]
        self.input_ids[:tokens].copy_(forward_batch.input_ids)
        self.positions[:tokens].copy_(forward_batch.positions)
        self.out_cache_loc[:tokens].copy_(forward_batch.out_cache_loc)
        self.req_pool_indices[:bs].copy_(forward_batch.req_pool_indices)
        self.prefix_lens[:bs].copy_(forward_batch.extend_prefix_lens)
        self.seq_lens[:bs].copy_(forward_batch.seq_lens)
        if padded > bs:
            self.positions[tokens : padded * self.width].zero_()
            self.out_cache_loc[tokens : padded * self.width].fill_(self.pad_write_slot)
            self.req_pool_indices[bs:padded].fill_(self.pad_req_row)
            self.prefix_lens[bs:padded].zero_()
            self.seq_lens[bs:padded].fill_(self.width)


class VerifyGraphRunner:
    def __init__(self, model_runner: GraphHost, shape: VerifyGraphShape) -> None:
        self.model_runner = model_runner
        self.width = shape.width
        self.batch_sizes = capture_batch_sizes(shape.max_bs)
        self.buffers = VerifyInputBuffers(
            shape, model_runner.req_to_token_pool.padding_row, model_runner.kv_cache.padding_write_slot,
            model_runner.device,
        )
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, LogitsProcessorOutput] = {}  # bucket -> its logits ([bs * W, V], [bs, V])
        self.capture()

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        return forward_batch.verify_width == self.width and forward_batch.batch_size <= self.batch_sizes[-1]

    def capture(self) -> None:
        started = time.perf_counter()
        pool = None
        for bs in reversed(self.batch_sizes):  # largest first: the others fit in its pool
            batch = self.buffers.batch(bs)
            for _ in range(2):  # compiles the kernels, sizes the libraries' workspaces
                self._forward(batch)
            torch.cuda.synchronize(self.model_runner.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs] = self._forward(batch)
            self.graphs[bs], pool = graph, graph.pool()
        torch.cuda.synchronize(self.model_runner.device)
        logger.info("CUDA graphs: captured %d speculative verify batch sizes (up to %d, %d tokens each) in %.1f s.",
                    len(self.batch_sizes), self.batch_sizes[-1], self.width, time.perf_counter() - started)

    def _forward(self, batch: ForwardBatch) -> LogitsProcessorOutput:
        runner = self.model_runner
        batch.kv_cache, batch.attn_backend, batch.state_pool = runner.kv_cache, runner.attn_backend, runner.state_pool
        runner.attn_backend.init_forward_metadata(batch)
        return runner.model(batch)

    def replay(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        bs = forward_batch.batch_size
        padded = padded_batch_size(bs, self.batch_sizes)
        self.buffers.load(forward_batch, padded)
        self.graphs[padded].replay()
        out = self.outputs[padded]
        return LogitsProcessorOutput(
            next_token_logits=out.next_token_logits[:bs], input_token_logits=out.input_token_logits[: bs * self.width]
        )
