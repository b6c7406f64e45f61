"""allowed_token_ids: every token outside the row's list is -inf.

EOS is not implicitly allowed (vLLM's rule): a request that should be able to stop lists its EOS
id, otherwise it ends at max_new_tokens or a stop string.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from sglang.srt.sampling.logits_processor.row_state import RowState, RowStateProcessor, to_device


class _Allowed(RowState):
    def __init__(self, prompt_ids: Sequence[int], output_ids: Sequence[int], ids: list[int]) -> None:
        super().__init__(prompt_ids, output_ids)
        self.ids = ids


class AllowedTokenIdsLogitsProcessor(RowStateProcessor):
    """Per step: the allowed logits are gathered, the rows filled with -inf (a write-only pass,
    the least a ban of most of the vocabulary can cost), and the allowed logits put back."""

    param = "allowed_token_ids"

    def __init__(self, server_args: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(server_args, device, is_pin_memory)
        self.rows: Optional[torch.Tensor] = None  # [R] int64
        self.entries: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # ([K] row, [K] token) int64

    def new_state(self, params: Any, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> _Allowed:
        return _Allowed(prompt_ids, output_ids, sorted(set(params.allowed_token_ids)))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.states:
            return logits
        if self.changed:
            self._build()
        kept = logits[self.entries]  # [K]
        logits.index_fill_(0, self.rows, float("-inf"))
        logits.index_put_(self.entries, kept)
        return logits

    def _build(self) -> None:
        """Index tensors change only when rows join or leave: built then, copied once."""
        order = sorted(self.states)
        rows = [row for row in order for _ in self.states[row].ids]
        tokens = [t for row in order for t in self.states[row].ids]
        self.rows = to_device(order, self.device)
        self.entries = (to_device(rows, self.device), to_device(tokens, self.device))
        self.changed = False
