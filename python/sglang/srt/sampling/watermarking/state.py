"""The sampler's watermark: per-batch rows (WatermarkRows, built with the SamplingBatchInfo) and the
per-request device state (WatermarkState, one row per request slot), which admits contexts and
records them; the selection itself is select.select_tokens.

For each watermarked row whose context is new to its request, the token is
  argmax_t log(u_t) / p_t
over the row's probabilities p after every filter (temperature, top-k, top-p, min-p: the support
every backend samples from), u_t from hashing.token_hashes; ties go to the lowest id. A context
already forced for the request, an empty context, a full history, or a row whose largest
probability exceeds max_probability (the entropy gate) samples normally. Greedy rows are never
watermark rows. Everything is tensor work over the batch's watermark rows: no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from sgl_kernel_ext.sampling.support import Support, compute_support
from sglang.srt.sampling.watermarking.config import MAX_CONTEXTS_PER_REQUEST, WatermarkSettings, parse_key
from sglang.srt.sampling.watermarking.detector import context_hash
from sglang.srt.sampling.watermarking.select import select_tokens

# sampling_batch_info.SamplingBatchInfo, which builds WatermarkRows from this module (no import back).
SamplingBatchInfo = Any


@dataclass
class WatermarkRows:
    """The watermarked rows of one batch (host-built; every tensor on the batch's device)."""

    rows: torch.Tensor  # [W] int64 batch rows
    rows_host: list[int]
    keys: torch.Tensor  # [W] int64 key A of each row
    windows: torch.Tensor  # [W] int64 context window of each row
    windows_host: list[int]

    @classmethod
    def build(cls, resolved: Sequence[Optional[dict]], greedy: Sequence[bool], device: torch.device) -> Optional["WatermarkRows"]:
        """From each row's resolved watermark ({"key", "context_window"} or None); greedy rows are left out."""
        rows = [i for i, (wm, g) in enumerate(zip(resolved, greedy)) if wm is not None and not g]
        if not rows:
            return None
        if any(set(resolved[i]) != {"key", "context_window"} for i in rows):
            raise ValueError("watermark must be resolved to {key, context_window} under a server policy "
                             "(config.resolve_request) before a batch is built.")
        windows = [resolved[i]["context_window"] for i in rows]
        return cls(
            rows=torch.tensor(rows, dtype=torch.int64, device=device),
            rows_host=rows,
            keys=torch.tensor([parse_key(resolved[i]["key"]) for i in rows], dtype=torch.int64, device=device),
            windows=torch.tensor(windows, dtype=torch.int64, device=device),
            windows_host=windows,
        )

    def __repr__(self) -> str:
        return f"WatermarkRows(rows={len(self.windows_host)})"


def _as_int32(hashes: torch.Tensor) -> torch.Tensor:
    """uint32 values in int64 -> the int32 with the same bits."""
    return torch.where(hashes >= (1 << 31), hashes - (1 << 32), hashes).to(torch.int32)


class WatermarkState:
    """Per request slot: the last `context_window` committed tokens (right-aligned) and the
    hashes of the contexts already forced (at most min(4096, context length))."""

    def __init__(
        self, settings: WatermarkSettings, num_slots: int, context_len: int, device: torch.device, kernels: Optional[bool] = None
    ) -> None:
        """`kernels`: select and update through the Triton kernels (default: on CUDA)."""
        self.kernels = device.type == "cuda" if kernels is None else kernels
        self.settings = settings
        self.width = settings.context_window
        self.capacity = min(MAX_CONTEXTS_PER_REQUEST, context_len)
        self.tails = torch.zeros((num_slots, self.width), dtype=torch.int64, device=device)  # [R, H]
        self.lengths = torch.zeros(num_slots, dtype=torch.int64, device=device)  # [R]
        self.history = torch.zeros((num_slots, self.capacity), dtype=torch.int32, device=device)  # [R, C]
        self.counts = torch.zeros(num_slots, dtype=torch.int64, device=device)  # [R]
        self._positions = torch.arange(self.capacity, device=device)  # [C]
        key_b = settings.key_b
        self.key_b = None if key_b is None else parse_key(key_b, "key_b")

    def start(
        self, slots: torch.Tensor, prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], windows: Sequence[int]
    ) -> None:
        """New requests in `slots` ([N] int64): each one's prompt and output so far (non-empty
        after a retraction, whose output's distinct contexts then count as already forced)."""
        device = self.tails.device
        tails = [(list(p) + list(o))[-self.width :] for p, o in zip(prompts, outputs)]
        padded = [[0] * (self.width - len(t)) + t for t in tails]
        self.tails[slots] = torch.tensor(padded, dtype=torch.int64, device=device)
        self.lengths[slots] = torch.tensor([len(t) for t in tails], dtype=torch.int64, device=device)
        self.counts[slots] = 0
        for i, (prompt, output, window) in enumerate(zip(prompts, outputs, windows)):
            history = _output_history(prompt, output, window, self.capacity) if output else []
            if history:
                slot = slots[i : i + 1]
                self.history[slot, : len(history)] = torch.tensor([history], dtype=torch.int32, device=device)
                self.counts[slot] = len(history)

    def force(self, logits: torch.Tensor, info: SamplingBatchInfo, slots: torch.Tensor) -> torch.Tensor:
        """[B] int64: the watermark's token on each forced row of the processed, unscaled `logits`
        ([B, V] float32), -1 elsewhere; the forced contexts are recorded. `slots` ([B] int64)
        are the rows' request slots."""
        wm: WatermarkRows = info.watermark
        rows = wm.rows
        slot = slots.index_select(0, rows)  # [W]
        probs, support = _filtered_probs(logits.index_select(0, rows), info, rows)  # [W, V] float32
        key_b, threshold = self.key_b, self.settings.mixing_threshold
        chosen, ctx, row_max = select_tokens(probs, support, slot, self.tails, self.lengths, wm.windows, wm.keys, key_b,
                                             threshold, self.kernels)
        if self.kernels:
            return self._admit(rows, slots, chosen, ctx, row_max, wm.windows, logits.shape[0])
        lengths = torch.minimum(self.lengths.index_select(0, slot), wm.windows)  # [W]
        ctx32 = _as_int32(ctx)
        counts = self.counts.index_select(0, slot)
        seen = (self.history.index_select(0, slot) == ctx32[:, None]) & (self._positions[None, :] < counts[:, None])
        eligible = (lengths > 0) & ~seen.any(dim=1) & (counts < self.capacity)
        eligible &= (row_max > 0) & (row_max <= self.settings.max_probability)
        self._record(slot, counts, ctx32, eligible)
        forced = torch.full((logits.shape[0],), -1, dtype=torch.int64, device=logits.device)
        return forced.index_copy(0, rows, torch.where(eligible, chosen, torch.full_like(chosen, -1)))

    def force_from_stats(
        self, logits: torch.Tensor, temperatures: torch.Tensor, result: Any, slots: torch.Tensor, rows: torch.Tensor,
        keys: torch.Tensor, windows: torch.Tensor, active: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """force() through the kernels over the distribution a fused sampler (the triton backend)
        drew from: p_t = exp(logits_t / T - lse_kept) on its support, from `result`'s row
        statistics (threshold, lse_kept: [B] float32), never materialised. `rows` ([W] int64 batch
        rows) with their `keys` and `windows` ([W] int64); `active` ([W] bool, or None: every
        row) marks the watermarked ones (the sampling graph passes every row of its bucket)."""
        from sgl_kernel_ext.sampling.watermark_triton import SupportStats, watermark_select_triton

        slot = slots.index_select(0, rows)  # [W]
        chosen, ctx, row_max = watermark_select_triton(
            logits, slot, self.tails, self.lengths, windows, keys, self.key_b, self.settings.mixing_threshold,
            stats=SupportStats(rows, temperatures, result.threshold, result.lse_kept), active=active,
        )
        return self._admit(rows, slots, chosen, ctx, row_max, windows, logits.shape[0], active)

    def _admit(self, rows, slots, chosen, ctx, row_max, windows, batch_size: int, active=None) -> torch.Tensor:
        from sgl_kernel_ext.sampling.watermark_triton import watermark_admit_triton

        return watermark_admit_triton(rows, slots, chosen, ctx, row_max, self.lengths, windows, self.history, self.counts,
                                      batch_size, self.settings.max_probability, active)

    def _record(self, slot: torch.Tensor, counts: torch.Tensor, ctx32: torch.Tensor, forced: torch.Tensor) -> None:
        at = counts.clamp(max=self.capacity - 1)
        current = self.history[slot, at]
        self.history[slot, at] = torch.where(forced, ctx32, current)
        self.counts[slot] = counts + forced.to(torch.int64)

    def snapshot(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The committed state of request slots `slots` ([W] int64): (tails [W, H], lengths [W],
        counts [W]); the history past a slot's count is never read."""
        return self.tails.index_select(0, slots), self.lengths.index_select(0, slots), self.counts.index_select(0, slots)

    def restore(self, slots: torch.Tensor, snapshot: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        """Set slots `slots` back to `snapshot` (from snapshot()): contexts recorded since are forgotten."""
        tails, lengths, counts = snapshot
        self.tails.index_copy_(0, slots, tails)
        self.lengths.index_copy_(0, slots, lengths)
        self.counts.index_copy_(0, slots, counts)

    def append(self, info: SamplingBatchInfo, slots: torch.Tensor, next_ids: torch.Tensor) -> None:
        """Push each watermark row's sampled id ([B] int64) onto its slot's context tail."""
        rows = info.watermark.rows
        if self.kernels:
            self.append_rows(rows, slots, next_ids)
            return
        slot = slots.index_select(0, rows)
        tails = torch.cat([self.tails.index_select(0, slot)[:, 1:], next_ids.index_select(0, rows)[:, None]], dim=1)
        self.tails[slot] = tails
        self.lengths[slot] = (self.lengths.index_select(0, slot) + 1).clamp(max=self.width)

    def append_rows(
        self, rows: torch.Tensor, slots: torch.Tensor, next_ids: torch.Tensor, active: Optional[torch.Tensor] = None
    ) -> None:
        """append() through the kernel for batch rows `rows` ([W] int64), those `active` marks."""
        from sgl_kernel_ext.sampling.watermark_triton import watermark_append_triton

        watermark_append_triton(rows, slots, next_ids, self.tails, self.lengths, active)


def _filtered_probs(logits: torch.Tensor, info: SamplingBatchInfo, rows: torch.Tensor) -> tuple[torch.Tensor, Optional[Support]]:
    """[W, V] float32 softmax of the rows' temperature-scaled logits over their sampling support,
    and the support (None when no filter ran: the whole vocabulary)."""
    scaled = logits / info.temperatures.index_select(0, rows)
    support = None
    if info.need_top_k_sampling or info.need_top_p_sampling or info.need_min_p_sampling:
        support = compute_support(
            scaled,
            info.top_ks.index_select(0, rows),
            info.top_ps.index_select(0, rows),
            info.min_ps.index_select(0, rows),
            window=info.max_top_k,
            need_top_p=info.need_top_p_sampling,
            need_min_p=info.need_min_p_sampling,
        )
        scaled.masked_fill_(~support.keeps(scaled), float("-inf"))  # scaled is this function's own tensor
    return torch.softmax(scaled, dim=1), support


def _output_history(prompt: Sequence[int], output: Sequence[int], window: int, capacity: int) -> list[int]:
    """The int32 hashes of the distinct contexts of the output positions, the first `capacity` of them."""
    ids = list(prompt) + list(output)
    hashes: list[int] = []
    found: set[int] = set()
    for pos in range(len(prompt), len(ids)):
        h = context_hash(ids[max(0, pos - window) : pos])
        if h not in found:
            found.add(h)
            hashes.append(h - (1 << 32) if h >= (1 << 31) else h)
            if len(hashes) == capacity:
                break
    return hashes
