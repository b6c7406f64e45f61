"""Sampler: processed logits -> next token ids (+ logprobs), and the sampling-backend registry.

Order per step (after SamplingBatchInfo.apply_logits_bias and the batch-level logits processors,
whose failed rows arrive as `row_errors`):
  custom processors -> NaN/inf guard -> greedy (argmax, lowest id on ties) -> temperature ->
  top-k / top-p / min-p + draw (backend; seeded rows by hash-Gumbel) -> logprobs -> TP sync.
Nothing here reads a device value on the host, so a CUDA step never synchronises; every
decision is a host flag set when the batch was built.

The step is chosen once, when the sampler's device is known (vLLM's TopKTopPSampler does the
same by platform): a fused backend runs its own kernels (_fused_step); the pytorch backend on the
CPU groups the rows once per batch (_CpuPlan, _cpu_grouped_step): greedy rows only take an argmax,
and each group of sampled rows computes its support once for its unseeded and seeded rows, with
the same tokens as the batch-wide path; every other backend and device takes the batch-wide torch
path (_torch_step).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.logprob_processor import LOGPROBS_MODES, clamped_log_softmax, default_logprobs_mode, fill_logprobs
from sglang.srt.layers.sampling_backends import (
    BACKENDS,
    BUILT_IN_BACKENDS,
    FusedSamplingBackend,
    PytorchBackend,
    SamplingBackend,
    every_row_support,
    register_backend,
)
from sglang.srt.layers.sampling_ops import (
    Support,
    compute_support,
    draw_seeded,
    draw_seeded_in_window,
    draw_unseeded,
    draw_unseeded_in_window,
    uniform_open_closed,
)

logger = logging.getLogger(__name__)

BUILT_IN_SAMPLING_BACKENDS = frozenset(BUILT_IN_BACKENDS)
SAMPLING_BACKEND_CHOICES: set[str] = set(BUILT_IN_SAMPLING_BACKENDS)
_CUSTOM_SAMPLER_FACTORIES: dict[str, Callable[[], "Sampler"]] = {}


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def sync_token_ids_requested() -> bool:
    """SYNC_TOKEN_IDS_ACROSS_TP (SGLang's name) or SGLANG_SYNC_TOKEN_IDS_ACROSS_TP."""
    return _env_true("SYNC_TOKEN_IDS_ACROSS_TP") or _env_true("SGLANG_SYNC_TOKEN_IDS_ACROSS_TP")


class _LogprobRequest(NamedTuple):
    """What a step's caller asked for besides the sampled token's logprob (unpacks into fill_logprobs' order)."""

    top_logprobs_nums: Optional[list[int]]
    token_ids_logprobs: Optional[list[Optional[list[int]]]]


class _StepCall(NamedTuple):
    """One forward call, as every step takes it."""

    output: LogitsProcessorOutput  # next_token_logits [B, V] float32; the step sets the logprobs on it
    info: object  # SamplingBatchInfo
    row_errors: dict[int, str]  # rows whose custom processor failed
    positions: Optional[torch.Tensor]  # [B] int64
    logprobs: Optional[_LogprobRequest]  # None: no logprobs


# A step: one call -> (next ids [B] int64, -1 on invalid rows; invalid [B] bool).
Step = Callable[[_StepCall], tuple[torch.Tensor, torch.Tensor]]

# Names of the steps, as Sampler.step_name reports them.
FUSED_STEP, CPU_GROUPED_STEP, TORCH_STEP, UNDECIDED = "fused", "cpu_grouped", "torch", "undecided"


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
        # Unseeded draws; TP ranks pass generators seeded alike so they draw the same noise.
        self.generator = generator
        # --enable-deterministic-inference: a seeded row's token must not depend on its batch-mates.
        self.deterministic = deterministic
        if device is None and generator is not None:
            device = generator.device
        self._bind(None if device is None else torch.device(device))

    def _bind(self, device: Optional[torch.device]) -> None:
        """Fix the step (and what depends on the device) for logits on `device`."""
        self.device = device
        # Top-p sums over the seeded rows' window: on the CPU a sequential prefix sum whose values
        # do not depend on the window's width, on CUDA a parallel scan whose rounding does.
        # Deterministic mode on CUDA therefore thresholds over the full sort, whose width is the
        # vocabulary whatever the batch.
        self._seeded_full_sort = self.deterministic and device is not None and device.type == "cuda"
        self.step_name, self._step = self._choose_step(device)

    def _choose_step(self, device: Optional[torch.device]) -> tuple[str, Step]:
        if isinstance(self.backend, FusedSamplingBackend):
            return FUSED_STEP, self._fused_step
        if device is None:
            return UNDECIDED, self._step_on_first_call
        if type(self.backend) is PytorchBackend and device.type == "cpu":
            return CPU_GROUPED_STEP, self._cpu_grouped_step
        return TORCH_STEP, self._torch_step

    def _step_on_first_call(self, call: _StepCall) -> tuple[torch.Tensor, torch.Tensor]:
        self._bind(call.output.next_token_logits.device)
        return self._step(call)

    def forward(
        self,
        logits_output: LogitsProcessorOutput,
        sampling_info,
        return_logprob: bool = False,
        top_logprobs_nums: Optional[list[int]] = None,
        token_ids_logprobs: Optional[list[Optional[list[int]]]] = None,
        positions: Optional[torch.Tensor] = None,
        row_errors: Optional[dict[int, str]] = None,
    ) -> torch.Tensor:
        """Next token ids [B] int64; -1 on rows flagged in `logits_output.invalid_rows`.

        `positions` ([B] int64, the position of each row's last input token) keys the noise of
        seeded rows and is required when any row has a sampling_seed. `row_errors` are rows that
        already failed before the sampler (a batch-level logits processor): they get -1 too.
        """
        info = sampling_info
        if info.seeded_rows is not None and positions is None:
            raise ValueError("positions are required to sample rows that have a sampling_seed.")
        # next_token_logits: [B, V] float32, processed in place by custom processors.
        row_errors = {**self._apply_custom_logit_processors(logits_output.next_token_logits, info), **(row_errors or {})}
        logprobs = _LogprobRequest(top_logprobs_nums, token_ids_logprobs) if return_logprob else None
        next_ids, invalid = self._step(_StepCall(logits_output, info, row_errors, positions, logprobs))
        logits_output.invalid_rows = invalid
        logits_output.row_errors = row_errors
        self._sync_token_ids_across_tp(next_ids, info)
        return next_ids

    def compute_logprobs_only(
        self,
        logits_output: LogitsProcessorOutput,
        sampling_info,
        top_logprobs_nums: Optional[list[int]] = None,
        token_ids_logprobs: Optional[list[Optional[list[int]]]] = None,
    ) -> Optional[LogitsProcessorOutput]:
        """Prefill-only scoring: log_softmax of the processed logits (no temperature), top-k and
        token-id logprobs, no sampling. None when nothing is asked for."""
        wants_top = any(n > 0 for n in top_logprobs_nums or ())
        wants_ids = any(ids for ids in token_ids_logprobs or ())
        if logits_output.next_token_logits is None or not (wants_top or wants_ids):
            return None
        logits_output.row_errors = self._apply_custom_logit_processors(logits_output.next_token_logits, sampling_info)
        logprobs = clamped_log_softmax(logits_output.next_token_logits)
        fill_logprobs(logits_output, logprobs, None, top_logprobs_nums, token_ids_logprobs)
        return logits_output

    # ------------------------------------------------------------------ steps

    def _fused_step(self, call: _StepCall) -> tuple[torch.Tensor, torch.Tensor]:
        """The step through a fused backend: greedy rows, NaN guard, temperature, filters, every
        row's draw and the logprob statistics in its kernels. The logits stay unscaled."""
        output, info, row_errors, positions, logprobs = call
        logits = output.next_token_logits
        result = None
        if info.is_all_greedy and logprobs is None:
            next_ids, invalid = self.backend.greedy(logits)
        else:
            result = self.backend.sample_step(logits, info, positions, self.generator)
            next_ids, invalid = result.ids, result.invalid
        if row_errors:
            invalid = _flag_failed_rows(invalid, row_errors)
            next_ids = torch.where(invalid, torch.full_like(next_ids, -1), next_ids)
        if logprobs is not None:
            self.backend.fill_logprobs(output, logits, info, result, self.logprobs_mode, next_ids, *logprobs)
        return next_ids, invalid

    def _torch_step(self, call: _StepCall) -> tuple[torch.Tensor, torch.Tensor]:
        """Plain backends: one support over the whole batch (greedy rows included), a second one
        over the seeded rows."""
        return self._unfused_step(call, self._greedy_ids, self._draw_batch_wide)

    def _cpu_grouped_step(self, call: _StepCall) -> tuple[torch.Tensor, torch.Tensor]:
        """The pytorch backend on the CPU: the same tokens from one support per group of rows."""
        return self._unfused_step(call, self._greedy_ids_grouped, self._draw_grouped)

    def _unfused_step(
        self,
        call: _StepCall,
        greedy: Callable[[torch.Tensor, object], Optional[torch.Tensor]],
        draw: Callable[..., torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A plain backend's step; `greedy` gives the greedy rows' ids, `draw` the sampled rows'."""
        output, info, row_errors, positions, logprobs = call
        logits = output.next_token_logits
        invalid = self._invalid_rows(logits, row_errors)
        greedy_ids = greedy(logits, info)
        raw_logprobs = clamped_log_softmax(logits) if logprobs is not None and self.logprobs_mode == "raw" else None
        scaled = logits
        if info.need_temperature_scaling and (logprobs is not None or not info.is_all_greedy):
            # In place, as SGLang does: next_token_logits holds the scaled logits afterwards,
            # and a second [B, V] buffer would cost more than the division.
            scaled = logits.div_(info.temperatures)
        next_ids = greedy_ids if info.is_all_greedy else draw(scaled, info, positions, greedy_ids)
        next_ids = torch.where(invalid, torch.full_like(next_ids, -1), next_ids)
        if logprobs is not None:
            values = raw_logprobs if raw_logprobs is not None else self._logprobs(scaled, info)
            fill_logprobs(output, values, next_ids, *logprobs)
        return next_ids, invalid

    @staticmethod
    def _greedy_ids(logits: torch.Tensor, info) -> Optional[torch.Tensor]:
        """[B] int64 argmax of every row when some row is greedy."""
        return logits.argmax(dim=-1) if info.is_any_greedy else None

    def _greedy_ids_grouped(self, logits: torch.Tensor, info) -> Optional[torch.Tensor]:
        """[G] argmax of only the greedy rows of a mixed batch (a CPU argmax costs ~6x an amax per
        element), else as _greedy_ids."""
        if info.is_all_greedy or not info.is_any_greedy:
            return self._greedy_ids(logits, info)
        return logits.index_select(0, self._cpu_plan(info, logits.shape[0]).greedy_rows).argmax(dim=-1)

    def _draw_batch_wide(
        self, scaled: torch.Tensor, info, positions: Optional[torch.Tensor], greedy_ids: Optional[torch.Tensor]
    ) -> torch.Tensor:
        next_ids = self._sample(scaled, info, positions)
        if greedy_ids is None:
            return next_ids
        return torch.where(info.greedy_mask, greedy_ids, next_ids)

    def _draw_grouped(
        self, scaled: torch.Tensor, info, positions: Optional[torch.Tensor], greedy_ids: Optional[torch.Tensor]
    ) -> torch.Tensor:
        return self._sample_cpu(scaled, info, self._cpu_plan(info, scaled.shape[0]), positions, greedy_ids)

    def _apply_custom_logit_processors(self, logits: torch.Tensor, info) -> dict[int, str]:
        """Run each distinct processor once on its rows; a processor that fails fails only its rows."""
        errors: dict[int, str] = {}
        if not info.has_custom_logit_processor:
            return errors
        for entry in info.custom_logit_processor.values():
            message = entry.error or self._run_processor(logits, entry, info.custom_params)
            if message is not None:
                errors.update(dict.fromkeys(entry.rows, message))
        return errors

    @staticmethod
    def _run_processor(logits: torch.Tensor, entry, custom_params: list) -> Optional[str]:
        rows_logits = logits.index_select(0, entry.indices)  # [R, V]
        try:
            result = entry.processor(rows_logits, [custom_params[r] for r in entry.rows])
            if not isinstance(result, torch.Tensor) or result.shape != rows_logits.shape:
                raise TypeError(f"must return a tensor of shape {tuple(rows_logits.shape)}")
            logits.index_copy_(0, entry.indices, result.to(device=logits.device, dtype=logits.dtype))
        except Exception as err:  # noqa: BLE001 - any processor error fails its own rows only
            return f"custom_logit_processor {type(entry.processor).__name__} failed: {type(err).__name__}: {err}"
        return None

    @staticmethod
    def _invalid_rows(logits: torch.Tensor, row_errors: dict[int, str]) -> torch.Tensor:
        """[B] bool: NaN or +inf anywhere, or nothing finite to sample (all -inf)."""
        invalid = ~torch.isfinite(logits.amax(dim=-1))  # amax propagates NaN and +inf
        return _flag_failed_rows(invalid, row_errors) if row_errors else invalid

    def _sample(self, scaled: torch.Tensor, info, positions: Optional[torch.Tensor]) -> torch.Tensor:
        if info.all_seeded:
            next_ids = torch.zeros(scaled.shape[0], dtype=torch.int64, device=scaled.device)
        else:
            next_ids = self.backend.sample(scaled, info, self.generator)
        if info.seeded_rows is None:
            return next_ids
        rows = info.seeded_rows
        seeded_scaled = scaled.index_select(0, rows)  # [S, V]
        support = None
        if info.need_top_k_sampling or info.need_top_p_sampling or info.need_min_p_sampling:
            support = compute_support(
                seeded_scaled,
                info.top_ks.index_select(0, rows),
                info.top_ps.index_select(0, rows),
                info.min_ps.index_select(0, rows),
                window=None if self._seeded_full_sort else info.max_top_k,
                need_top_p=info.need_top_p_sampling,
                need_min_p=info.need_min_p_sampling,
            )
        seeds = info.sampling_seed.index_select(0, rows)
        seeded_ids = draw_seeded(seeded_scaled, support, seeds, positions.index_select(0, rows).to(torch.int64))
        return next_ids.index_copy(0, rows, seeded_ids)

    @staticmethod
    def _cpu_plan(info, batch_size: int) -> "_CpuPlan":
        """The row groups of a CPU step, built once per batch (the batch drops it when its rows change)."""
        plan = getattr(info, "cpu_sample_plan", None)
        if plan is None or plan.batch_size != batch_size:
            plan = _CpuPlan.build(info)
            info.cpu_sample_plan = plan
        return plan

    def _sample_cpu(
        self,
        scaled: torch.Tensor,
        info,
        plan: "_CpuPlan",
        positions: Optional[torch.Tensor],
        greedy_ids: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """`_sample` for the pytorch backend on the CPU, with the same tokens: one support per
        group of sampled rows, shared by its unseeded and seeded rows; greedy rows take no part.

        Seeded rows: the threshold of a row is exact whatever window computed it (top-k values are
        the row's own; the CPU softmax and prefix sums are per row and sequential, so a window's
        first columns hold the same mass at any width), and the Gumbel argmax is keyed by token id,
        so the token depends only on (seed, logits, position). Unseeded rows: one uniform per batch
        row, drawn for the whole batch as before, so the same u meets the same support."""
        u = uniform_open_closed(scaled.shape[0], scaled.device, self.generator) if plan.unseeded else None
        if plan.whole_batch:  # one group, all seeded or all unseeded: no row selection
            group = plan.groups[0]
            part = group.unseeded or group.seeded
            return self._draw_part(scaled, self._compute_group_support(scaled, group), part, u, positions)
        next_ids = torch.zeros(scaled.shape[0], dtype=torch.int64, device=scaled.device)
        if greedy_ids is not None:
            next_ids.index_copy_(0, plan.greedy_rows, greedy_ids)
        for group in plan.groups:
            rows_scaled = scaled if group.rows is None else scaled.index_select(0, group.rows)  # [R, V]
            support = self._compute_group_support(rows_scaled, group)
            for part in (group.unseeded, group.seeded):
                if part is not None:
                    u_part = u.index_select(0, part.rows) if part.seeds is None else None
                    pos = positions.index_select(0, part.rows) if part.seeds is not None else None
                    next_ids.index_copy_(0, part.rows, self._draw_part(rows_scaled, support, part, u_part, pos))
        return next_ids

    @staticmethod
    def _draw_part(
        rows_scaled: torch.Tensor,
        support: Optional[Support],
        part: "_RowPart",
        u: Optional[torch.Tensor],
        positions: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """Token ids of a part's rows (u [N, 1] for unseeded parts, positions [N] for seeded ones):
        inside the window when it holds every kept token of these rows, else over their full rows,
        copied out of the group only then."""
        if support is not None and part.local is not None:
            support = support.select(part.local)
        if support is not None and support.window_draws():
            if part.seeds is None:
                return draw_unseeded_in_window(support, u)
            return draw_seeded_in_window(support, part.seeds, positions.to(torch.int64))
        rows = rows_scaled if part.local is None else rows_scaled.index_select(0, part.local)
        if part.seeds is None:
            return draw_unseeded(rows, support, None, u=u)
        return draw_seeded(rows, support, part.seeds, positions.to(torch.int64))

    @staticmethod
    def _compute_group_support(rows_scaled: torch.Tensor, group: "_RowGroup") -> Optional[Support]:
        if not group.filtered:
            return None
        return compute_support(
            rows_scaled,
            group.top_ks,
            group.top_ps,
            group.min_ps,
            window=group.window,
            need_top_p=group.need_top_p,
            need_min_p=group.need_min_p,
        )

    def _logprobs(self, scaled: torch.Tensor, info) -> torch.Tensor:
        if self.logprobs_mode == "scaled":
            return clamped_log_softmax(scaled)
        support = every_row_support(scaled, info)
        kept = torch.where(support.keeps(scaled), scaled, torch.full_like(scaled, float("-inf")))
        return clamped_log_softmax(kept)

    def _sync_token_ids_across_tp(self, next_ids: torch.Tensor, info) -> None:
        if self.tp_group is None or not (self.sync_token_ids or info.grammars):
            return
        if dist.get_world_size(self.tp_group) == 1:
            return
        dist.all_reduce(next_ids, op=dist.ReduceOp.MIN, group=self.tp_group)


@dataclass
class _RowPart:
    """The unseeded or seeded rows of a group."""

    rows: torch.Tensor  # [N] int64, batch rows
    local: Optional[torch.Tensor]  # [N] int64, rows within the group; None = the whole group
    seeds: Optional[torch.Tensor] = None  # [N] int64, seeded part only


@dataclass
class _RowGroup:
    """Sampled rows that share one support computation: rows with a top-k (one top-W window, W the
    group's largest top_k), rows filtered by top-p / min-p only (the CPU's growing windows), or
    rows with no filter (no support)."""

    rows: Optional[torch.Tensor]  # [R] int64 batch rows; None = the whole batch, in order
    window: Optional[int]
    filtered: bool
    need_top_p: bool
    need_min_p: bool
    top_ks: torch.Tensor  # [R] int32
    top_ps: torch.Tensor  # [R] float32
    min_ps: torch.Tensor  # [R] float32
    unseeded: Optional[_RowPart]
    seeded: Optional[_RowPart]


@dataclass
class _CpuPlan:
    """How a CPU step splits the batch, from the host-side params (cached on the batch's
    SamplingBatchInfo, which drops it whenever its rows change)."""

    batch_size: int
    greedy_rows: Optional[torch.Tensor]  # [G] int64, set when the batch mixes greedy and sampled rows
    groups: list[_RowGroup]
    unseeded: bool  # some sampled row has no seed
    seeded: bool
    whole_batch: bool  # one group of every row, in order, all seeded or all unseeded

    @classmethod
    def build(cls, info) -> "_CpuPlan":
        params = [row.params for row in info.rows]
        vocab, dev = info.vocab_size, info.device

        def index(rows: list[int]) -> torch.Tensor:
            return torch.tensor(rows, dtype=torch.int64, device=dev)

        greedy = [i for i, p in enumerate(params) if p.top_k <= 1]
        kinds: dict[str, list[int]] = {}
        for i, p in enumerate(params):
            if p.top_k <= 1:
                continue
            kind = "top_k" if p.top_k < vocab else "filter" if (p.top_p < 1.0 or p.min_p > 0.0) else "plain"
            kinds.setdefault(kind, []).append(i)
        groups = []
        for kind, rows in kinds.items():
            group_rows = None if rows == list(range(len(params))) else index(rows)
            pick = (lambda t: t) if group_rows is None else (lambda t: t.index_select(0, group_rows))
            seeded = [j for j, i in enumerate(rows) if params[i].sampling_seed is not None]
            unseeded = [j for j, i in enumerate(rows) if params[i].sampling_seed is None]

            def part(local: list[int], with_seeds: bool) -> Optional[_RowPart]:
                if not local:
                    return None
                batch_rows = index([rows[j] for j in local])
                seeds = info.sampling_seed.index_select(0, batch_rows) if with_seeds else None
                return _RowPart(batch_rows, None if len(local) == len(rows) else index(local), seeds)

            groups.append(
                _RowGroup(
                    rows=group_rows,
                    window=max(params[i].top_k for i in rows) if kind == "top_k" else None,
                    filtered=kind != "plain",
                    need_top_p=any(params[i].top_p < 1.0 for i in rows),
                    need_min_p=any(params[i].min_p > 0.0 for i in rows),
                    top_ks=pick(info.top_ks),
                    top_ps=pick(info.top_ps),
                    min_ps=pick(info.min_ps),
                    unseeded=part(unseeded, False),
                    seeded=part(seeded, True),
                )
            )
        unseeded = any(g.unseeded is not None for g in groups)
        seeded = any(g.seeded is not None for g in groups)
        return cls(
            batch_size=len(params),
            greedy_rows=index(greedy) if greedy else None,
            groups=groups,
            unseeded=unseeded,
            seeded=seeded,
            whole_batch=len(groups) == 1 and groups[0].rows is None and unseeded != seeded,
        )


def _flag_failed_rows(invalid: torch.Tensor, row_errors: dict[int, str]) -> torch.Tensor:
    """`invalid` ([B] bool) with the rows whose custom processor failed set too."""
    failed = torch.tensor(sorted(row_errors), dtype=torch.int64, device=invalid.device)
    return invalid.index_fill(0, failed, True)


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
