"""Checkpoints that store projections fused (Phi-3's qkv_proj and gate_up_proj, GLM-4's
gate_up_proj) are split back into the per-projection tensors our loaders shard: each part is
sharded over TP ranks on its own, which slicing the fused tensor would not do."""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

Weights = Iterable[tuple[str, torch.Tensor]]


def split_fused(weights: Weights, fused: str, parts: dict[str, int]) -> Iterator[tuple[str, torch.Tensor]]:
    """Each `.{fused}.` tensor (weight [sum sizes, in] or bias [sum sizes]) becomes one tensor per
    part, named `.{part}.`, of the given row counts in order; other tensors pass unchanged."""
    for name, tensor in weights:
        if f".{fused}." not in name:
            yield name, tensor
            continue
        if tensor.shape[0] != sum(parts.values()):
            raise ValueError(f"{name}: {tensor.shape[0]} rows, expected {sum(parts.values())} ({parts}).")
        for (part, _), chunk in zip(parts.items(), tensor.split(list(parts.values()), dim=0)):
            yield name.replace(f".{fused}.", f".{part}."), chunk
