"""Shared shape of the built-in processors: one state object per row that uses the processor,
kept in a dict by row index (apply_batch_update), each holding the request's prompt ids and
live output ids."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import torch

from sglang.srt.sampling.logits_processor.interface import BatchUpdate, LogitsProcessor, apply_batch_update


class RowState:
    def __init__(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> None:
        self.prompt_ids = prompt_ids
        self.output_ids = output_ids


class RowStateProcessor(LogitsProcessor):
    """A built-in: `param` names the SamplingParams field that turns it on for a row."""

    param: str

    def __init__(self, server_args: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.server_args = server_args
        self.device = device
        self.states: dict[int, RowState] = {}
        self.changed = True  # the rows changed since the per-batch tensors were built

    @classmethod
    def acts_on(cls, params: Any) -> bool:
        return getattr(params, cls.param, None) is not None

    def is_argmax_invariant(self) -> bool:
        return False  # every built-in bans or forces tokens

    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        self.changed |= apply_batch_update(self.states, batch_update, self._new_row)

    def _new_row(self, params: Any, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> Optional[RowState]:
        return self.new_state(params, prompt_ids, output_ids) if self.acts_on(params) else None

    def new_state(self, params: Any, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> RowState:
        raise NotImplementedError

    def row_views(self) -> Mapping[int, tuple[Sequence[int], Sequence[int]]]:
        return {row: (s.prompt_ids, s.output_ids) for row, s in self.states.items()}


class BanningProcessor(RowStateProcessor):
    """A built-in whose row states say which tokens to ban this step (`state.banned()`)."""

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        rows, tokens = [], []
        for row, state in self.states.items():
            banned = state.banned()
            rows += [row] * len(banned)
            tokens += banned
        fill_at(logits, rows, tokens, float("-inf"))
        return logits


def to_device(values: list, device: torch.device) -> torch.Tensor:
    """int64 host list -> device tensor; through pinned memory on CUDA, so the copy is
    asynchronous (a pageable copy would wait for the GPU)."""
    on_cuda = torch.device(device).type == "cuda"
    return torch.tensor(values, dtype=torch.int64, pin_memory=on_cuda).to(device, non_blocking=True)


def fill_at(logits: torch.Tensor, rows: list[int], tokens: list[int], value: float) -> None:
    """logits[rows[k], tokens[k]] = value for every k, in one indexed write."""
    if not rows:
        return
    index = to_device([rows, tokens], logits.device)  # [2, K]
    logits.index_put_((index[0], index[1]), torch.tensor(value, dtype=logits.dtype, device=logits.device))
