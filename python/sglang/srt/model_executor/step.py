"""The contract between the scheduler and the ModelRunner: a Step is what the scheduler submits
(which requests, the forward batch, which rows sample), a StepResult what the runner returns. The
runner prepares, forwards and samples a step; the scheduler decides steps and reads results."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

import torch

from sglang.srt.layers.sampling_report import ReportAsk, RowReport
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

# The scheduler sees -1 for a row the sampler flagged (NaN/inf logits, failed processor).
INVALID_TOKEN_ID = -1


@dataclass
class LogprobRequest:
    """What logprobs a request asked for."""

    top_logprobs_num: int = 0
    token_ids_logprob: Optional[list[int]] = None
    # First prompt position whose logprob is returned; the prompt length means outputs only.
    logprob_start_len: int = -1


class StepRequest(Protocol):
    """What the runner reads of a request (the scheduler's Req): prompt logprobs read the prompt,
    the grammar mask its matcher, the row checks its ids."""

    rid: str
    origin_input_ids: list[int]
    output_ids: list[int]
    logprob: Optional[LogprobRequest]
    grammar: Any  # its BaseGrammarObject, or None
    sampling_report: Optional[ReportAsk]  # support / behaviour logprobs / entropy it asked for


class SampledBatch(Protocol):
    """The sampled requests of a step (the scheduler's ScheduleBatch); owns their SamplingBatchInfo."""

    reqs: list[Any]
    sampling_info: SamplingBatchInfo


@dataclass
class Step:
    """One submitted step: what the worker needs and what the host needs to read its result."""

    mode: ForwardMode
    reqs: list[StepRequest]  # rows of the forward batch, in order
    forward_batch: ForwardBatch
    sample_rows: list[int]  # forward rows that sample a token (prefill: requests whose prompt completes)
    sampled_batch: Optional[SampledBatch]
    positions: torch.Tensor  # [S] position of each sampled row's last input token
    input_logprob_spans: list[tuple[int, int, int, int]] = field(default_factory=list)  # (row, start, a, b)
    index: int = 0  # the scheduler's step counter (same on every TP rank): keys the unseeded noise
    # Overlap schedule, grammar rows or batch-level processors: the previous step's `processed`;
    # the worker waits for it after the forward and before filling the vocab mask or running the
    # processors (its tokens must be in the grammars and in the output lists the processors read).
    grammar_wait: Optional[threading.Event] = None
    processed: threading.Event = field(default_factory=threading.Event)  # set once the host read the result
    kv_slots: Optional[torch.Tensor] = None  # [N] int64 host: the KV slots this step writes
    # Guided sampled rows (sampling_params.guidance), in order: the forward row of each one's guide context.
    # Their rows index the step's forward rows followed by `guide_forward_batch`'s rows: the guide
    # contexts on the guide model (--guide-model-path), forwarded in the same step.
    guide_rows: list[int] = field(default_factory=list)
    guide_forward_batch: Optional[ForwardBatch] = None
    guide_kv_slots: Optional[torch.Tensor] = None  # [Ng] int64 host: the KV slots it writes on the guide model
    submitted_at: float = 0.0  # time.perf_counter() when it went to the worker
    # Beam search: the positions of beam rows among the sampled rows, and the candidates
    # (top log-probabilities) each returns.
    beam_rows: Optional[list[int]] = None
    beam_candidates: int = 0
    # A speculative verify step: each request's drafts, verified over the extend forward_batch
    # (model_executor/spec_runner.py).
    spec: Optional["SpecDrafts"] = None

    @property
    def sampling_info(self) -> Optional[SamplingBatchInfo]:
        return None if self.sampled_batch is None else self.sampled_batch.sampling_info

    def reads_host_history(self) -> bool:
        return self.sampled_batch is not None and self.sampling_info.has_custom_logit_processor

    def has_beam_rows(self) -> bool:
        return bool(self.beam_rows)

    def has_grammar_rows(self) -> bool:
        return self.sampled_batch is not None and self.sampling_info.grammars is not None

    def has_batch_logits_processors(self) -> bool:
        return self.sampled_batch is not None and self.sampling_info.logits_processors is not None


@dataclass
class SpecDrafts:
    """A verify step's drafts: request i forwards [last token] + drafts[i] at rows starts[i]..."""

    drafts: list[list[int]]
    starts: list[int]  # offset of each request's last token among the forward's N tokens
    prefix_lens: list[int]  # each request's KV length before the step
    # [B] int64 request slots when the forward runs one decode row per token (VerifyPlan); else
    # the forward batch's own req_pool_indices are the requests'.
    req_slots: Optional[torch.Tensor] = None


@dataclass(frozen=True)
class VerifyPlan:
    """How a model runner forwards a verify step: an extend padded to `graph_width` tokens a
    request (its verify CUDA graphs), else one decode row per token when `decode_rows` (each
    row attends to its request's KV up to its own position, as a decode step does), else a plain
    extend."""

    graph_width: Optional[int] = None
    decode_rows: bool = False


@dataclass
class StepResult:
    next_ids: torch.Tensor  # [S] int64 on the host, per sampled row, -1 when flagged
    ready: Optional[torch.cuda.Event]  # recorded after next_ids' asynchronous copy from the GPU
    row_errors: dict[int, str]
    output_logprobs: list[Optional[tuple]]  # per sampled row: (logprob, top pairs, token-id pairs)
    input_logprobs: dict[int, tuple]  # forward row -> (token pairs, top lists, token-id lists)
    beam_topk: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # host [R, C] values, ids of the beam rows
    # Mixture-guided rows: (their sampled rows, their alphas [M] float32 on the host, valid after `ready`).
    guidance_alpha: Optional[tuple[list[int], torch.Tensor]] = None
    reports: list[Optional[RowReport]] = field(default_factory=list)  # per sampled row, when it asked
    # A verify step: per request its emitted ids, its accepted drafts and one logprob entry per
    # emitted id (next_ids and output_logprobs are then unused).
    spec_tokens: Optional[list[list[int]]] = None
    spec_accepted: Optional[list[int]] = None
    spec_logprobs: Optional[list[list[Optional[tuple]]]] = None
