"""Sampler: the one owner of a step's logits processing, and the sampling-backend registry.

The order of one step (Sampler.sample_step), the same for every row and every path:
  guidance mix (guided rows only, sampling/guidance.py) -> penalties (additive, then repetition) ->
  logit_bias -> grammar mask -> batch-level logits processors -> custom logit processors ->
  NaN/inf guard -> greedy (argmax, lowest id on ties) -> temperature -> top-k / top-p / min-p ->
  draw (seeded rows by hash-Gumbel; watermarked rows by the keyed context hash,
  sampling/watermarking) -> logprobs -> TP token sync -> penalty update -> the ids stored for the
  next decode step.
The stages before the guard are sampler_stages.py; from the guard on, a step strategy runs them:
  FusedStep (sampler_fused.py)     a fused backend's kernels (triton)
  CpuGroupedStep (sampler_cpu.py)  the pytorch backend on the CPU, rows grouped once per batch
  TorchStep (sampler_torch.py)     every other plain backend and device
chosen once, when the sampler's device is known. A decode batch whose forward replayed a CUDA
graph may instead replay a captured sampling graph (GraphSampling, model_executor/sampling_graph.py),
which runs the guided rows' mix (guide contexts on the served model), the penalties, the bias, the
draw and the penalty update on the device; whether a batch
can is decided once per batch composition (cached on its SamplingBatchInfo, which drops the choice
whenever its rows change).

Nothing here reads a device value on the host, so a CUDA step never synchronises; every decision
is a host flag set when the batch was built. `forward` (custom processors onwards) and
`compute_logprobs_only` are the library entry points for callers that run the earlier stages
themselves.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from sglang.srt.beam_search.selection import row_candidates
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.logprob_processor import LOGPROBS_MODES, clamped_log_softmax, default_logprobs_mode, fill_logprobs
from sglang.srt.layers.sampler_cpu import CpuGroupedStep
from sglang.srt.layers.sampler_fused import FusedStep
from sglang.srt.layers.sampler_io import (
    CPU_GROUPED_STEP,
    FUSED_STEP,
    GRAPH_STEP,
    TORCH_STEP,
    UNDECIDED,
    GraphSampling,
    LogprobAsk,
    LogprobGathers,
    SamplerInput,
    SamplerOutput,
    StepCall,
    StepStrategy,
)
from sglang.srt.layers.sampler_stages import (
    apply_custom_logit_processors,
    apply_penalties_bias_and_mask,
    main_context_logprobs,
    mix_guided_rows,
    run_batch_processors,
)
from sglang.srt.layers.sampler_torch import TorchStep
from sglang.srt.layers.sampling_report import ReportPlan
from sglang.srt.layers.sampler_verify import VerifyInput, VerifyOutput, verify
from sglang.srt.layers.sampling_backends import (
    BACKENDS,
    BUILT_IN_BACKENDS,
    FusedSamplingBackend,
    PytorchBackend,
    SamplingBackend,
    register_backend,
)
from sglang.srt.sampling.logits_processor.pipeline import check_requested as logits_processor_check_requested
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.watermarking.state import WatermarkState

__all__ = [
    "BUILT_IN_SAMPLING_BACKENDS",
    "CPU_GROUPED_STEP",
    "FUSED_STEP",
    "GRAPH_STEP",
    "SAMPLING_BACKEND_CHOICES",
    "TORCH_STEP",
    "UNDECIDED",
    "Sampler",
    "SamplerInput",
    "SamplerOutput",
    "create_sampler",
    "register_sampler_backend",
    "sync_token_ids_requested",
]

logger = logging.getLogger(__name__)

BUILT_IN_SAMPLING_BACKENDS = frozenset(BUILT_IN_BACKENDS)
SAMPLING_BACKEND_CHOICES: set[str] = set(BUILT_IN_SAMPLING_BACKENDS)
_CUSTOM_SAMPLER_FACTORIES: dict[str, Callable[[], "Sampler"]] = {}


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def sync_token_ids_requested() -> bool:
    """SYNC_TOKEN_IDS_ACROSS_TP or SGLANG_SYNC_TOKEN_IDS_ACROSS_TP."""
    return _env_true("SYNC_TOKEN_IDS_ACROSS_TP") or _env_true("SGLANG_SYNC_TOKEN_IDS_ACROSS_TP")


class Sampler(nn.Module):
    def __init__(
        self,
        backend: Union[str, SamplingBackend] = "pytorch",
        *,
        tp_group: Optional[dist.ProcessGroup] = None,
        logprobs_mode: Optional[str] = None,
        generator: Optional[torch.Generator] = None,
        deterministic: bool = False,
        device: Optional[Union[torch.device, str]] = None,
    ) -> None:
        """`device` is where the logits will be; by default the generator's device, and without
        a generator the first call's logits decide it (then it is fixed)."""
        super().__init__()
        self.backend = _make_backend(backend)
        self.logprobs_mode = logprobs_mode or default_logprobs_mode()
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {self.logprobs_mode!r}.")
        self.tp_group = tp_group
        self.sync_token_ids = sync_token_ids_requested()
        # SGLANG_CHECK_LOGITS_PROCESSORS: check each batch-level processor's view of the rows.
        self.check_logits_processors = logits_processor_check_requested()
        # Unseeded draws; TP ranks pass generators seeded alike so they draw the same noise.
        self.generator = generator
        # --enable-deterministic-inference: a seeded row's token must not depend on its batch-mates.
        self.deterministic = deterministic
        # The request slots' watermark contexts (--enable-watermark), set by the model runner.
        self.watermark_state: Optional[WatermarkState] = None
        self._graph: Optional[GraphSampling] = None
        if device is None and generator is not None:
            device = generator.device
        self._bind(None if device is None else torch.device(device))

    def _bind(self, device: Optional[torch.device]) -> None:
        """Fix the step strategy (and what depends on the device) for logits on `device`."""
        self.device = device
        # Top-p sums over the seeded rows' window: on the CPU a sequential prefix sum whose values
        # do not depend on the window's width, on CUDA a parallel scan whose rounding does.
        # Deterministic mode on CUDA therefore thresholds over the full sort, whose width is the
        # vocabulary whatever the batch.
        self.seeded_full_sort = self.deterministic and device is not None and device.type == "cuda"
        self.step: Optional[StepStrategy] = self._choose_step(device)

    def _choose_step(self, device: Optional[torch.device]) -> Optional[StepStrategy]:
        """The strategy for logits on `device`; None until the device is known."""
        if isinstance(self.backend, FusedSamplingBackend):
            return FusedStep(self)
        if device is None:
            return None
        if type(self.backend) is PytorchBackend and device.type == "cpu":
            return CpuGroupedStep(self)
        return TorchStep(self)

    @property
    def step_name(self) -> str:
        return UNDECIDED if self.step is None else self.step.name

    def attach_graph(self, graph: GraphSampling) -> None:
        """Let decode batches whose forward replayed a CUDA graph sample in its captured sampling graph."""
        self._graph = graph

    # ------------------------------------------------------------------ the step

    def sample_step(self, inp: SamplerInput) -> SamplerOutput:
        """Every stage of one step over `inp.logits` ([S, V], processed in place), in the order of
        this module's docstring: the sampled ids stored, the penalty state updated, the rows that
        failed and the logprobs asked for returned."""
        asks = [row.logprob for row in inp.rows]
        report = ReportPlan.of([row.sampling_report for row in inp.rows])
        if report is None and self._samples_in_graph(inp, asks):
            next_ids = self._graph.replay_sampling(inp.info, inp.graph_rows, self.generator)
            if next_ids is not None:
                alpha = None if inp.info.guidance is None else self._graph.replayed_alpha(inp.info)
                return SamplerOutput(next_ids, {}, None, asks, GRAPH_STEP, guidance_alpha=alpha)
        return self._sample_eagerly(inp, asks, report)

    def graph_step_applies(self, info: SamplingBatchInfo, wants_logprobs: bool) -> bool:
        """Whether a captured sampling graph can run this batch's step: it has no host stage
        (grammar mask, processors), no guide context on the guide model, no logprobs, no TP token
        sync, and no watermarked row unless the watermark runs in its kernels."""
        return not (
            (info.watermark is not None and (self.watermark_state is None or not self.watermark_state.kernels))
            or info.has_custom_logit_processor
            or (info.guidance is not None and info.guidance.on_guide_model)
            or info.logits_processors is not None
            or info.grammars is not None
            or wants_logprobs
            or (self.tp_group is not None and self.sync_token_ids)
        )

    def _samples_in_graph(self, inp: SamplerInput, asks: list[Optional[LogprobAsk]]) -> bool:
        if self._graph is None or inp.graph_rows is None or inp.beam is not None:
            return False
        choice = inp.info.graph_choice
        if choice is None or choice[0] is not self:  # decided once per batch composition
            choice = inp.info.graph_choice = (self, self.graph_step_applies(inp.info, any(a is not None for a in asks)))
        return choice[1]

    def _sample_eagerly(
        self, inp: SamplerInput, asks: list[Optional[LogprobAsk]], report: Optional[ReportPlan]
    ) -> SamplerOutput:
        info, logits = inp.info, inp.logits
        if inp.host_ready is not None:
            inp.host_ready.wait()
        return_logprob = any(a is not None for a in asks)
        # The raw mode reports a guided row's main context: its logits before the mix.
        raw_main = None
        if return_logprob and self.logprobs_mode == "raw" and info.guidance is not None:
            raw_main = logits.index_select(0, info.guidance.rows)  # [G, V]
        alpha = mix_guided_rows(logits, info, inp.guide_logits)
        apply_penalties_bias_and_mask(logits, info, inp.rows)
        row_errors = run_batch_processors(logits, info, inp.rows if self.check_logits_processors else None)
        out = LogitsProcessorOutput(next_token_logits=logits, beam_ask=inp.beam)
        top_logprobs_nums = [a.top_logprobs_num if a else 0 for a in asks]
        token_ids_logprobs = [a.token_ids_logprob if a else None for a in asks]
        next_ids = self.forward(
            out,
            info,
            return_logprob=return_logprob,
            top_logprobs_nums=top_logprobs_nums,
            token_ids_logprobs=token_ids_logprobs,
            positions=inp.positions,
            row_errors=row_errors,
            report=report,
            slots=None if inp.token_store is None else inp.token_store[1],
        )
        if raw_main is not None:
            main_context_logprobs(out, raw_main, info, next_ids, top_logprobs_nums, token_ids_logprobs)
        info.update_penalties(next_ids if inp.beam is None else next_ids.index_fill(0, inp.beam[0], -1))
        if inp.token_store is not None:
            ids_out, slots = inp.token_store
            ids_out.index_copy_(0, slots, next_ids)
        return SamplerOutput(
            next_ids, dict(out.row_errors), out if return_logprob else None, asks, self.step_name, out.beam_topk, alpha,
            report.result if report is not None else None,
        )

    def verify_step(self, inp: VerifyInput) -> VerifyOutput:
        """A speculative verify step: every draft position sampled as the decode step it stands
        for, and the drafts that match the draws accepted (layers/sampler_verify.py)."""
        return verify(self, inp)

    # ------------------------------------------------------------------ library entry points

    def forward(
        self,
        logits_output: LogitsProcessorOutput,
        sampling_info: SamplingBatchInfo,
        return_logprob: bool = False,
        top_logprobs_nums: Optional[list[int]] = None,
        token_ids_logprobs: Optional[list[Optional[list[int]]]] = None,
        positions: Optional[torch.Tensor] = None,
        row_errors: Optional[dict[int, str]] = None,
        report: Optional[ReportPlan] = None,
        slots: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Custom processors onwards, over logits whose earlier stages already ran: next token ids
        [B] int64; -1 on rows flagged in `logits_output.invalid_rows`.

        `positions` ([B] int64, the position of each row's last input token) keys the noise of
        seeded rows and is required when any row has a sampling_seed. `row_errors` are rows that
        already failed before the sampler (a batch-level logits processor): they get -1 too.
        `report` (the rows that asked for their support, behaviour logprobs or entropy) captures
        its rows' logits after the custom processors and holds their report in `report.result`.
        `slots` ([B] int64, the rows' request slots) key the watermark state; required when any
        row is watermarked.
        """
        info = sampling_info
        if info.seeded_rows is not None and positions is None:
            raise ValueError("positions are required to sample rows that have a sampling_seed.")
        # next_token_logits: [B, V] float32, processed in place by custom processors.
        row_errors = {**apply_custom_logit_processors(logits_output.next_token_logits, info), **(row_errors or {})}
        if logits_output.beam_ask is not None:
            # Beam rows rank the fully processed logits, before temperature and the filters.
            rows, num_candidates = logits_output.beam_ask
            logits_output.beam_topk = row_candidates(logits_output.next_token_logits.index_select(0, rows), num_candidates)
        logprobs = LogprobGathers(top_logprobs_nums, token_ids_logprobs) if return_logprob else None
        if report is not None:
            report.capture(logits_output.next_token_logits)
        if self.step is None:
            self._bind(logits_output.next_token_logits.device)
        forced, force_after = self._watermark(logits_output.next_token_logits, info, slots)
        next_ids, invalid = self.step(StepCall(logits_output, info, row_errors, positions, logprobs, forced, force_after))
        if info.watermark is not None:
            self.watermark_state.append(info, slots, next_ids)
        logits_output.invalid_rows = invalid
        logits_output.row_errors = row_errors
        self._sync_token_ids_across_tp(next_ids, info)
        if report is not None:
            report.result = report.finish(info, next_ids, self.seeded_full_sort)
        return next_ids

    def _watermark(
        self, logits: torch.Tensor, info: SamplingBatchInfo, slots: Optional[torch.Tensor]
    ) -> tuple[Optional[torch.Tensor], Optional[Callable[[torch.Tensor, Any], torch.Tensor]]]:
        """The watermark's tokens: [B] int64 (-1 where the row samples normally), or a fused
        step's forcing from its support statistics; (None, None) without watermarked rows."""
        wm, state = info.watermark, self.watermark_state
        if wm is None:
            return None, None
        if state is None or slots is None:
            raise ValueError("watermark: this sampler has no watermark state (--enable-watermark) or no request slots.")
        if state.kernels and getattr(self.backend, "support_statistics", False):
            def force_after(logits: torch.Tensor, result: Any) -> torch.Tensor:
                return state.force_from_stats(logits, info.temperatures, result, slots, wm.rows, wm.keys, wm.windows)

            return None, force_after
        return state.force(logits, info, slots), None

    def compute_logprobs_only(
        self,
        logits_output: LogitsProcessorOutput,
        sampling_info: SamplingBatchInfo,
        top_logprobs_nums: Optional[list[int]] = None,
        token_ids_logprobs: Optional[list[Optional[list[int]]]] = None,
    ) -> Optional[LogitsProcessorOutput]:
        """Prefill-only scoring: log_softmax of the processed logits (no temperature), top-k and
        token-id logprobs, no sampling. None when nothing is asked for."""
        wants_top = any(n > 0 for n in top_logprobs_nums or ())
        wants_ids = any(ids for ids in token_ids_logprobs or ())
        if logits_output.next_token_logits is None or not (wants_top or wants_ids):
            return None
        logits_output.row_errors = apply_custom_logit_processors(logits_output.next_token_logits, sampling_info)
        logprobs = clamped_log_softmax(logits_output.next_token_logits)
        fill_logprobs(logits_output, logprobs, None, top_logprobs_nums, token_ids_logprobs)
        return logits_output

    def _sync_token_ids_across_tp(self, next_ids: torch.Tensor, info: SamplingBatchInfo) -> None:
        if self.tp_group is None or not (self.sync_token_ids or info.grammars):
            return
        if dist.get_world_size(self.tp_group) == 1:
            return
        dist.all_reduce(next_ids, op=dist.ReduceOp.MIN, group=self.tp_group)


def _make_backend(backend: Union[str, SamplingBackend]) -> SamplingBackend:
    if isinstance(backend, SamplingBackend):
        return backend
    if backend not in BACKENDS:
        raise ValueError(f"sampling_backend must be one of {sorted(BACKENDS)} for the built-in Sampler, got {backend!r}.")
    return BACKENDS[backend]()


def register_sampler_backend(name: str, factory: Union[Callable[[], Sampler], type[SamplingBackend]]) -> None:
    """Make `--sampling-backend name` build its Sampler with `factory()`, or, given a
    SamplingBackend class, a Sampler over that backend (checked against the interface now)."""
    if not isinstance(name, str) or not name:
        raise ValueError("backend must be a non-empty string")
    is_backend = isinstance(factory, type) and not issubclass(factory, Sampler)
    if is_backend:
        register_backend(name, factory)  # raises TypeError on a class missing a declared method
    if name in SAMPLING_BACKEND_CHOICES:
        logger.warning("Overriding sampling backend %r", name)
    if is_backend:
        _CUSTOM_SAMPLER_FACTORIES.pop(name, None)
    else:
        _CUSTOM_SAMPLER_FACTORIES[name] = factory
    SAMPLING_BACKEND_CHOICES.add(name)


def create_sampler(backend: Optional[str] = None, **kwargs) -> Sampler:
    """A registered Sampler factory wins; otherwise a built-in or registered backend (None = pytorch)."""
    if backend in _CUSTOM_SAMPLER_FACTORIES:
        sampler = _CUSTOM_SAMPLER_FACTORIES[backend]()
        if not isinstance(sampler, Sampler):
            raise TypeError(f"Custom sampler factory for backend '{backend}' must return a Sampler")
        return sampler
    if backend is None or backend in BACKENDS:
        return Sampler(backend or "pytorch", **kwargs)
    raise ValueError(f"Unknown sampling backend '{backend}'. Register it via register_sampler_backend().")
