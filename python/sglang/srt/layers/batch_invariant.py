"""Batch-invariant mode (--enable-deterministic-inference): every row's result is independent of
the other rows of its batch.

Matmul libraries pick their kernel, and with it the summation order, by the number of rows, so
a token's logits can change in the last bits when its batch-mates change. In this mode every
matmul runs on row blocks of one fixed shape (the last block zero-padded): the kernel and the
reduction order are then the same for every row whatever the batch holds. Attention does its
part by running each request on its own (see attention.build_attention_metadata).

Pointwise functions matter too on the CPU: ATen runs an elementwise op as a vectorised loop over
the flattened tensor and leaves the remainder (and the edges of each thread's chunk) to a scalar
loop, and the vector and scalar sigmoid / softplus / SiLU differ in the last bit. Where a
tensor's width is not a multiple of the vector step (a router's [N, E] scores, a [N, 1] gate),
which path a row's elements take depends on N. `pointwise` keeps every element on the vector
path.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

# Rows per matmul call: the decode batch size oneDNN's packed weights are blocked for, so a
# full decode batch costs one call.
ROW_BLOCK = 16
# A multiple of every CPU vector loop's step (two vectors of up to 16 float32 lanes).
VECTOR_COLUMNS = 64
# Elements per pointwise call: below ATen's grain size (32768), so one thread runs the whole call.
POINTWISE_ELEMENTS = 16384

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


def pointwise(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn(x) for an elementwise fn and x [N, ...], contiguous. In batch-invariant mode on the CPU,
    x's rows are flattened, zero-padded to a multiple of VECTOR_COLUMNS, and fn runs on blocks of
    whole rows (one thread's worth, or one row), so every element takes the same path whatever N is."""
    if not _active or x.device.type != "cpu" or x.numel() == 0:
        return fn(x)
    flat = x.reshape(x.shape[0], -1)  # [N, C]
    columns = flat.shape[1]
    padded = F.pad(flat, (0, -columns % VECTOR_COLUMNS))  # [N, C + pad]
    rows = max(1, POINTWISE_ELEMENTS // padded.shape[1])
    out = torch.cat([fn(block) for block in padded.split(rows)])  # [N, C + pad]
    return out[:, :columns].contiguous().view(x.shape)
