"""The collectives the scheduler adds on top of the model's: request broadcast, start-up
agreement, and the opt-in check that every rank sampled the same tokens."""

from __future__ import annotations

import os
from collections.abc import Sequence

import msgspec
import torch
import torch.distributed as dist

# Debug: all-gather each step's sampled ids and fail on the first disagreement between ranks.
CHECK_TOKEN_AGREEMENT_ENV = "SGLANG_TP_CHECK_TOKEN_AGREEMENT"

_frames_decoder = msgspec.msgpack.Decoder(list[bytes])


class TokenDivergenceError(RuntimeError):
    """TP ranks sampled different tokens (or scheduled different batches) in one step."""


def token_agreement_check_requested() -> bool:
    return os.environ.get(CHECK_TOKEN_AGREEMENT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def broadcast_frames(frames: Sequence[bytes], group: dist.ProcessGroup, src: int = 0) -> list[bytes]:
    """Rank `src`'s encoded messages on every rank (other ranks pass an empty list).

    The frames travel as one msgpack array of binaries in a uint8 tensor, after its length, so
    an empty step costs a single one-element broadcast; nothing is pickled.
    """
    payload = msgspec.msgpack.encode(list(frames)) if dist.get_rank() == src and frames else b""
    size = torch.tensor([len(payload)], dtype=torch.int64)
    dist.broadcast(size, src, group=group)
    if size.item() == 0:
        return []
    if dist.get_rank() == src:
        buffer = torch.frombuffer(bytearray(payload), dtype=torch.uint8)  # [size]
    else:
        buffer = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(buffer, src, group=group)
    return _frames_decoder.decode(buffer.numpy().tobytes())


def min_across_ranks(value: int, group: dist.ProcessGroup) -> int:
    """The smallest of every rank's `value` (e.g. KV-cache capacity sized from local free memory)."""
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=group)
    return int(tensor.item())


def check_token_agreement(next_ids: torch.Tensor, step: int, rids: Sequence[str], group: dist.ProcessGroup) -> None:
    """Raise TokenDivergenceError naming the step, the first diverging row and every rank's token.

    next_ids [B] int64 (a decode step's ids) or [B, W] int64 (a speculative verify step's emitted
    ids, padded) on the group's device. Every rank sees the same gathered table, so every rank
    raises the same error.
    """
    world = dist.get_world_size(group)
    width = next_ids.shape[1] if next_ids.dim() == 2 else 0
    shapes = _all_gather(torch.tensor([next_ids.shape[0], width], dtype=torch.int64, device=next_ids.device), world, group)
    sizes, widths = shapes[:, 0].tolist(), shapes[:, 1].tolist()  # [R] each
    if len(set(sizes)) > 1:
        raise TokenDivergenceError(f"TP ranks scheduled different batches at step {step}: batch sizes by rank {sizes}.")
    if len(set(widths)) > 1:
        raise TokenDivergenceError(f"TP ranks verified different widths at step {step}: widths by rank {widths}.")
    table = _all_gather(next_ids.contiguous(), world, group).cpu()  # [R, B] or [R, B, W]
    disagree = (table != table[0]).view(world, table.shape[1], -1).any(dim=2)  # [R, B]
    differs = disagree.any(dim=0).nonzero().view(-1)  # rows where some rank disagrees
    if differs.numel() == 0:
        return
    row = int(differs[0])
    rid = rids[row] if row < len(rids) else "?"
    raise TokenDivergenceError(
        f"TP ranks sampled different tokens at step {step}: first diverging row {row} (request {rid!r}), "
        f"tokens by rank {table[:, row].tolist()}; {differs.numel()} of {table.shape[1]} rows differ."
    )


def _all_gather(tensor: torch.Tensor, world: int, group: dist.ProcessGroup) -> torch.Tensor:
    """[R, *tensor.shape]: every rank's tensor, in rank order."""
    shards = [torch.empty_like(tensor) for _ in range(world)]
    dist.all_gather(shards, tensor, group=group)
    return torch.stack(shards)
