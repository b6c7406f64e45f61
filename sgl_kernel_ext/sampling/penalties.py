"""Sparse logit adjustments in place, one launch: frequency, presence, min_new_tokens, repetition,
logit_bias, touching only the listed tokens of each row; and the per-step update of the penalty
state (the sampled token of each row recorded in its histories), one launch.

The kernels read the lists through a `PenaltyTable`: a small device table of addresses, row
strides and widths that the host rewrites only when a list moves (a batch filtered or merged, a
history outgrowing its storage). A kernel's arguments are therefore the same every step, which
lets a CUDA graph capture it once and replay it with whatever penalty state the batch holds then;
lists grow on the device (the histories' per-row lengths bound the loops), not in the arguments.

Same order and float operations as SamplingBatchInfo.apply_logits_bias on its torch path
(additive penalties, then repetition scaling, then the bias), so results are equal bit for bit
except that a zero bias is skipped (the torch path's pads add +0.0, which can turn -0.0 into 0.0).
Each list holds distinct ids per row, so no two lanes of a phase write the same logit; a CTA
barrier separates the phases, which may touch the same token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.sampling.token_counts import add_token
from sgl_kernel_ext.sampling.token_counts_reference import token_counts_add_reference
from sgl_kernel_ext.triton_launch import launch, pdl_sync

BLOCK = 128

# The table: int64 slots. A list whose first slot is 0 is absent; that slot is the address of a
# tensor that is never empty when the list is present (an empty tensor's address may be 0).
N_ROWS = 0
FREQ, PRES, REP = 1, 6, 11  # histories: lengths, ids, counts, row stride, penalty
STOP = 16  # output_lens, min_new_tokens, ids, row stride, width
BIAS = 21  # values, ids, row stride, width
TABLE_SIZE = 25
# The same slots for the kernels (a jit function reads only constexpr globals).
_N_ROWS, _FREQ, _PRES, _REP, _STOP, _BIAS = (tl.constexpr(slot) for slot in (N_ROWS, FREQ, PRES, REP, STOP, BIAS))


@dataclass
class PenaltyLists:
    """Per-row sparse lists; any of them may be None. Ids are int64, pads are negative; the
    histories (freq, pres, rep) are left-packed: row b's ids are in [0, lengths[b]), and their
    ids / counts are the whole storage, with a free column past the longest row (the update
    kernel records a new id at [b, lengths[b]])."""

    freq_ids: Optional[torch.Tensor] = None  # [B, Wf] output tokens
    freq_counts: Optional[torch.Tensor] = None  # [B, Wf] float32 occurrences
    freq_lengths: Optional[torch.Tensor] = None  # [B, 1] int64
    freq_penalty: Optional[torch.Tensor] = None  # [B, 1] float32
    pres_ids: Optional[torch.Tensor] = None  # [B, Wp] output tokens
    pres_counts: Optional[torch.Tensor] = None  # [B, Wp] float32 occurrences
    pres_lengths: Optional[torch.Tensor] = None  # [B, 1] int64
    pres_penalty: Optional[torch.Tensor] = None  # [B, 1] float32
    stop_ids: Optional[torch.Tensor] = None  # [B, S] banned while output_lens < min_new_tokens
    output_lens: Optional[torch.Tensor] = None  # [B, 1] int64
    min_new_tokens: Optional[torch.Tensor] = None  # [B, 1] int64
    rep_ids: Optional[torch.Tensor] = None  # [B, Wr] prompt + output tokens
    rep_counts: Optional[torch.Tensor] = None  # [B, Wr] float32 occurrences
    rep_lengths: Optional[torch.Tensor] = None  # [B, 1] int64
    rep_penalty: Optional[torch.Tensor] = None  # [B, 1] float32
    bias_ids: Optional[torch.Tensor] = None  # [B, K] (pads: id 0 with value 0.0)
    bias_values: Optional[torch.Tensor] = None  # [B, K] float32

    @property
    def empty(self) -> bool:
        return all(ids is None for ids in (self.freq_ids, self.pres_ids, self.stop_ids, self.rep_ids, self.bias_ids))

    def table_values(self, n_rows: int) -> tuple[int, ...]:
        """The table's slots for these lists over their first `n_rows` rows."""
        values = [0] * TABLE_SIZE
        values[N_ROWS] = n_rows
        for base, ids, counts, lengths, penalty in (
            (FREQ, self.freq_ids, self.freq_counts, self.freq_lengths, self.freq_penalty),
            (PRES, self.pres_ids, self.pres_counts, self.pres_lengths, self.pres_penalty),
            (REP, self.rep_ids, self.rep_counts, self.rep_lengths, self.rep_penalty),
        ):
            if ids is not None:
                _check_history(ids, counts, lengths, penalty)
                values[base:base + 5] = [lengths.data_ptr(), ids.data_ptr(), counts.data_ptr(), ids.stride(0), penalty.data_ptr()]
        if self.stop_ids is not None:
            _check_columns(self.output_lens, self.min_new_tokens)
            values[STOP:STOP + 5] = [
                self.output_lens.data_ptr(), self.min_new_tokens.data_ptr(),
                self.stop_ids.data_ptr(), self.stop_ids.stride(0), self.stop_ids.shape[1],
            ]
        if self.bias_ids is not None:
            assert self.bias_ids.stride() == self.bias_values.stride() and self.bias_ids.stride(1) == 1
            assert self.bias_ids.numel() > 0, "an empty bias list is passed as None"
            values[BIAS:BIAS + 4] = [self.bias_values.data_ptr(), self.bias_ids.data_ptr(), self.bias_ids.stride(0), self.bias_ids.shape[1]]
        return tuple(values)


def _check_history(ids: torch.Tensor, counts: torch.Tensor, lengths: torch.Tensor, penalty: torch.Tensor) -> None:
    assert ids.stride() == counts.stride() and ids.stride(1) == 1, "ids and counts share one row-major layout"
    _check_columns(lengths, penalty)


def _check_columns(*columns: torch.Tensor) -> None:
    assert all(c.is_contiguous() for c in columns), "per-row columns are contiguous [B, 1]"


class PenaltyTable:
    """The device table the kernels read, at a fixed address for its lifetime (a captured graph
    keeps reading it). `write` uploads new slots only when they changed. It holds raw addresses:
    write the current lists (or `clear`) before every launch that reads it, since the tensors of
    an earlier write may be gone."""

    def __init__(self, device: torch.device) -> None:
        # A normal tensor even when first made inside inference mode (a graph capture): the process
        # keeps one table, and later writes may run outside that mode.
        with torch.inference_mode(False):
            self.table = torch.zeros(TABLE_SIZE, dtype=torch.int64, device=device)  # [TABLE_SIZE] int64
        self._written: Optional[tuple[int, ...]] = None

    def write(self, lists: PenaltyLists, n_rows: int) -> None:
        values = lists.table_values(n_rows)
        if values == self._written:
            return
        if self.table.is_cuda and torch.cuda.is_current_stream_capturing():
            # The copy would be captured and replayed from a host buffer that is gone by then.
            raise RuntimeError("PenaltyTable.write: write the table before capturing a CUDA graph, not during.")
        host = torch.tensor(values, dtype=torch.int64)
        if self.table.is_cuda:
            # A fresh pinned buffer: the caching host allocator reuses it only after this copy ran.
            host = host.pin_memory()
        self.table.copy_(host, non_blocking=True)
        self._written = values

    def clear(self) -> None:
        """No rows, no lists: a launch reading the table touches nothing (graph capture warm-ups)."""
        self.write(PenaltyLists(), 0)


@triton.jit
def _ptr(table_ptr, slot, dtype: tl.constexpr):
    return tl.load(table_ptr + slot).to(tl.pointer_type(dtype))


@triton.jit
def _additive(row_ptr, table_ptr, base, row, PRESENCE: tl.constexpr, BLOCK: tl.constexpr):
    offset = row.to(tl.int64) * tl.load(table_ptr + base + 3)
    length = tl.load(_ptr(table_ptr, base, tl.int64) + row)
    ids_ptr = _ptr(table_ptr, base + 1, tl.int64) + offset
    counts_ptr = _ptr(table_ptr, base + 2, tl.float32) + offset
    penalty = tl.load(_ptr(table_ptr, base + 4, tl.float32) + row)
    for start in range(0, length, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        live = offs < length
        ids = tl.load(ids_ptr + offs, mask=live, other=-1)
        counts = tl.load(counts_ptr + offs, mask=live, other=0.0)
        if PRESENCE:
            weight = tl.where(counts > 0, 1.0, 0.0)
        else:
            weight = counts
        x = tl.load(row_ptr + ids, mask=live)
        tl.store(row_ptr + ids, x + (-penalty) * weight, mask=live)


@triton.jit
def _apply_kernel(logits_ptr, stride, table_ptr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_sync(PDL)
    row = tl.program_id(0)
    if row < tl.load(table_ptr + _N_ROWS):
        row_ptr = logits_ptr + row.to(tl.int64) * stride
        if tl.load(table_ptr + _FREQ) != 0:
            _additive(row_ptr, table_ptr, _FREQ, row, False, BLOCK)
            tl.debug_barrier()
        if tl.load(table_ptr + _PRES) != 0:
            _additive(row_ptr, table_ptr, _PRES, row, True, BLOCK)
            tl.debug_barrier()
        if tl.load(table_ptr + _STOP) != 0:
            if tl.load(_ptr(table_ptr, _STOP, tl.int64) + row) < tl.load(_ptr(table_ptr, _STOP + 1, tl.int64) + row):
                stop_ptr = _ptr(table_ptr, _STOP + 2, tl.int64) + row.to(tl.int64) * tl.load(table_ptr + _STOP + 3)
                width = tl.load(table_ptr + _STOP + 4)
                for start in range(0, width, BLOCK):
                    offs = start + tl.arange(0, BLOCK)
                    ids = tl.load(stop_ptr + offs, mask=offs < width, other=-1)
                    x = tl.load(row_ptr + ids, mask=ids >= 0)
                    tl.store(row_ptr + ids, x + float("-inf"), mask=ids >= 0)
            tl.debug_barrier()
        if tl.load(table_ptr + _REP) != 0:
            offset = row.to(tl.int64) * tl.load(table_ptr + _REP + 3)
            length = tl.load(_ptr(table_ptr, _REP, tl.int64) + row)
            rep_ptr = _ptr(table_ptr, _REP + 1, tl.int64) + offset
            penalty = tl.load(_ptr(table_ptr, _REP + 4, tl.float32) + row)
            for start in range(0, length, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                live = offs < length
                ids = tl.load(rep_ptr + offs, mask=live, other=0)
                x = tl.load(row_ptr + ids, mask=live)
                scaled = tl.where(x > 0, tl.math.div_rn(x, penalty), x * penalty)
                tl.store(row_ptr + ids, scaled, mask=live)
            tl.debug_barrier()
        if tl.load(table_ptr + _BIAS) != 0:
            offset = row.to(tl.int64) * tl.load(table_ptr + _BIAS + 2)
            vals_ptr = _ptr(table_ptr, _BIAS, tl.float32) + offset
            ids_ptr = _ptr(table_ptr, _BIAS + 1, tl.int64) + offset
            width = tl.load(table_ptr + _BIAS + 3)
            for start in range(0, width, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                ids = tl.load(ids_ptr + offs, mask=offs < width, other=0)
                bias = tl.load(vals_ptr + offs, mask=offs < width, other=0.0)
                live = bias != 0.0
                x = tl.load(row_ptr + ids, mask=live)
                tl.store(row_ptr + ids, x + bias, mask=live)


@triton.jit
def _record(table_ptr, base, row, tok, BLOCK: tl.constexpr):
    offset = row.to(tl.int64) * tl.load(table_ptr + base + 3)
    add_token(
        _ptr(table_ptr, base + 1, tl.int64) + offset, _ptr(table_ptr, base + 2, tl.float32) + offset,
        _ptr(table_ptr, base, tl.int64) + row, tok, BLOCK,
    )


@triton.jit
def _update_kernel(tokens_ptr, tokens_stride, table_ptr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_sync(PDL)
    row = tl.program_id(0)
    if row < tl.load(table_ptr + _N_ROWS):
        tok = tl.load(tokens_ptr + row.to(tl.int64) * tokens_stride)
        if tok >= 0:  # negative: a row the sampler flagged, nothing to record
            if tl.load(table_ptr + _FREQ) != 0:
                _record(table_ptr, _FREQ, row, tok, BLOCK)
            if tl.load(table_ptr + _PRES) != 0:
                _record(table_ptr, _PRES, row, tok, BLOCK)
            if tl.load(table_ptr + _REP) != 0:
                _record(table_ptr, _REP, row, tok, BLOCK)
            if tl.load(table_ptr + _STOP) != 0:
                lens_ptr = _ptr(table_ptr, _STOP, tl.int64) + row
                tl.store(lens_ptr, tl.load(lens_ptr) + 1)


def apply_penalties_triton(logits: torch.Tensor, table: PenaltyTable) -> None:
    """Apply the table's lists to rows [0, n_rows) of `logits` ([>= n_rows, V] float32, unit
    stride along V) in place; one program per row of `logits`, so a graph captured over a padded
    batch serves any n_rows up to it."""
    launch(_apply_kernel, (logits.shape[0],), logits, logits.stride(0), table.table, BLOCK=BLOCK,
        # x + (-p) * c must round twice, as the torch path does, not once as a fused multiply-add.
        enable_fp_fusion=False, pdl=True)


def update_penalties_triton(tokens: torch.Tensor, table: PenaltyTable) -> None:
    """Record tokens[b] ([>= n_rows] int64, any stride: a column of a [B, K] draft matrix too;
    negative = none) in row b's histories and count it in its output length, for rows
    [0, n_rows). Every history needs room for one more id per row."""
    launch(_update_kernel, (tokens.shape[0],), tokens, tokens.stride(0), table.table, BLOCK=BLOCK, pdl=True)


# ---------------------------------------------------------------------------------- references


def apply_penalties_reference(logits: torch.Tensor, lists: PenaltyLists) -> None:
    """The same function in plain torch (the penalizers' scatter formulation)."""
    for ids, counts, penalty, presence in (
        (lists.freq_ids, lists.freq_counts, lists.freq_penalty, False),
        (lists.pres_ids, lists.pres_counts, lists.pres_penalty, True),
    ):
        if ids is not None:
            weight = (counts > 0).to(torch.float32) if presence else counts
            logits.scatter_add_(1, ids.clamp(min=0), torch.where(ids >= 0, -penalty * weight, 0.0))
    if lists.stop_ids is not None:
        active = (lists.output_lens < lists.min_new_tokens) & (lists.stop_ids >= 0)  # [B, S]
        ban = torch.zeros_like(lists.stop_ids, dtype=logits.dtype).masked_fill_(active, float("-inf"))
        logits.scatter_add_(1, lists.stop_ids.clamp(min=0), ban)
    if lists.rep_ids is not None:
        for row in range(logits.shape[0]):
            ids = lists.rep_ids[row][lists.rep_ids[row] >= 0]
            old = logits[row, ids]
            penalty = lists.rep_penalty[row]
            logits[row, ids] = torch.where(old > 0, old / penalty, old * penalty)
    if lists.bias_ids is not None:
        logits.scatter_add_(1, lists.bias_ids, lists.bias_values)


def update_penalties_reference(tokens: torch.Tensor, lists: PenaltyLists) -> None:
    """The update in plain torch. Each history's ids/counts must be views with room for one more id."""
    for ids, counts, lengths in (
        (lists.freq_ids, lists.freq_counts, lists.freq_lengths),
        (lists.pres_ids, lists.pres_counts, lists.pres_lengths),
        (lists.rep_ids, lists.rep_counts, lists.rep_lengths),
    ):
        if ids is not None:
            token_counts_add_reference(ids, counts, lengths, tokens, ids.shape[1] - 1)
    if lists.output_lens is not None:
        lists.output_lens.add_((tokens >= 0).reshape(-1, 1))
