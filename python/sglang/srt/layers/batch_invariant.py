"""Batch-invariant mode (--enable-deterministic-inference): every row's result is independent of
the other rows of its batch.

Matmul libraries pick their kernel, and with it the summation order, by the number of rows, so
a token's logits can change in the last bits when its batch-mates change. In this mode every
matmul runs on row blocks of one fixed shape (the last block zero-padded): the kernel and the
reduction order are then the same for every row whatever the batch holds. Attention does its
part by running each request on its own (see attention.build_attention_metadata).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch

# Rows per matmul call: the decode batch size oneDNN's packed weights are blocked for, so a
# full decode batch costs one call.
ROW_BLOCK = 16

_active = False


@contextmanager
def batch_invariant(enabled: bool) -> Iterator[None]:
    """Turn the mode on (or leave it off) for the forward passes inside the block."""
    global _active
    previous, _active = _active, enabled
    try:
        yield
    finally:
        _active = previous


def is_batch_invariant() -> bool:
    return _active


def row_blocked(matmul: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """matmul(x) for x [N, K], computed on [ROW_BLOCK, K] blocks -> [N, ...]."""
    rows = x.shape[0]
    pad = -rows % ROW_BLOCK
    if pad:
        x = torch.cat([x, x.new_zeros((pad, *x.shape[1:]))])  # [N + pad, K]
    return torch.cat([matmul(block) for block in x.split(ROW_BLOCK)])[:rows]
