"""SamplingBatchInfo: the per-row sampling tensors of one batch, and the logit transforms before sampling.

Every per-row tensor is rebuilt from host-side row specs (params, processor string, custom
params) whenever the batch is built, filtered or merged, so the host flags the sampler reads
(`is_all_greedy`, `need_top_p_sampling`, ...) are always exact for the rows present. The one
piece of device state that cannot be rebuilt from the host is the penalty history, which the
orchestrator filters and merges on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from sglang.srt.constrained.bitmask import apply_token_bitmask
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor, load_custom_logit_processor
from sglang.srt.sampling.guidance import GuidanceBatch
from sglang.srt.sampling.fused_logits_bias import apply_logits_bias_fused, update_penalties_fused
from sglang.srt.sampling.penaltylib import BatchedPenalizerOrchestrator
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.sampling.watermarking.state import WatermarkRows


@dataclass
class RowSpec:
    """What the sampler needs to know about one row, all host-side."""

    params: SamplingParams
    processor_str: Optional[str] = None
    custom_params: Optional[dict] = None
    grammar: Optional[Any] = None  # the request's BaseGrammarObject
    # What batch-level logits processors are told about the row (BatchUpdate.added).
    prompt_ids: Sequence[int] = ()
    output_ids: Sequence[int] = field(default_factory=list)  # the request's live output list


@dataclass
class ProcessorEntry:
    """One distinct custom processor and the rows it runs on (error set when it failed to load)."""

    processor: Optional[CustomLogitProcessor]
    error: Optional[str]
    rows: list[int]
    indices: torch.Tensor  # [len(rows)] int64 on device


@dataclass
class SamplingBatchInfo:
    rows: list[RowSpec]
    vocab_size: int
    device: torch.device
    custom_logit_processor_allowlist: Optional[frozenset[str]] = None
    penalizer_orchestrator: Optional[BatchedPenalizerOrchestrator] = None
    # The grammar rows' packed bitmask ([B, ceil(V / 32)] int32, bit set = allowed), set by the
    # model runner for one step (constrained/bitmask.py).
    vocab_mask: Optional[torch.Tensor] = None
    # The server's batch-level processor classes (logits_processor.LoadedLogitsProcessors).
    loaded_logits_processors: Optional[Any] = None

    # Rebuilt from `rows` by _rebuild().
    temperatures: torch.Tensor = field(init=False)  # [B, 1] float32
    top_ps: torch.Tensor = field(init=False)  # [B] float32
    top_ks: torch.Tensor = field(init=False)  # [B] int32, >= vocab means no top-k
    min_ps: torch.Tensor = field(init=False)  # [B] float32
    sampling_seed: Optional[torch.Tensor] = field(init=False)  # [B] int64, 0 on unseeded rows
    seeded_rows: Optional[torch.Tensor] = field(init=False)  # [S] int64
    seeded_mask: Optional[torch.Tensor] = field(init=False)  # [B] bool, set with seeded_rows
    greedy_mask: Optional[torch.Tensor] = field(init=False)  # [B] bool, set for mixed batches
    logit_bias_ids: Optional[torch.Tensor] = field(init=False)  # [B, K] int64, pad 0
    logit_bias_values: Optional[torch.Tensor] = field(init=False)  # [B, K] float32, pad 0.0
    custom_logit_processor: Optional[dict[str, ProcessorEntry]] = field(init=False)
    custom_params: Optional[list[Optional[dict]]] = field(init=False)
    # The watermarked (sampled) rows and their keys, None without any (sampling/watermarking).
    watermark: Optional[WatermarkRows] = field(init=False)
    # Per-row grammar objects (None where a row has none), or None without grammar rows; their
    # presence turns on the TP token all-reduce and the eager sampling step.
    grammars: Optional[list[Any]] = field(init=False)
    # The CPU sampler's grouping of these rows, built on first use (layers/sampler_cpu.py's CpuPlan).
    cpu_sample_plan: Optional[Any] = field(init=False, default=None)
    # (sampler, whether its captured sampling graph can sample these rows), decided on first use.
    graph_choice: Optional[tuple[Any, bool]] = field(init=False, default=None)
    # The processors acting on some row of this batch (logits_processor.LogitsProcessorPipeline),
    # None when none does: that batch's step runs no processor code at all.
    logits_processors: Optional[Any] = field(init=False, default=None)
    # The guided rows and their mixing coefficients (sampling/guidance.py), None when no row is guided.
    guidance: Optional[GuidanceBatch] = field(init=False, default=None)

    @classmethod
    def from_schedule_batch(cls, batch: Any, vocab_size: int) -> "SamplingBatchInfo":
        """Build from `batch.reqs`; custom processors count only when the server enables them."""
        enable_processors = getattr(batch, "enable_custom_logit_processor", False)
        rows = [
            RowSpec(
                params=req.sampling_params,
                processor_str=req.custom_logit_processor if enable_processors else None,
                custom_params=req.custom_params,
                grammar=getattr(req, "grammar", None),
                prompt_ids=req.origin_input_ids,
                output_ids=req.output_ids,
            )
            for req in batch.reqs
        ]
        info = cls(
            rows=rows,
            vocab_size=vocab_size,
            device=torch.device(batch.device),
            custom_logit_processor_allowlist=getattr(batch, "custom_logit_processor_allowlist", None),
            loaded_logits_processors=getattr(batch, "loaded_logits_processors", None),
        )
        orchestrator = BatchedPenalizerOrchestrator(vocab_size, batch)
        info.penalizer_orchestrator = orchestrator if orchestrator.is_required else None
        if info.penalizer_orchestrator is None:
            orchestrator.release()
        info._orchestrator_batch = batch
        return info

    def __post_init__(self) -> None:
        self._orchestrator_batch = None
        self._repeated: Optional[tuple[int, SamplingBatchInfo]] = None  # repeated_rows' last result
        self._rebuild()

    def __len__(self) -> int:
        return len(self.rows)

    # ------------------------------------------------------------------ building

    def _rebuild(self) -> None:
        params = [row.params for row in self.rows]
        self.cpu_sample_plan = self.graph_choice = self._repeated = None
        self._refresh_flags(params)
        self._build_param_tensors(params)
        self._build_seeds(params)
        self._build_logit_bias(params)
        self._build_processors()
        self.guidance = GuidanceBatch.build([p.guidance for p in params], self.device)
        self.watermark = WatermarkRows.build([p.watermark for p in params], [p.top_k <= 1 for p in params], self.device)
        grammars = [row.grammar for row in self.rows]
        self.grammars = grammars if any(g is not None for g in grammars) else None
        loaded = self.loaded_logits_processors
        self.logits_processors = loaded.pipeline_for(self.rows, self.logits_processors) if loaded is not None else None

    def _refresh_flags(self, params: list[SamplingParams]) -> None:
        vocab = self.vocab_size
        greedy = [p.top_k <= 1 for p in params]
        sampled = [p for p, g in zip(params, greedy) if not g]
        self.is_all_greedy = all(greedy)
        self.is_any_greedy = any(greedy)
        self.need_top_k_sampling = any(p.top_k < vocab for p in sampled)
        self.need_top_p_sampling = any(p.top_p < 1.0 for p in sampled)
        self.need_min_p_sampling = any(p.min_p > 0.0 for p in sampled)
        self.need_temperature_scaling = any(p.temperature != 1.0 for p in params)
        self.npu_top_k_top_p_eligible = all(1 <= p.top_k <= 1024 for p in params)
        # Every row keeps at most max_top_k ranks (plus ties), so a top-k window suffices.
        bounded = bool(params) and all(p.top_k < vocab for p in params)
        self.max_top_k = max(p.top_k for p in params) if bounded else None

    def _build_param_tensors(self, params: list[SamplingParams]) -> None:
        dev = self.device
        self.temperatures = torch.tensor([[p.temperature] for p in params], dtype=torch.float32, device=dev)
        self.top_ps = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=dev)
        self.top_ks = torch.tensor([min(p.top_k, self.vocab_size) for p in params], dtype=torch.int32, device=dev)
        self.min_ps = torch.tensor([p.min_p for p in params], dtype=torch.float32, device=dev)
        if self.is_any_greedy and not self.is_all_greedy:
            self.greedy_mask = torch.tensor([p.top_k <= 1 for p in params], dtype=torch.bool, device=dev)
        else:
            self.greedy_mask = None

    def _build_seeds(self, params: list[SamplingParams]) -> None:
        seeded = [i for i, p in enumerate(params) if p.sampling_seed is not None and p.top_k > 1]
        # Every sampled (non-greedy) row has a seed, so no unseeded draw is needed.
        self.all_seeded = bool(seeded) and len(seeded) == sum(1 for p in params if p.top_k > 1)
        if not seeded:
            self.sampling_seed = self.seeded_rows = self.seeded_mask = None
            return
        seeds = [p.sampling_seed if p.sampling_seed is not None else 0 for p in params]
        self.sampling_seed = torch.tensor(seeds, dtype=torch.int64, device=self.device)
        self.seeded_rows = torch.tensor(seeded, dtype=torch.int64, device=self.device)
        mask = [False] * len(params)
        for i in seeded:
            mask[i] = True
        self.seeded_mask = torch.tensor(mask, dtype=torch.bool, device=self.device)

    def _build_logit_bias(self, params: list[SamplingParams]) -> None:
        per_row = [_dedup_logit_bias(p.logit_bias) for p in params]
        width = max((len(b) for b in per_row), default=0)
        if width == 0:
            self.logit_bias_ids = self.logit_bias_values = None
            return
        # Pads add 0.0 to column 0, which leaves it unchanged.
        ids = [list(b.keys()) + [0] * (width - len(b)) for b in per_row]
        values = [list(b.values()) + [0.0] * (width - len(b)) for b in per_row]
        self.logit_bias_ids = torch.tensor(ids, dtype=torch.int64, device=self.device)
        self.logit_bias_values = torch.tensor(values, dtype=torch.float32, device=self.device)

    def _build_processors(self) -> None:
        groups: dict[str, list[int]] = {}
        for i, row in enumerate(self.rows):
            if row.processor_str is not None:
                groups.setdefault(row.processor_str, []).append(i)
        if not groups:
            self.custom_logit_processor = self.custom_params = None
            return
        self.custom_logit_processor = {
            key: self._processor_entry(key, rows) for key, rows in groups.items()
        }
        self.custom_params = [row.custom_params for row in self.rows]

    def _processor_entry(self, processor_str: str, rows: list[int]) -> ProcessorEntry:
        indices = torch.tensor(rows, dtype=torch.int64, device=self.device)
        try:
            processor = load_custom_logit_processor(processor_str, allowlist=self.custom_logit_processor_allowlist)
        except ValueError as err:
            return ProcessorEntry(processor=None, error=str(err), rows=rows, indices=indices)
        return ProcessorEntry(processor=processor, error=None, rows=rows, indices=indices)

    def repeated_rows(self, times: int) -> "SamplingBatchInfo":
        """An info whose row i * times + j is row i (a verify's positions of one request), without
        penalty state or batch-level processors; kept until this batch changes."""
        if self._repeated is None or self._repeated[0] != times:
            rows = [row for row in self.rows for _ in range(times)]
            info = SamplingBatchInfo(rows, self.vocab_size, self.device, self.custom_logit_processor_allowlist)
            self._repeated = (times, info)
        return self._repeated[1]

    @property
    def has_custom_logit_processor(self) -> bool:
        return self.custom_logit_processor is not None

    # ------------------------------------------------------------------ batch changes

    def filter_batch(self, keep_indices: list[int], keep_indices_device: Optional[torch.Tensor] = None) -> None:
        """Keep only `keep_indices` (the caller has already filtered batch.reqs the same way)."""
        if keep_indices_device is None:
            keep_indices_device = torch.tensor(keep_indices, dtype=torch.int64, device=self.device)
        if self.penalizer_orchestrator is not None:
            self.penalizer_orchestrator.filter(keep_indices_device)
            if not self.penalizer_orchestrator.is_required:
                self.penalizer_orchestrator = None
        self.rows = [self.rows[i] for i in keep_indices]
        self._rebuild()

    def merge_batch(self, other: "SamplingBatchInfo") -> None:
        """Append `other`'s rows after ours (call before the batch's reqs list is concatenated)."""
        self._merge_orchestrators(other)
        self.rows = self.rows + other.rows
        self._rebuild()

    def _merge_orchestrators(self, other: "SamplingBatchInfo") -> None:
        mine, theirs = self.penalizer_orchestrator, other.penalizer_orchestrator
        if mine is None and theirs is None:
            return
        # A side without penalties gets an orchestrator over its own reqs so both sides have
        # the same penalizers prepared before concatenation.
        mine = mine or self._fresh_orchestrator()
        theirs = theirs or other._fresh_orchestrator()
        mine.merge(theirs)
        self.penalizer_orchestrator = mine

    def _fresh_orchestrator(self) -> BatchedPenalizerOrchestrator:
        if self._orchestrator_batch is None:
            raise ValueError("merge_batch: a batch with penalties can only merge an info built by from_schedule_batch")
        return BatchedPenalizerOrchestrator(self.vocab_size, self._orchestrator_batch)

    # ------------------------------------------------------------------ per-step transforms

    def apply_logits_bias(self, logits: torch.Tensor) -> None:
        """In place: penalties (additive, then repetition), logit_bias, then the grammar mask.

        The mask comes last so that CUDA keeps one fused penalties-and-bias kernel; a bias still
        cannot re-enable a masked token (it is finite, the masked token ends -inf)."""
        if not (logits.is_cuda and apply_logits_bias_fused(self, logits)):
            if self.penalizer_orchestrator is not None:
                self.penalizer_orchestrator.apply(logits)
            if self.logit_bias_ids is not None:
                logits.scatter_add_(1, self.logit_bias_ids, self.logit_bias_values.to(logits.dtype))
        if self.vocab_mask is not None:
            apply_token_bitmask(logits, self.vocab_mask)

    def update_penalties(self, next_token_ids: torch.Tensor) -> None:
        """Fold this step's sampled ids ([B] int64, on device) into the penalty state.

        Called right after sampling, before the host has seen the ids, so under the overlap
        schedule the next step's penalties already include them (no one-token lag). Rows the
        sampler flagged (id -1) are skipped.
        """
        if self.penalizer_orchestrator is None:
            return
        if next_token_ids.is_cuda and update_penalties_fused(self, next_token_ids):
            return
        self.penalizer_orchestrator.cumulate_output_tokens(next_token_ids)


def _dedup_logit_bias(bias: Optional[dict]) -> dict[int, float]:
    """Keys are token-id strings; "1" and "01" name the same token, the last one wins."""
    if not bias:
        return {}
    return {int(key): float(value) for key, value in bias.items()}

