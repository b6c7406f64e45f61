"""Sparse per-row token histories: the distinct tokens a row has seen and how often.

Penalties only touch the tokens a row has actually seen, so a padded [B, L] list of distinct
ids (L = the longest row's distinct count, far below the vocabulary) replaces dense [B, V]
accumulators. Every method after construction is batched tensor work with no host sync, so
it can run on the decode hot path.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional

import torch

from sgl_kernel_ext.sampling.token_counts_reference import token_counts_add_reference

PAD_ID = -1
_MIN_CAPACITY = 16


class TokenCounts:
    """Distinct tokens per row, left-packed, with occurrence counts.

    Row b holds its distinct tokens in slots [0, lengths[b]); later slots are PAD_ID with count 0.
    `width` is a host-side upper bound on max(lengths): it grows by one per recorded step (knowing
    whether any row really gained a token would need a device sync) and is re-tightened on `filter`
    (on CUDA from an asynchronous read-back, adopted at a later filter once it has landed). The
    storage always has a free column past `width`, so a kernel can record the next step's token
    with no host decision in between (the CUDA graph of a sampling step does).
    """

    def __init__(self, ids: torch.Tensor, counts: torch.Tensor, lengths: torch.Tensor, width: int) -> None:
        self._ids = ids  # [B, capacity] int64, PAD_ID beyond each row's length
        self._counts = counts  # [B, capacity] float32, 0 beyond each row's length
        self._lengths = lengths  # [B, 1] int64
        self.width = width
        # CUDA: (pinned max(lengths) at the last filter, its copy's event, width then).
        self._pending_max: Optional[tuple[torch.Tensor, torch.cuda.Event, int]] = None

    @classmethod
    def from_lists(cls, histories: list[list[int]], device: torch.device | str) -> TokenCounts:
        """Build from host token lists (negative ids are ignored)."""
        rows = [Counter(t for t in history if t >= 0) for history in histories]
        width = max((len(row) for row in rows), default=0)
        capacity = max(_MIN_CAPACITY, width + 1)
        ids = torch.full((len(rows), capacity), PAD_ID, dtype=torch.int64)  # [B, C]
        counts = torch.zeros((len(rows), capacity), dtype=torch.float32)  # [B, C]
        for b, row in enumerate(rows):
            if row:
                ids[b, : len(row)] = torch.tensor(list(row.keys()), dtype=torch.int64)
                counts[b, : len(row)] = torch.tensor(list(row.values()), dtype=torch.float32)
        lengths = torch.tensor([[len(row)] for row in rows], dtype=torch.int64).reshape(-1, 1)  # [B, 1]
        return cls(ids.to(device), counts.to(device), lengths.to(device), width)

    @property
    def ids(self) -> torch.Tensor:
        """[B, width] int64 distinct ids, PAD_ID where unused."""
        return self._ids[:, : self.width]

    @property
    def counts(self) -> torch.Tensor:
        """[B, width] float32 occurrence counts, 0 where unused."""
        return self._counts[:, : self.width]

    @property
    def storage(self) -> tuple[torch.Tensor, torch.Tensor]:
        """([B, capacity] int64 ids, [B, capacity] float32 counts): all columns, for kernels that
        bound each row by its length and record into the free column past it."""
        return self._ids, self._counts

    @property
    def lengths(self) -> torch.Tensor:
        """[B, 1] int64 number of distinct ids per row."""
        return self._lengths

    @property
    def capacity(self) -> int:
        return self._ids.shape[1]

    def __len__(self) -> int:
        return self._ids.shape[0]

    def add(self, tokens: torch.Tensor) -> None:
        """Record one token per row; negative ids (rows the sampler flagged invalid) are skipped."""
        tokens = tokens.to(device=self._ids.device, dtype=torch.int64)
        if self._ids.is_cuda:
            _add_kernel()(self._ids, self._counts, self._lengths, tokens)
        else:
            token_counts_add_reference(self._ids, self._counts, self._lengths, tokens, self.width)
        self.record_added()

    def record_added(self) -> None:
        """Account on the host for a step whose tokens a kernel recorded on the device (each row
        gained at most one id), keeping a free column for the next one."""
        self.width += 1
        self._reserve(self.width + 1)

    def filter(self, keep: torch.Tensor) -> None:
        """Keep rows `keep` (int64 indices, in that order)."""
        keep = keep.to(self._ids.device)
        self._ids = self._ids.index_select(0, keep)
        self._counts = self._counts.index_select(0, keep)
        self._lengths = self._lengths.index_select(0, keep)
        self._tighten_width()

    def _tighten_width(self) -> None:
        """Re-tighten the bound, which otherwise grows with every step of a long-lived batch."""
        if not len(self):
            self.width, self._pending_max = 0, None
        elif not self._lengths.is_cuda:
            self.width = int(self._lengths.max())
        else:
            # Reading the max now would wait for the step in flight: adopt the previous filter's
            # read-back if it has landed, and start this one's.
            self._adopt_pending_max()
            snapshot = torch.empty((), dtype=torch.int64, pin_memory=True)
            snapshot.copy_(self._lengths.max(), non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._pending_max = (snapshot, event, self.width)

    def _adopt_pending_max(self) -> None:
        if self._pending_max is None or not self._pending_max[1].query():
            return
        snapshot, _, width_then = self._pending_max
        # Rows only left since then (filter), and each add grew a row by at most one column.
        self.width = min(self.width, int(snapshot) + self.width - width_then)
        self._pending_max = None

    def merge(self, other: TokenCounts) -> None:
        """Append `other`'s rows after this one's."""
        capacity = max(self.capacity, other.capacity, max(self.width, other.width) + 1)
        ids, counts = _pad_columns(self._ids, self._counts, capacity)
        other_ids, other_counts = _pad_columns(other._ids, other._counts, capacity)
        self._ids = torch.cat([ids, other_ids])
        self._counts = torch.cat([counts, other_counts])
        self._lengths = torch.cat([self._lengths, other._lengths])
        self.width = max(self.width, other.width)
        self._pending_max = None  # the new rows are not in the snapshot

    def _reserve(self, needed: int) -> None:
        # Doubling keeps re-allocation to O(log steps) over a request's life.
        if needed > self.capacity:
            capacity = max(needed, 2 * self.capacity, _MIN_CAPACITY)
            self._ids, self._counts = _pad_columns(self._ids, self._counts, capacity)


def _pad_columns(
    ids: torch.Tensor, counts: torch.Tensor, capacity: int
) -> tuple[torch.Tensor, torch.Tensor]:
    extra = capacity - ids.shape[1]
    if extra <= 0:
        return ids, counts
    rows = ids.shape[0]
    pad_ids = torch.full((rows, extra), PAD_ID, dtype=ids.dtype, device=ids.device)  # [B, extra]
    pad_counts = torch.zeros((rows, extra), dtype=counts.dtype, device=counts.device)  # [B, extra]
    return torch.cat([ids, pad_ids], dim=1), torch.cat([counts, pad_counts], dim=1)


def _add_kernel():
    # Imported on first CUDA use: a CPU install need not import Triton.
    from sgl_kernel_ext.sampling.token_counts import token_counts_add_triton

    return token_counts_add_triton
