"""allowed_token_ids: every token outside the row's list is -inf.

EOS is not implicitly allowed (vLLM's rule): a request that should be able to stop lists its EOS
id, otherwise it ends at max_new_tokens or a stop string.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from sglang.srt.sampling.logits_processor.row_state import RowState, RowStateProcessor


class _Allowed(RowState):
    def __init__(self, prompt_ids: Sequence[int], output_ids: Sequence[int], ids: list[int]) -> None:
        super().__init__(prompt_ids, output_ids)
        self.ids = ids


class AllowedTokenIdsLogitsProcessor(RowStateProcessor):
    param = "allowed_token_ids"

    def __init__(self, server_args: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(server_args, device, is_pin_memory)
        self.rows: Optional[torch.Tensor] = None  # [R] int64
        self.forbidden: Optional[torch.Tensor] = None  # [R, V] bool, True = banned

    def new_state(self, params: Any, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> _Allowed:
        return _Allowed(prompt_ids, output_ids, sorted(set(params.allowed_token_ids)))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.states:
            return logits
        if self.changed:
            self._build(logits.shape[1])
        rows_logits = logits.index_select(0, self.rows).masked_fill_(self.forbidden, float("-inf"))  # [R, V]
        logits.index_copy_(0, self.rows, rows_logits)
        return logits

    def _build(self, vocab_size: int) -> None:
        """The masks change only when rows join or leave: built then, on the host, copied once."""
        order = sorted(self.states)
        forbidden = torch.ones(len(order), vocab_size, dtype=torch.bool)  # [R, V]
        for k, row in enumerate(order):
            forbidden[k, self.states[row].ids] = False
        self.rows = torch.tensor(order, dtype=torch.int64).to(self.device)
        self.forbidden = forbidden.to(self.device)
        self.changed = False
