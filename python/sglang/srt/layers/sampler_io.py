"""The Sampler's typed interfaces: what a step hands it (SamplerInput), what it returns
(SamplerOutput), what a step strategy is called with (StepCall), and the protocols for the host
state of a sampled row, a captured sampling graph and the sampler state a strategy reads."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional, Protocol, Sequence

import torch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampling_backends import SamplingBackend
from sglang.srt.layers.sampling_report import ReportAsk, SamplingReport
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

# Names of the step strategies, as Sampler.step_name and SamplerOutput.strategy report them.
FUSED_STEP, CPU_GROUPED_STEP, TORCH_STEP, GRAPH_STEP, UNDECIDED = "fused", "cpu_grouped", "torch", "graph", "undecided"


class LogprobAsk(Protocol):
    """What logprobs a row returns besides its sampled token's (model_executor/step.py's LogprobRequest)."""

    top_logprobs_num: int
    token_ids_logprob: Optional[list[int]]


class SampledRow(Protocol):
    """What the Sampler reads of a sampled request on the host: its grammar fills the vocab mask
    (constrained/bitmask.py, which also reads its params and stop ids), the processors' row check
    compares ids, `logprob` says which logprobs the row returns and `sampling_report` what else
    it asked to learn of its draw."""

    rid: str
    origin_input_ids: list[int]
    output_ids: list[int]
    logprob: Optional[LogprobAsk]
    grammar: Any  # its BaseGrammarObject, or None
    sampling_report: Optional[ReportAsk]  # the support / behaviour logprobs / entropy it asked for


class GraphSampling(Protocol):
    """A sampling step captured in a CUDA graph over the decode graph's logits
    (model_executor/sampling_graph.py): the guided rows' mix, penalties, logit bias, draw, penalty
    update and the store of the ids, all inside the graph."""

    def replay_sampling(
        self, info: SamplingBatchInfo, bs: int, generator: Optional[torch.Generator]
    ) -> Optional[torch.Tensor]:
        """[len(info)] int64 next ids of the `bs` forward rows' sampled rows, or None when this
        batch must sample eagerly."""

    def replayed_alpha(self, info: SamplingBatchInfo) -> torch.Tensor:
        """[G] float32 the alphas of `info`'s guided rows in the last replay."""


@dataclass
class SamplerInput:
    """One step's sampled rows, as the model runner hands them to Sampler.sample_step."""

    logits: torch.Tensor  # [S, V] float32, one row per sampled request; processed in place
    info: SamplingBatchInfo  # the S rows' parameters and penalty state
    positions: torch.Tensor  # [S] int64, the position of each row's last input token (keys seeded noise)
    rows: Sequence[SampledRow]  # the S requests' host state, in row order
    # Set once the previous step's tokens are in the grammars and the output lists (overlap
    # schedule); waited for before the grammar mask and the batch-level processors read them.
    host_ready: Optional[threading.Event] = None
    # The logits are the first `graph_rows` rows of the decode graph just replayed, which a
    # captured sampling graph can sample without leaving the graph.
    graph_rows: Optional[int] = None
    # Where the ids go on the device: ids_out.index_copy_(0, slots, next_ids) ([R] int64 buffer,
    # [S] int64 slots); the next decode step reads its input ids there.
    token_store: Optional[tuple[torch.Tensor, torch.Tensor]] = None
    # Beam rows ([R] int64 indices into the S rows) and how many candidates each returns; the
    # sampler does not record their sampled ids in the penalty state (the beam step does).
    beam: Optional[tuple[torch.Tensor, int]] = None
    # [G, V] the guide contexts' logits of the guided rows (info.guidance), in their order.
    guide_logits: Optional[torch.Tensor] = None


@dataclass
class SamplerOutput:
    next_ids: torch.Tensor  # [S] int64 on the logits' device, -1 on rows that failed
    row_errors: dict[int, str]  # row -> message, for rows that failed on a host-known cause
    # The logprobs the rows asked for (None when no row asked), and each row's ask.
    logprobs: Optional[LogitsProcessorOutput]
    asks: list[Optional[LogprobAsk]]
    strategy: str  # the strategy that sampled the step (one of the *_STEP names)
    beam_topk: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # LogitsProcessorOutput.beam_topk
    guidance_alpha: Optional[torch.Tensor] = None  # [G] float32, each guided row's mixing alpha
    report: Optional[SamplingReport] = None  # the rows that asked for a sampling report (sampling_report.py)


class LogprobGathers(NamedTuple):
    """What a step's caller asked for besides the sampled token's logprob (unpacks into fill_logprobs' order)."""

    top_logprobs_nums: Optional[list[int]]
    token_ids_logprobs: Optional[list[Optional[list[int]]]]


class StepCall(NamedTuple):
    """One call of a step strategy, after every logits stage before the NaN guard."""

    output: LogitsProcessorOutput  # next_token_logits [B, V] float32; the strategy sets the logprobs on it
    info: SamplingBatchInfo
    row_errors: dict[int, str]  # rows that already failed (a processor)
    positions: Optional[torch.Tensor]  # [B] int64
    logprobs: Optional[LogprobGathers]  # None: no logprobs
    # [B] int64: the watermark's token on rows it forces, -1 elsewhere (None: no watermark rows).
    forced_ids: Optional[torch.Tensor] = None
    # A fused step's forcing from its own result instead: (logits, result) -> forced ids [B] int64.
    force_after: Optional[Callable[[torch.Tensor, Any], torch.Tensor]] = None


class StepOwner(Protocol):
    """The sampler state a strategy reads (the Sampler)."""

    backend: SamplingBackend
    generator: Optional[torch.Generator]  # unseeded draws
    logprobs_mode: str
    # Seeded rows threshold over the full sort rather than a top-k window (deterministic mode on CUDA).
    seeded_full_sort: bool


class StepStrategy(Protocol):
    """NaN guard -> temperature / top-k / top-p / min-p -> draw -> logprobs for one batch."""

    name: str

    def __call__(self, call: StepCall) -> tuple[torch.Tensor, torch.Tensor]:
        """(next ids [B] int64, -1 on invalid rows; invalid [B] bool)."""


def flag_failed_rows(invalid: torch.Tensor, row_errors: dict[int, str]) -> torch.Tensor:
    """`invalid` ([B] bool) with the rows that failed before the draw set too."""
    failed = torch.tensor(sorted(row_errors), dtype=torch.int64, device=invalid.device)  # [F] int64
    return invalid.index_fill(0, failed, True)
