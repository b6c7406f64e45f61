"""A grammar's packed vocab bitmask applied to float32 logits on CUDA, in place (the function of
bitmask.apply_token_bitmask_reference).

One program per (row, 1024 tokens): it loads its 32 words, expands them to bits and stores -inf
where a bit is 0 (nothing where it is 1), so the traffic is the masked tokens' writes. xgrammar's
kernel does the same work in a persistent loop; launched through triton_launch (no JIT binding on
each call) this one is several times faster per step on an H200 (docs/benchmarks.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel_ext.triton_launch import launch, pdl_sync

WORDS = 32  # per program: 1024 tokens
BLOCK = WORDS * 32


@triton.jit(do_not_specialize=["vocab", "num_words"])
def _apply_bitmask_kernel(
    logits_ptr,  # [rows, vocab] float32, row stride logits_stride
    bitmask_ptr,  # [rows, num_words] int32, contiguous
    vocab,
    logits_stride,
    num_words,
    WORDS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    row = tl.program_id(0).to(tl.int64)
    word = tl.program_id(1) * WORDS + tl.arange(0, WORDS)  # [WORDS]
    words = tl.load(bitmask_ptr + row * num_words + word, mask=word < num_words, other=0)  # past W: masked
    bits = (words[:, None] >> tl.arange(0, 32)[None, :]) & 1  # [WORDS, 32]
    masked = tl.reshape(bits == 0, (WORDS * 32,))
    cols = tl.program_id(1) * (WORDS * 32) + tl.arange(0, WORDS * 32)
    tl.store(logits_ptr + row * logits_stride + cols, float("-inf"), mask=masked & (cols < vocab))


def apply_token_bitmask_triton_applies(logits: torch.Tensor, bitmask: torch.Tensor) -> bool:
    return (
        logits.dtype == torch.float32
        and logits.dim() == 2
        and logits.stride(1) == 1
        and bitmask.dtype == torch.int32
        and bitmask.is_contiguous()
        and bitmask.shape[0] == logits.shape[0]
        and bitmask.device == logits.device
    )


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place: logits [B, V] float32 (unit column stride) get -inf where bitmask [B, W] int32 has a 0 bit."""
    if not apply_token_bitmask_triton_applies(logits, bitmask):
        raise ValueError("apply_token_bitmask_triton takes float32 logits [B, V] and a contiguous int32 bitmask [B, W] on one device.")
    rows, vocab = logits.shape
    if rows and vocab:
        grid = (rows, triton.cdiv(vocab, BLOCK))
        launch(_apply_bitmask_kernel, grid, logits, bitmask, vocab, logits.stride(0), bitmask.shape[1], WORDS=WORDS,
               num_warps=4, pdl=True)
