"""Repetition penalty (HF / vLLM semantics): every token seen in the prompt or the output is
made less likely by a factor, logit / p when positive and logit * p otherwise."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from sglang.srt.sampling.penaltylib.base import _BatchedPenalizer, per_row_tensor
from sglang.srt.sampling.penaltylib.token_counts import TokenCounts

if TYPE_CHECKING:
    from sgl_kernel_ext.sampling.penalties import PenaltyLists


class BatchedRepetitionPenalizer(_BatchedPenalizer):
    """Scales the logits of every distinct prompt or generated token by the row's penalty."""

    is_multiplicative = True

    def _is_required_for(self, sampling_params: Any) -> bool:
        return float(sampling_params.repetition_penalty) != 1.0

    def _prepare(self) -> None:
        reqs = self.orchestrator.reqs()
        factors = [float(r.sampling_params.repetition_penalty) for r in reqs]
        self.penalties = per_row_tensor(factors, self.device)
        self.seen = TokenCounts.from_lists([r.origin_input_ids + r.output_ids for r in reqs], self.device)

    def _teardown(self) -> None:
        del self.penalties
        del self.seen

    def _cumulate_output_tokens(self, output_ids: torch.Tensor) -> None:
        self.seen.add(output_ids)

    def _apply(self, logits: torch.Tensor) -> None:
        ids = self.seen.ids  # [B, L], left-packed, PAD_ID after each row's distinct tokens
        first = ids[:, :1]  # [B, 1]; PAD_ID only for a row that has seen nothing
        # Pads are redirected to the row's first seen id so every write to a column carries the
        # same value and scatter_'s unspecified order with duplicate indices cannot matter;
        # an empty row writes its own unchanged logit back to column 0.
        index = torch.where(ids >= 0, ids, first).clamp(min=0)  # [B, L]
        old = logits.gather(1, index)  # [B, L]
        scaled = torch.where(old > 0, old / self.penalties, old * self.penalties)
        logits.scatter_(1, index, torch.where(first >= 0, scaled, old).to(logits.dtype))

    def _filter(self, keep_indices: torch.Tensor) -> None:
        self.penalties = self.penalties.index_select(0, keep_indices)
        self.seen.filter(keep_indices)

    def _merge(self, their: BatchedRepetitionPenalizer) -> None:
        self.penalties = torch.cat([self.penalties, their.penalties])
        self.seen.merge(their.seen)

    def write_fused(self, lists: "PenaltyLists") -> bool:
        (lists.rep_ids, lists.rep_counts), lists.rep_lengths = self.seen.storage, self.seen.lengths
        lists.rep_penalty = self.penalties
        return True

    def record_fused_update(self) -> None:
        self.seen.record_added()
