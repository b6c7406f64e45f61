"""Sampler: processed logits -> next token ids (+ logprobs), and the sampling-backend registry.

Order per step (after SamplingBatchInfo.apply_logits_bias):
  custom processors -> NaN/inf guard -> greedy (argmax, lowest id on ties) -> temperature ->
  top-k / top-p / min-p + draw (backend; seeded rows by hash-Gumbel) -> logprobs -> TP sync.
Nothing here reads a device value on the host, so a CUDA step never synchronises; every
decision is a host flag set when the batch was built.
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import nn

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.logprob_processor import LOGPROBS_MODES, clamped_log_softmax, default_logprobs_mode, fill_logprobs
from sglang.srt.layers.sampling_backends import BUILT_IN_BACKENDS, SamplingBackend
from sglang.srt.layers.sampling_ops import compute_support, draw_seeded

logger = logging.getLogger(__name__)

BUILT_IN_SAMPLING_BACKENDS = frozenset(BUILT_IN_BACKENDS)
SAMPLING_BACKEND_CHOICES: set[str] = set(BUILT_IN_SAMPLING_BACKENDS)
_CUSTOM_SAMPLER_FACTORIES: dict[str, Callable[[], "Sampler"]] = {}


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def sync_token_ids_requested() -> bool:
    """SYNC_TOKEN_IDS_ACROSS_TP (SGLang's name) or SGLANG_SYNC_TOKEN_IDS_ACROSS_TP."""
    return _env_true("SYNC_TOKEN_IDS_ACROSS_TP") or _env_true("SGLANG_SYNC_TOKEN_IDS_ACROSS_TP")


class Sampler(nn.Module):
    def __init__(
        self,
        backend: str = "pytorch",
        *,
        tp_group: Optional[dist.ProcessGroup] = None,
        logprobs_mode: Optional[str] = None,
        generator: Optional[torch.Generator] = None,
        deterministic: bool = False,
    ) -> None:
        super().__init__()
        if backend not in BUILT_IN_BACKENDS:
            raise ValueError(
                f"sampling_backend must be one of {sorted(BUILT_IN_BACKENDS)} for the built-in Sampler, got {backend!r}."
            )
        self.backend: SamplingBackend = BUILT_IN_BACKENDS[backend]()
        self.logprobs_mode = logprobs_mode or default_logprobs_mode()
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {self.logprobs_mode!r}.")
        self.tp_group = tp_group
        self.sync_token_ids = sync_token_ids_requested()
        # Unseeded draws; TP ranks pass generators seeded alike so they draw the same noise.
        self.generator = generator
        # --enable-deterministic-inference: a seeded row's token must not depend on its batch-mates.
        self.deterministic = deterministic

    def forward(
        self,
        logits_output: LogitsProcessorOutput,
        sampling_info,
        return_logprob: bool = False,
        top_logprobs_nums: Optional[list[int]] = None,
        token_ids_logprobs: Optional[list[Optional[list[int]]]] = None,
        positions: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Next token ids [B] int64; -1 on rows flagged in `logits_output.invalid_rows`.

        `positions` ([B] int64, the position of each row's last input token) keys the noise of
        seeded rows and is required when any row has a sampling_seed.
        """
        info = sampling_info
        logits = logits_output.next_token_logits  # [B, V] float32, processed in place by custom processors
        row_errors = self._apply_custom_logit_processors(logits, info)
        if self.backend.fused:
            args = (return_logprob, top_logprobs_nums, token_ids_logprobs, positions)
            return self._fused_forward(logits_output, info, row_errors, *args)
        invalid = self._invalid_rows(logits, row_errors)

        greedy_ids = logits.argmax(dim=-1) if info.is_any_greedy else None
        raw_logprobs = clamped_log_softmax(logits) if return_logprob and self.logprobs_mode == "raw" else None
        scaled = logits
        if info.need_temperature_scaling and (return_logprob or not info.is_all_greedy):
            # In place, as SGLang does: next_token_logits holds the scaled logits afterwards,
            # and a second [B, V] buffer would cost more than the division.
            scaled = logits.div_(info.temperatures)
        if info.is_all_greedy:
            next_ids = greedy_ids
        else:
            next_ids = self._sample(scaled, info, positions)
            if greedy_ids is not None:
                next_ids = torch.where(info.greedy_mask, greedy_ids, next_ids)
        next_ids = torch.where(invalid, torch.full_like(next_ids, -1), next_ids)

        if return_logprob:
            logprobs = raw_logprobs if raw_logprobs is not None else self._logprobs(scaled, info)
            fill_logprobs(logits_output, logprobs, next_ids, top_logprobs_nums, token_ids_logprobs)
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

    def _fused_forward(
        self,
        logits_output: LogitsProcessorOutput,
        info,
        row_errors: dict[int, str],
        return_logprob: bool,
        top_logprobs_nums: Optional[list[int]],
        token_ids_logprobs: Optional[list[Optional[list[int]]]],
        positions: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """The step through a fused backend: greedy rows, NaN guard, temperature, filters, every
        row's draw and the logprob statistics in its kernels. The logits stay unscaled."""
        if info.seeded_rows is not None and positions is None:
            raise ValueError("positions are required to sample rows that have a sampling_seed.")
        logits = logits_output.next_token_logits
        result = None
        if info.is_all_greedy and not return_logprob:
            next_ids, invalid = self.backend.greedy(logits)
        else:
            result = self.backend.sample_step(logits, info, positions, self.generator)
            next_ids, invalid = result.ids, result.invalid
        if row_errors:
            failed = torch.tensor(sorted(row_errors), dtype=torch.int64, device=logits.device)
            invalid = invalid.index_fill(0, failed, True)
            next_ids = torch.where(invalid, torch.full_like(next_ids, -1), next_ids)
        if return_logprob:
            self.backend.fill_logprobs(
                logits_output, logits, info, result, self.logprobs_mode, next_ids, top_logprobs_nums, token_ids_logprobs
            )
        logits_output.invalid_rows = invalid
        logits_output.row_errors = row_errors
        self._sync_token_ids_across_tp(next_ids, info)
        return next_ids

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
        if row_errors:
            failed = torch.tensor(sorted(row_errors), dtype=torch.int64, device=logits.device)
            invalid = invalid.index_fill(0, failed, True)
        return invalid

    def _sample(self, scaled: torch.Tensor, info, positions: Optional[torch.Tensor]) -> torch.Tensor:
        if info.all_seeded:
            next_ids = torch.zeros(scaled.shape[0], dtype=torch.int64, device=scaled.device)
        else:
            next_ids = self.backend.sample(scaled, info, self.generator)
        if info.seeded_rows is None:
            return next_ids
        if positions is None:
            raise ValueError("positions are required to sample rows that have a sampling_seed.")
        rows = info.seeded_rows
        seeded_scaled = scaled.index_select(0, rows)  # [S, V]
        support = None
        if info.need_top_k_sampling or info.need_top_p_sampling or info.need_min_p_sampling:
            support = compute_support(
                seeded_scaled,
                info.top_ks.index_select(0, rows),
                info.top_ps.index_select(0, rows),
                info.min_ps.index_select(0, rows),
                window=self._seeded_window(info, scaled),
                need_top_p=info.need_top_p_sampling,
                need_min_p=info.need_min_p_sampling,
            )
        seeds = info.sampling_seed.index_select(0, rows)
        seeded_ids = draw_seeded(seeded_scaled, support, seeds, positions.index_select(0, rows).to(torch.int64))
        return next_ids.index_copy(0, rows, seeded_ids)

    def _seeded_window(self, info, scaled: torch.Tensor) -> Optional[int]:
        """The top-W window of the seeded rows' support, or None for a full sort.

        The window is the batch's largest top_k. Top-p sums probabilities over it: on the CPU a
        sequential prefix sum whose values do not depend on the window's width, on CUDA a
        parallel scan whose rounding does. Deterministic mode on CUDA therefore thresholds over
        the full sort, whose width is the vocabulary whatever the batch."""
        if self.deterministic and scaled.is_cuda:
            return None
        return info.max_top_k

    def _logprobs(self, scaled: torch.Tensor, info) -> torch.Tensor:
        if self.logprobs_mode == "scaled":
            return clamped_log_softmax(scaled)
        support = compute_support(
            scaled,
            info.top_ks,
            info.top_ps,
            info.min_ps,
            window=info.max_top_k,
            need_top_p=info.need_top_p_sampling,
            need_min_p=info.need_min_p_sampling,
        )
        kept = torch.where(scaled >= support.threshold, scaled, torch.full_like(scaled, float("-inf")))
        return clamped_log_softmax(kept)

    def _sync_token_ids_across_tp(self, next_ids: torch.Tensor, info) -> None:
        if self.tp_group is None or not (self.sync_token_ids or info.grammars):
            return
        if dist.get_world_size(self.tp_group) == 1:
            return
        dist.all_reduce(next_ids, op=dist.ReduceOp.MIN, group=self.tp_group)


def register_sampler_backend(name: str, factory: Callable[[], Sampler]) -> None:
    """Make `--sampling-backend name` build its Sampler with `factory()`."""
    if not isinstance(name, str) or not name:
        raise ValueError("backend must be a non-empty string")
    if name in _CUSTOM_SAMPLER_FACTORIES or name in BUILT_IN_SAMPLING_BACKENDS:
        logger.warning("Overriding sampling backend %r", name)
    _CUSTOM_SAMPLER_FACTORIES[name] = factory
    SAMPLING_BACKEND_CHOICES.add(name)


def create_sampler(backend: Optional[str] = None, **kwargs) -> Sampler:
    """A registered factory wins; otherwise a built-in name (None = pytorch)."""
    if backend in _CUSTOM_SAMPLER_FACTORIES:
        sampler = _CUSTOM_SAMPLER_FACTORIES[backend]()
        if not isinstance(sampler, Sampler):
            raise TypeError(f"Custom sampler factory for backend '{backend}' must return a Sampler")
        return sampler
    if backend is None or backend in BUILT_IN_SAMPLING_BACKENDS:
        return Sampler(backend or "pytorch", **kwargs)
    raise ValueError(f"Unknown sampling backend '{backend}'. Register it via register_sampler_backend().")
