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
    """Per step: the allowed logits are gathered (by flat index), their rows filled with -inf (a
    write-only pass, the least a ban of most of the vocabulary can cost), and the allowed logits
    scattered back."""

    param = "allowed_token_ids"

    def __init__(self, server_args: Any, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(server_args, device, is_pin_memory)
        self.rows: Optional[torch.Tensor] = None  # [R] int64
        self.flat: Optional[torch.Tensor] = None  # [K] int64: row * V + token of every allowed entry
        self.all_rows = False
        self.built_shape: Optional[torch.Size] = None  # the logits shape the index tensors are for

    def new_state(self, params: Any, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> _Allowed:
        return _Allowed(prompt_ids, output_ids, sorted(set(params.allowed_token_ids)))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.states:
            return logits
        if self.changed or logits.shape != self.built_shape:  # rows without a list may join too
            self._build(logits.shape)
        flat_logits = logits.view(-1)
        kept = flat_logits.index_select(0, self.flat)  # [K]
        if self.all_rows:
            logits.fill_(float("-inf"))  # a plain fill: several times faster than index_fill_ on the CPU
        else:
            logits.index_fill_(0, self.rows, float("-inf"))
        flat_logits.index_copy_(0, self.flat, kept)
        return logits

    def _build(self, shape: torch.Size) -> None:
        """Index tensors change only when rows join or leave: built then, copied once."""
        batch_size, vocab_size = shape
        order = sorted(self.states)
        flat = [row * vocab_size + t for row in order for t in self.states[row].ids]
        self.rows = to_device(order, self.device)
        self.flat = to_device(flat, self.device)
        self.all_rows = len(order) == batch_size
        self.built_shape = shape
        self.changed = False
