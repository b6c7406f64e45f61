"""Recording one sampled token per row in the sparse token histories of the penalties.

A row holds its distinct tokens left-packed in ids[b, :lengths[b]] with their counts. Adding a
token either increments the count of its slot or appends it. In torch that is ten small ops per
step (compare, any, where, two scatters, ...), each a kernel launch and host dispatch; here it
is one launch, one program per row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.triton_launch import launch

BLOCK = 128


# `width` grows by one every step: specialising on it would compile in the serving loop.
@triton.jit(do_not_specialize=["width"])
def _add_kernel(ids_ptr, counts_ptr, lengths_ptr, tokens_ptr, stride, width, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    tok = tl.load(tokens_ptr + row)
    if tok >= 0:  # negative: a row the sampler flagged, nothing to record
        base = row.to(tl.int64) * stride
        found = tl.zeros([BLOCK], tl.int32)
        for start in range(0, width, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            live = offs < width
            hit = (tl.load(ids_ptr + base + offs, mask=live, other=-1) == tok) & live
            counts = tl.load(counts_ptr + base + offs, mask=hit, other=0.0)
            tl.store(counts_ptr + base + offs, counts + 1.0, mask=hit)
            found += hit.to(tl.int32)
        if tl.sum(found, 0) == 0:
            length = tl.load(lengths_ptr + row)
            tl.store(ids_ptr + base + length, tok)
            tl.store(counts_ptr + base + length, 1.0)
            tl.store(lengths_ptr + row, length + 1)


def token_counts_add_triton(
    ids: torch.Tensor, counts: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor, width: int
) -> None:
    """In place. ids [B, C] int64 (-1 past each row's length), counts [B, C] float32 (same
    strides), lengths [B, 1] int64, tokens [B] int64; width >= max(lengths), C > width."""
    assert ids.stride() == counts.stride() and ids.stride(1) == 1 and lengths.is_contiguous()
    launch(_add_kernel, (ids.shape[0],), ids, counts, lengths, tokens, ids.stride(0), width, BLOCK=BLOCK)
