"""Hidden states -> next-token logits (LogitsHead), and the output record the sampler fills in.

LogitsHead is the model's last layer; the user-facing `LogitsProcessor` (batch-level logits
processors, vLLM's API) is sglang.srt.sampling.logits_processor's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, Union

import torch
from torch import nn

from sglang.srt.layers.batch_invariant import pointwise
from sglang.srt.layers.linear import dense_matmul


@dataclass
class LogitsProcessorOutput:
    next_token_logits: torch.Tensor  # [B, V] float32
    hidden_states: Optional[torch.Tensor] = None  # [B, H], kept only when asked for
    # Logits of every new token of the step, when ForwardBatch.return_input_logits (prompt logprobs).
    input_token_logits: Optional[torch.Tensor] = None  # [N, V] float32

    # Filled by Sampler.forward / compute_logprobs_only.
    next_token_logprobs: Optional[torch.Tensor] = None  # [B]
    next_token_top_logprobs_val: Optional[torch.Tensor] = None  # [B, max_k]
    next_token_top_logprobs_idx: Optional[torch.Tensor] = None  # [B, max_k]
    next_token_token_ids_logprobs_val: Optional[torch.Tensor] = None  # [B, L]
    next_token_token_ids_logprobs_idx: Optional[list[list[int]]] = None
    # Rows whose request must fail: NaN/+inf/all -inf logits or a custom processor error.
    # Their sampled id is -1.
    invalid_rows: Optional[torch.Tensor] = None  # [B] bool
    row_errors: dict[int, str] = field(default_factory=dict)  # row -> message, host-known causes
    # Beam search: (rows [R] int64, candidates C) whose top-C log-probabilities of the processed
    # logits Sampler.forward returns in beam_topk ([R, C] float32 values, [R, C] int64 ids).
    beam_ask: Optional[tuple[torch.Tensor, int]] = None
    beam_topk: Optional[tuple[torch.Tensor, torch.Tensor]] = None


class LMHead(Protocol):
    def project(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> logits of this rank's vocabulary shard [N, V_shard]."""


class LogitsHead(nn.Module):
    """hidden states -> logits: lm_head projection, optional TP all-gather of vocab shards, logit scale, final soft-capping."""

    def __init__(
        self,
        vocab_size: int,
        *,
        logit_scale: Optional[float] = None,
        final_logit_softcapping: Optional[float] = None,
        tp_all_gather: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    ) -> None:
        super().__init__()
        if final_logit_softcapping is not None and final_logit_softcapping <= 0:
            raise ValueError(f"final_logit_softcapping must be > 0, got {final_logit_softcapping}.")
        self.vocab_size = vocab_size
        self.logit_scale = logit_scale
        self.final_logit_softcapping = final_logit_softcapping
        self.tp_all_gather = tp_all_gather

    def forward(
        self,
        hidden_states: torch.Tensor,
        lm_head: Union[torch.Tensor, "LMHead"],
        lm_head_bias: Optional[torch.Tensor] = None,
        *,
        keep_hidden_states: bool = False,
        out: Optional[torch.Tensor] = None,
    ) -> LogitsProcessorOutput:
        """hidden_states [B, H] (the last position of each row); lm_head is the weight [V_shard, H]
        or a module whose `project(hidden)` does the matmul (e.g. with a pre-packed weight).
        `out` ([B, V] float32, contiguous): where the logits are written (a decode graph's
        static output); the float32 conversion writes there directly when nothing follows it."""
        if isinstance(lm_head, torch.Tensor):
            logits = dense_matmul(hidden_states, lm_head, lm_head_bias)  # [B, V_shard]
        else:
            logits = lm_head.project(hidden_states)
            if lm_head_bias is not None:
                logits = logits + lm_head_bias
        if out is None:
            logits = self._finish(logits).contiguous()
        elif self._converts_only(logits):
            logits = out.copy_(logits)  # the float32 conversion writes `out`
        else:
            logits = out.copy_(self._finish(logits))
        return LogitsProcessorOutput(
            next_token_logits=logits,
            hidden_states=hidden_states if keep_hidden_states else None,
        )

    def scratch_row_bytes(self, dtype: torch.dtype) -> int:
        """Bytes per row of the [B, V] temporaries a forward's logits leave in a CUDA-graph memory
        pool: the projection in the model dtype, plus up to three float32 rows where the head
        finishes the logits (TP shards and their all-gather, a scale, soft-capping)."""
        finishes = self.tp_all_gather is not None or self.logit_scale is not None or self.final_logit_softcapping is not None
        return dtype.itemsize + (12 if finishes else 0)

    def _converts_only(self, logits: torch.Tensor) -> bool:
        """Whether the projection's logits only need the float32 conversion (one rank, no padding,
        no scale, no soft-capping)."""
        return (
            self.tp_all_gather is None
            and logits.shape[-1] == self.vocab_size
            and self.logit_scale is None
            and self.final_logit_softcapping is None
        )

    def _finish(self, logits: torch.Tensor) -> torch.Tensor:
        """[B, V_shard] projection -> [B, V] float32: TP all-gather, logit scale, soft-capping."""
        logits = logits.float()
        if self.tp_all_gather is not None:
            logits = self.tp_all_gather(logits)  # [B, V_padded]: every rank holds the full vocab
        # Vocab shards may be padded to a multiple of the TP size; padding is never a token.
        logits = logits[:, : self.vocab_size]
        if self.logit_scale is not None:
            logits = logits * self.logit_scale
        if self.final_logit_softcapping is not None:
            cap = self.final_logit_softcapping
            logits = pointwise(torch.tanh, logits / cap) * cap
        return logits
