"""Sparse logit adjustments in place, one launch: frequency, presence, min_new_tokens, repetition,
logit_bias, touching only the listed tokens of each row.

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

from sgl_kernel_ext.triton_launch import launch

BLOCK = 128


@dataclass
class PenaltyLists:
    """Per-row sparse lists; any of them may be None. Ids are int64, pads are negative."""

    freq_ids: Optional[torch.Tensor] = None  # [B, Wf] output tokens
    freq_counts: Optional[torch.Tensor] = None  # [B, Wf] float32 occurrences
    freq_penalty: Optional[torch.Tensor] = None  # [B, 1] float32
    pres_ids: Optional[torch.Tensor] = None  # [B, Wp] output tokens
    pres_counts: Optional[torch.Tensor] = None  # [B, Wp] float32 occurrences
    pres_penalty: Optional[torch.Tensor] = None  # [B, 1] float32
    stop_ids: Optional[torch.Tensor] = None  # [B, S] banned while output_lens < min_new_tokens
    output_lens: Optional[torch.Tensor] = None  # [B, 1] int64
    min_new_tokens: Optional[torch.Tensor] = None  # [B, 1] int64
    rep_ids: Optional[torch.Tensor] = None  # [B, Wr] prompt + output tokens
    rep_penalty: Optional[torch.Tensor] = None  # [B, 1] float32
    bias_ids: Optional[torch.Tensor] = None  # [B, K] (pads: id 0 with value 0.0)
    bias_values: Optional[torch.Tensor] = None  # [B, K] float32

    @property
    def empty(self) -> bool:
        return all(ids is None for ids in (self.freq_ids, self.pres_ids, self.stop_ids, self.rep_ids, self.bias_ids))


@triton.jit
def _additive(row_ptr, ids_ptr, counts_ptr, penalty, W, PRESENCE: tl.constexpr, BLOCK: tl.constexpr):
    for start in range(0, W, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ids = tl.load(ids_ptr + offs, mask=offs < W, other=-1)
        counts = tl.load(counts_ptr + offs, mask=offs < W, other=0.0)
        live = ids >= 0
        if PRESENCE:
            weight = tl.where(counts > 0, 1.0, 0.0)
        else:
            weight = counts
        x = tl.load(row_ptr + ids, mask=live)
        tl.store(row_ptr + ids, x + (-penalty) * weight, mask=live)


# The lists' widths, strides and presence change with the batch: specialising on them would
# compile in the serving loop, so they are runtime values (one compiled kernel for every batch).
@triton.jit(do_not_specialize=[
    "freq_stride", "Wf", "pres_stride", "Wp", "stop_stride", "S", "rep_stride", "Wr", "bias_stride", "K",
    "HAS_FREQ", "HAS_PRES", "HAS_MIN_NEW", "HAS_REP", "HAS_BIAS",
])
def _penalties_kernel(
    logits_ptr, stride,
    freq_ids_ptr, freq_counts_ptr, freq_pen_ptr, freq_stride, Wf,
    pres_ids_ptr, pres_counts_ptr, pres_pen_ptr, pres_stride, Wp,
    stop_ids_ptr, out_lens_ptr, min_new_ptr, stop_stride, S,
    rep_ids_ptr, rep_pen_ptr, rep_stride, Wr,
    bias_ids_ptr, bias_vals_ptr, bias_stride, K,
    HAS_FREQ, HAS_PRES, HAS_MIN_NEW, HAS_REP, HAS_BIAS, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    if HAS_FREQ != 0:
        base = row.to(tl.int64) * freq_stride
        _additive(row_ptr, freq_ids_ptr + base, freq_counts_ptr + base, tl.load(freq_pen_ptr + row), Wf, False, BLOCK)
        tl.debug_barrier()
    if HAS_PRES != 0:
        base = row.to(tl.int64) * pres_stride
        _additive(row_ptr, pres_ids_ptr + base, pres_counts_ptr + base, tl.load(pres_pen_ptr + row), Wp, True, BLOCK)
        tl.debug_barrier()
    if HAS_MIN_NEW != 0:
        if tl.load(out_lens_ptr + row) < tl.load(min_new_ptr + row):
            for start in range(0, S, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                ids = tl.load(stop_ids_ptr + row.to(tl.int64) * stop_stride + offs, mask=offs < S, other=-1)
                x = tl.load(row_ptr + ids, mask=ids >= 0)
                tl.store(row_ptr + ids, x + float("-inf"), mask=ids >= 0)
        tl.debug_barrier()
    if HAS_REP != 0:
        penalty = tl.load(rep_pen_ptr + row)
        for start in range(0, Wr, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            ids = tl.load(rep_ids_ptr + row.to(tl.int64) * rep_stride + offs, mask=offs < Wr, other=-1)
            x = tl.load(row_ptr + ids, mask=ids >= 0)
            scaled = tl.where(x > 0, tl.math.div_rn(x, penalty), x * penalty)
            tl.store(row_ptr + ids, scaled, mask=ids >= 0)
        tl.debug_barrier()
    if HAS_BIAS != 0:
        for start in range(0, K, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            ids = tl.load(bias_ids_ptr + row.to(tl.int64) * bias_stride + offs, mask=offs < K, other=0)
            bias = tl.load(bias_vals_ptr + row.to(tl.int64) * bias_stride + offs, mask=offs < K, other=0.0)
            live = bias != 0.0
            x = tl.load(row_ptr + ids, mask=live)
            tl.store(row_ptr + ids, x + bias, mask=live)


def _list_args(logits: torch.Tensor, ids: Optional[torch.Tensor], *per_row: Optional[torch.Tensor],
               dtypes: tuple[torch.dtype, ...]) -> list:
    """Pointers, row stride and width of one list (its per-entry tensors share the ids' stride);
    an absent list passes empty stand-ins of the same dtypes (a pointer's dtype is part of the
    compiled signature) and width 0, and its phase is skipped."""
    if ids is None:
        return [_empty(logits.device, dtype) for dtype in (torch.int64, *dtypes)] + [0, 0]
    return [ids, *per_row, ids.stride(0), ids.shape[1]]


_EMPTY: dict[tuple, torch.Tensor] = {}


def _empty(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    key = (device, dtype)
    if key not in _EMPTY:
        _EMPTY[key] = torch.empty(16, dtype=dtype, device=device)
    return _EMPTY[key]


def apply_penalties_triton(logits: torch.Tensor, lists: PenaltyLists) -> None:
    """Apply `lists` to `logits` ([B, V] float32, unit stride along V) in place."""
    launch(_penalties_kernel, (logits.shape[0],),
        logits, logits.stride(0),
        *_list_args(logits, lists.freq_ids, lists.freq_counts, lists.freq_penalty, dtypes=(torch.float32, torch.float32)),
        *_list_args(logits, lists.pres_ids, lists.pres_counts, lists.pres_penalty, dtypes=(torch.float32, torch.float32)),
        *_list_args(logits, lists.stop_ids, lists.output_lens, lists.min_new_tokens, dtypes=(torch.int64, torch.int64)),
        *_list_args(logits, lists.rep_ids, lists.rep_penalty, dtypes=(torch.float32,)),
        *_list_args(logits, lists.bias_ids, lists.bias_values, dtypes=(torch.float32,)),
        int(lists.freq_ids is not None), int(lists.pres_ids is not None), int(lists.stop_ids is not None),
        int(lists.rep_ids is not None), int(lists.bias_ids is not None), BLOCK=BLOCK,
        # x + (-p) * c must round twice, as the torch path does, not once as a fused multiply-add.
        enable_fp_fusion=False,
    )


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
