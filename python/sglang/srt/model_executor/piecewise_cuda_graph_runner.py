"""Piecewise CUDA graphs for extend (prefill) steps, SGLang's PCG.

An extend step's shape follows its requests (how many, how long, what is cached), so it cannot
replay one whole-forward graph as a decode batch does. Everything but attention is token-wise,
though (embedding, norms, GEMMs, q/k norm + RoPE + K/V store, SiLU x up): for a token count it
can be captured. So the model body is captured once per token count in pieces, split at each
attention: L + 1 graphs for L layers. A step of N tokens is padded to the smallest captured
count T >= N (padding tokens: id 0, position 0, K/V written to the cache's padding slot, never a
real slot); its pieces replay in order, and between two pieces the layer's attention runs
eagerly over the N real tokens with the step's own metadata, from a static query buffer (the
piece before copies q there) into a static output buffer (the piece after reads it). Row i of
every token-wise kernel depends on row i alone, so padding never changes a real token. A
forward then costs L + 1 replays and L attention launches instead of ~10 L launches through
Python, which is what an eager extend step is bound by (~20 ms of host time for a 0.6B model on
the H100 machine, whatever its token count up to thousands).

Graphs of all token counts share one memory pool, captured largest first. A tensor that crosses
from one piece to the next (the residual stream) lives in that pool; another token count's
capture may reuse its memory, which is safe because pieces of different token counts never
interleave.
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.graph_host import GraphHost

if TYPE_CHECKING:
    from sglang.srt.layers.attention.attention_layer import Attention

logger = logging.getLogger(__name__)

# (up to, step): captured token counts are multiples of `step` up to `up to` (a step's padding
# waste stays under ~12% past 256 tokens).
TOKEN_GRID = ((256, 16), (1024, 64), (4096, 256), (1 << 62, 512))


def capture_token_counts(max_tokens: int, explicit: Optional[list[int]] = None) -> list[int]:
    """The token counts to capture, ascending: `explicit` (--piecewise-cuda-graph-tokens) or the
    default grid up to `max_tokens` (--piecewise-cuda-graph-max-tokens), which is always captured."""
    if explicit:
        if any(t < 1 for t in explicit):
            raise ValueError(f"--piecewise-cuda-graph-tokens must be at least 1, got {sorted(explicit)}.")
        return sorted(set(explicit))
    if max_tokens < 1:
        raise ValueError(f"--piecewise-cuda-graph-max-tokens must be at least 1, got {max_tokens}.")
    sizes, low = {max_tokens}, 0
    for up_to, step in TOKEN_GRID:
        sizes.update(range(low + step, min(up_to, max_tokens) + 1, step))
        low = up_to
        if up_to >= max_tokens:
            break
    return sorted(sizes)


def padded_token_count(n: int, counts: list[int]) -> Optional[int]:
    i = bisect.bisect_left(counts, n)
    return counts[i] if i < len(counts) else None


class TokenInputBuffers:
    """The static per-token inputs, [max_tokens] each; tokens past a step's N are padding."""

    def __init__(self, max_tokens: int, pad_write_slot: int, device: torch.device) -> None:
        self.pad_write_slot = pad_write_slot
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.out_cache_loc = torch.full((max_tokens,), pad_write_slot, dtype=torch.int64, device=device)

    def batch(self, tokens: int) -> ForwardBatch:
        """The forward batch a token count is captured with: only the per-token fields are read
        (attention is split off)."""
        one = torch.ones(1, dtype=torch.int64, device=self.input_ids.device)
        return ForwardBatch(
            forward_mode=ForwardMode.EXTEND, batch_size=1, input_ids=self.input_ids[:tokens],
            positions=self.positions[:tokens], req_pool_indices=one, seq_lens=one * tokens, extend_seq_lens=one * tokens,
            extend_prefix_lens=one * 0, extend_start_loc=one * 0, out_cache_loc=self.out_cache_loc[:tokens],
            seq_lens_cpu=[tokens], extend_seq_lens_cpu=[tokens], extend_prefix_lens_cpu=[0],
        )

    def load(self, forward_batch: ForwardBatch, padded: int) -> None:
        """Copy a step's N tokens in (device to device) and reset [N, padded) to padding."""
        n = forward_batch.input_ids.shape[0]
        self.input_ids[:n].copy_(forward_batch.input_ids)
        self.positions[:n].copy_(forward_batch.positions)
        self.out_cache_loc[:n].copy_(forward_batch.out_cache_loc)
        if padded > n:
            self.positions[n:padded].zero_()
            self.out_cache_loc[n:padded].fill_(self.pad_write_slot)


@dataclass
class PiecewiseGraph:
    """One token count's pieces: pieces[i] runs up to layers[i]'s attention, the last one to the
    final norm."""

    pieces: list[torch.cuda.CUDAGraph] = field(default_factory=list)
    layers: list["Attention"] = field(default_factory=list)


class _Splitter:
    """ForwardBatch.attention_split while a token count is warmed up or captured: each attention
    call copies q to the static query buffer and returns the static output buffer; when capturing
    it also ends the current piece there and begins the next."""

    def __init__(self, runner: "PiecewiseCudaGraphRunner", tokens: int, graph: Optional[PiecewiseGraph]) -> None:
        self.runner, self.tokens, self.graph = runner, tokens, graph

    def __call__(self, layer: "Attention", q: torch.Tensor) -> torch.Tensor:
        self.runner.queries[: self.tokens].copy_(q)
        if self.graph is not None:
            self.end_piece()
            self.graph.layers.append(layer)
            self.begin_piece()
        return self.runner.outputs[: self.tokens]

    def begin_piece(self) -> None:
        piece = torch.cuda.CUDAGraph()
        piece.capture_begin(pool=self.runner.pool)
        self.graph.pieces.append(piece)

    def end_piece(self) -> None:
        self.graph.pieces[-1].capture_end()


class PiecewiseCudaGraphRunner:
    def __init__(self, model_runner: GraphHost, token_counts: list[int]) -> None:
        self.model_runner = model_runner
        self.token_counts = token_counts
        self.max_tokens = token_counts[-1]
        device, dtype = model_runner.device, model_runner.dtype
        attn = model_runner.model.model.layers[0].self_attn.attn
        self.buffers = TokenInputBuffers(self.max_tokens, model_runner.kv_cache.padding_write_slot, device)
        # The attention's input and output between two pieces; zeros, so padding rows stay finite.
        self.queries = torch.zeros(self.max_tokens, attn.num_heads, attn.head_dim, dtype=dtype, device=device)
        self.outputs = torch.zeros_like(self.queries)  # [max_tokens, Hq, D]
        self.hidden = torch.zeros(self.max_tokens, model_runner.model_config.hidden_size, dtype=dtype, device=device)
        self.graphs: dict[int, PiecewiseGraph] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.capture()

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        return forward_batch.forward_mode.is_extend() and forward_batch.input_ids.shape[0] <= self.max_tokens

    def capture(self) -> None:
        started = time.perf_counter()
        stream = torch.cuda.Stream(self.model_runner.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for tokens in reversed(self.token_counts):
                self._body(tokens, _Splitter(self, tokens, None))  # compiles, sizes cuBLAS workspaces
                self.graphs[tokens] = self._capture(tokens)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize(self.model_runner.device)
        pieces = len(self.graphs[self.max_tokens].pieces)
        logger.info(
            "Piecewise CUDA graphs: captured %d extend token counts (%d ... %d) x %d pieces in %.1f s.",
            len(self.token_counts), self.token_counts[0], self.max_tokens, pieces, time.perf_counter() - started,
        )

    def _capture(self, tokens: int) -> PiecewiseGraph:
        graph = PiecewiseGraph()
        splitter = _Splitter(self, tokens, graph)
        splitter.begin_piece()
        self._body(tokens, splitter)
        splitter.end_piece()
        return graph

    def _body(self, tokens: int, splitter: _Splitter) -> None:
        runner = self.model_runner
        batch = self.buffers.batch(tokens)
        batch.kv_cache, batch.attention_split = runner.kv_cache, splitter
        self.hidden[:tokens].copy_(runner.model.model(batch))

    def replay(self, forward_batch: ForwardBatch) -> torch.Tensor:
        """The model body over the step's N tokens -> final hidden states [N, H]; the caller has
        set the attention backend's metadata for this batch."""
        n = forward_batch.input_ids.shape[0]
        padded = padded_token_count(n, self.token_counts)
        self.buffers.load(forward_batch, padded)
        graph = self.graphs[padded]
        backend, queries, outputs = self.model_runner.attn_backend, self.queries[:n], self.outputs[:n]
        for piece, layer in zip(graph.pieces, graph.layers):
            piece.replay()
            outputs.copy_(backend.forward(queries, layer, forward_batch))
        graph.pieces[-1].replay()
        return self.hidden[:n]
