"""The packed vocab bitmask of grammar rows: building it each step and applying it to the logits.

Layout (xgrammar's and llguidance's): [B, ceil(V / 32)] int32, bit `t % 32` of word `t // 32` set
when token t is allowed; a row without a grammar is all ones. Tokens past 32 * W are masked.

Applying it is our Triton kernel on CUDA and our C kernel on the CPU (faster than xgrammar's
kernels: docs/benchmarks.md), chosen once per device type; `apply_token_bitmask_reference`
(sgl_kernel_ext/sampling/bitmask.py) is the plain torch definition the tests compare them with.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from sgl_kernel_ext.sampling.bitmask import (
    apply_token_bitmask_cpu,
    apply_token_bitmask_cpu_applies,
    apply_token_bitmask_reference,
)

ALL_ALLOWED = -1  # an int32 word with every bit set


def bitmask_width(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


_APPLY: dict[str, Callable[[torch.Tensor, torch.Tensor], None]] = {}


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place, the fastest available implementation for the logits' device (bitmask on that device)."""
    kind = logits.device.type
    if kind not in _APPLY:
        _APPLY[kind] = _choose_apply(kind)
    _APPLY[kind](logits, bitmask)


def _choose_apply(device_type: str) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """Ours on both: the C kernel on the CPU and the Triton kernel on CUDA (each faster than
    xgrammar's and torch's, docs/benchmarks.md); the reference elsewhere."""
    if device_type == "cpu":
        return _apply_cpu
    if device_type == "cuda":
        return _apply_cuda
    return apply_token_bitmask_reference


def _apply_cuda(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    from sgl_kernel_ext.sampling.bitmask_triton import apply_token_bitmask_triton, apply_token_bitmask_triton_applies

    if apply_token_bitmask_triton_applies(logits, bitmask):
        apply_token_bitmask_triton(logits, bitmask)
    else:
        apply_token_bitmask_reference(logits, bitmask)


def _apply_cpu(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    if apply_token_bitmask_cpu_applies(logits, bitmask):
        apply_token_bitmask_cpu(logits, bitmask)
    else:
        apply_token_bitmask_reference(logits, bitmask)


def grammar_bitmask(reqs: Sequence[Any], vocab_size: int, device: torch.device) -> torch.Tensor:
    """[B, W] int32 on `device` for one step's sampled requests: each live grammar row filled by
    its matcher (in one batched call per backend), every other row all ones.

    min_new_tokens: a grammar row that has not yet generated min_new_tokens tokens may not stop
    while its grammar allows anything else; when the grammar allows only stopping, the grammar
    wins and the request ends short of min_new_tokens (the penalizer leaves grammar rows alone).
    """
    pin = device.type == "cuda"
    host = torch.full((len(reqs), bitmask_width(vocab_size)), ALL_ALLOWED, dtype=torch.int32, pin_memory=pin)  # [B, W]
    by_type: dict[type, tuple[list, list[int]]] = {}
    for row, req in enumerate(reqs):
        grammar = req.grammar
        if grammar is None or req.finished() or grammar.is_terminated():
            continue
        grammars, rows = by_type.setdefault(type(grammar), ([], []))
        grammars.append(grammar)
        rows.append(row)
    for kind, (grammars, rows) in by_type.items():
        kind.fill_vocab_masks(grammars, host, rows, parallel=device.type != "cpu")
        _hold_back_stop_tokens(host, [reqs[r] for r in rows], rows)
    return host.to(device, non_blocking=True) if device.type != "cpu" else host


def _hold_back_stop_tokens(host: torch.Tensor, reqs: list[Any], rows: list[int]) -> None:
    words = host.numpy().view(np.uint32)  # [B, W]; unsigned so bit 31 is an ordinary bit
    for req, row in zip(reqs, rows):
        if len(req.output_ids) >= req.sampling_params.min_new_tokens:
            continue
        saved = words[row].copy()
        for token in req.stop_token_ids():
            if 0 <= token < words.shape[1] * 32:
                words[row, token >> 5] &= np.uint32(~(1 << (token & 31)) & 0xFFFFFFFF)
        if not words[row].any():
            words[row] = saved


def allows_nothing(grammar: Any, vocab_size: int) -> bool:
    """Whether a grammar's next-token mask is empty (checked only after a row failed to sample)."""
    row = torch.zeros(1, bitmask_width(vocab_size), dtype=torch.int32)
    grammar.fill_vocab_mask(row, 0)
    return not bool(row.any())
