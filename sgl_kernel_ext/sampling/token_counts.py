"""Recording one sampled token per row in the sparse token histories of the penalties.

A row holds its distinct tokens left-packed in ids[b, :lengths[b]] with their counts. Adding a
token either increments the count of its slot or appends it. In torch that is ten small ops per
step (compare, any, where, two scatters, ...), each a kernel launch and host dispatch; here it
is one launch, one program per row. `add_token` is also the per-row step of the penalty table's
update kernel (penalties.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.triton_launch import launch, pdl_sync

BLOCK = 128


@triton.jit
def add_token(ids_ptr, counts_ptr, length_ptr, tok, BLOCK: tl.constexpr):
    """Record `tok` (>= 0) in one row: ids_ptr / counts_ptr point at the row, length_ptr at its length.
    The loop runs to the row's own length (read on the device), so no host width is needed."""
    length = tl.load(length_ptr)
    found = tl.zeros([BLOCK], tl.int32)
    for start in range(0, length, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        live = offs < length
        hit = (tl.load(ids_ptr + offs, mask=live, other=-1) == tok) & live
        counts = tl.load(counts_ptr + offs, mask=hit, other=0.0)
        tl.store(counts_ptr + offs, counts + 1.0, mask=hit)
        found += hit.to(tl.int32)
    if tl.sum(found, 0) == 0:
        tl.store(ids_ptr + length, tok)
        tl.store(counts_ptr + length, 1.0)
        tl.store(length_ptr, length + 1)


@triton.jit
def _add_kernel(ids_ptr, counts_ptr, lengths_ptr, tokens_ptr, tokens_stride, stride, BLOCK: tl.constexpr,
                PDL: tl.constexpr):
    pdl_sync(PDL)
    row = tl.program_id(0)
    tok = tl.load(tokens_ptr + row.to(tl.int64) * tokens_stride)
    if tok >= 0:  # negative: a row the sampler flagged, nothing to record
        base = row.to(tl.int64) * stride
        add_token(ids_ptr + base, counts_ptr + base, lengths_ptr + row, tok, BLOCK)


def token_counts_add_triton(ids: torch.Tensor, counts: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor) -> None:
    """In place. ids [B, C] int64 (-1 past each row's length), counts [B, C] float32 (same
    strides), lengths [B, 1] int64 with every length < C, tokens [B] int64 (any stride)."""
    assert ids.stride() == counts.stride() and ids.stride(1) == 1 and lengths.is_contiguous()
    launch(_add_kernel, (ids.shape[0],), ids, counts, lengths, tokens, tokens.stride(0), ids.stride(0), BLOCK=BLOCK,
           pdl=True)
