"""min_new_tokens: every stop token id is banned until the row has generated enough tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from sglang.srt.sampling.penaltylib.base import _BatchedPenalizer

if TYPE_CHECKING:
    from sgl_kernel_ext.sampling.penalties import PenaltyLists

_PAD = -1


class BatchedMinNewTokensPenalizer(_BatchedPenalizer):
    """Adds -inf at each id in req.stop_token_ids() while len(output) < min_new_tokens."""

    def _is_required_for(self, sampling_params: Any) -> bool:
        return int(sampling_params.min_new_tokens or 0) > 0

    def _prepare(self) -> None:
        reqs = self.orchestrator.reqs()
        vocab_size = self.orchestrator.vocab_size
        # Ids outside the vocabulary could never be sampled, and would break the scatter.
        rows = [sorted(i for i in r.stop_token_ids() if i is not None and 0 <= i < vocab_size) for r in reqs]
        width = max((len(row) for row in rows), default=0)
        stop_ids = torch.full((len(rows), width), _PAD, dtype=torch.int64)  # [B, S]
        for b, row in enumerate(rows):
            stop_ids[b, : len(row)] = torch.tensor(row, dtype=torch.int64)
        self.stop_ids = stop_ids.to(self.device)
        # A grammar row's stop tokens are held back by its vocab mask instead (constrained/bitmask.py),
        # which lets the grammar end the request when ending is all it allows.
        self.min_new_tokens = self._column(
            [int(r.sampling_params.min_new_tokens or 0) if getattr(r, "grammar", None) is None else 0 for r in reqs]
        )
        self.output_lens = self._column([len(r.output_ids) for r in reqs])

    def _column(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64).reshape(-1, 1).to(self.device)  # [B, 1] int64

    def _teardown(self) -> None:
        del self.stop_ids
        del self.min_new_tokens
        del self.output_lens

    def _cumulate_output_tokens(self, output_ids: torch.Tensor) -> None:
        # A row flagged invalid by the sampler (id < 0) produced no token.
        self.output_lens.add_((output_ids >= 0).reshape(-1, 1).to(self.output_lens.device))

    def _apply(self, logits: torch.Tensor) -> None:
        active = (self.output_lens < self.min_new_tokens) & (self.stop_ids >= 0)  # [B, S]
        ban = torch.zeros_like(self.stop_ids, dtype=logits.dtype)  # [B, S]
        ban.masked_fill_(active, float("-inf"))
        # Pads and finished rows add 0 (to column 0 for pads).
        logits.scatter_add_(1, self.stop_ids.clamp(min=0), ban)

    def _filter(self, keep_indices: torch.Tensor) -> None:
        self.stop_ids = self.stop_ids.index_select(0, keep_indices)
        self.min_new_tokens = self.min_new_tokens.index_select(0, keep_indices)
        self.output_lens = self.output_lens.index_select(0, keep_indices)

    def _merge(self, their: BatchedMinNewTokensPenalizer) -> None:
        width = max(self.stop_ids.shape[1], their.stop_ids.shape[1])
        self.stop_ids = torch.cat([_pad_to(self.stop_ids, width), _pad_to(their.stop_ids, width)])
        self.min_new_tokens = torch.cat([self.min_new_tokens, their.min_new_tokens])
        self.output_lens = torch.cat([self.output_lens, their.output_lens])

    def write_fused(self, lists: "PenaltyLists") -> bool:
        lists.stop_ids, lists.output_lens, lists.min_new_tokens = self.stop_ids, self.output_lens, self.min_new_tokens
        return True


def _pad_to(stop_ids: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(stop_ids, (0, width - stop_ids.shape[1]), value=_PAD)  # [B, width]
