"""Watermarked rows inside a captured sampling graph (model_executor/sampling_graph.py).

The graph runs the watermark over every row of its bucket with static inputs: whether the row is
watermarked, its key A and its context window. Unmarked, guide and padding rows pick nothing,
are never admitted and leave their slots alone. The selection reads the triton sampler's support
statistics (WatermarkState.force_from_stats), as the eager step over the same backend does, so a
replayed step forces the same tokens and leaves the same state (test/sampling/test_sampling_graph.py).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from sglang.srt.sampling.watermarking.state import WatermarkRows, WatermarkState


class WatermarkGraphInputs:
    """The static per-row watermark inputs of the sampling graphs, [max_bs] rows each, over the
    server's WatermarkState (whose tensors keep their addresses)."""

    def __init__(self, state: WatermarkState, max_bs: int, device: torch.device) -> None:
        self.state = state
        self.rows = torch.arange(max_bs, dtype=torch.int64, device=device)  # [max_bs]: row i is batch row i
        self.active = torch.zeros(max_bs, dtype=torch.bool, device=device)  # [max_bs]
        self.keys = torch.zeros(max_bs, dtype=torch.int64, device=device)  # [max_bs]
        self.windows = torch.ones(max_bs, dtype=torch.int64, device=device)  # [max_bs]
        self._loaded: Optional[WatermarkRows] = None

    def load(self, rows: WatermarkRows, padded: int) -> None:
        """Mark the watermarked rows of the batch (over the `padded` rows of its bucket); the rows
        already loaded are not copied again."""
        if self._loaded is rows:
            return
        self.active[:padded].fill_(False)
        self.active.index_fill_(0, rows.rows, True)
        self.keys.index_copy_(0, rows.rows, rows.keys)
        self.windows.index_copy_(0, rows.rows, rows.windows)
        self._loaded = rows

    def force(self, logits: torch.Tensor, temperatures: torch.Tensor, result: Any, slots: torch.Tensor) -> torch.Tensor:
        """[bs] int64 forced tokens (-1 where a row samples normally) of the bucket's `logits`
        ([bs, V] float32) from the sampling kernel's `result`; `slots` ([bs] int64) request slots."""
        bs = logits.shape[0]
        return self.state.force_from_stats(
            logits, temperatures, result, slots, self.rows[:bs], self.keys[:bs], self.windows[:bs], self.active[:bs]
        )

    def append(self, slots: torch.Tensor, next_ids: torch.Tensor) -> None:
        """Push the watermarked rows' tokens ([bs] int64) onto their slots' context tails."""
        bs = next_ids.shape[0]
        self.state.append_rows(self.rows[:bs], slots, next_ids, self.active[:bs])
