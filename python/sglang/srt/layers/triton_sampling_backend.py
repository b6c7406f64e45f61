"""`--sampling-backend triton`: the whole sampling step in the sgl_kernel_ext Triton kernels.

Unlike the other backends, which draw the unseeded rows of already scaled logits, this one takes
the processed logits and does temperature, greedy rows, the NaN guard, top-k / top-p / min-p and
the draw of every row (seeded or not) in one kernel chain, leaving the logits unscaled. Every
sampled row draws by hash-Gumbel; an unseeded row gets a fresh seed per step, derived from one
random int64 the sampler's generator draws on the device (`unseeded_seeds`), so seeded rows never
leave the fast path and a step has no host synchronisation. The same derivation runs inside the
CUDA graph of the sampling step (model_executor/sampling_graph.py), so a step draws the same
tokens replayed or eager.
"""

from __future__ import annotations

import importlib
from typing import Optional

import torch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.logprob_processor import clamped_log_softmax, fill_logprobs, fill_token_ids_logprobs
from sglang.srt.layers.sampling_backends import FusedSamplingBackend
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Odd 64-bit constant (2**64 / golden ratio, as int64): row r's seed is noise + r * stride, distinct
# for every row; the kernel's MurmurHash then decorrelates neighbouring seeds.
ROW_SEED_STRIDE = 0x9E3779B97F4A7C15 - 2**64


def draw_noise(generator: Optional[torch.Generator], device: torch.device, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """[1] int64: the step's random base for unseeded rows (into `out`, a [1] int64 on `device`, when given)."""
    if out is not None:
        return torch.randint(_INT64_MIN, _INT64_MAX, (1,), generator=generator, out=out)
    return torch.randint(_INT64_MIN, _INT64_MAX, (1,), dtype=torch.int64, device=device, generator=generator)


def row_seed_offsets(rows: int, device: torch.device) -> torch.Tensor:
    """[rows] int64: r * ROW_SEED_STRIDE (wrapping)."""
    return torch.arange(rows, dtype=torch.int64, device=device) * ROW_SEED_STRIDE


def unseeded_seeds(noise: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """[B] int64 seeds of unseeded rows from the step's noise ([1]) and row offsets ([B])."""
    return noise + offsets


def _kernels(name: str):
    try:
        return importlib.import_module(f"sgl_kernel_ext.sampling.{name}")
    except ImportError as err:
        raise RuntimeError(
            f"--sampling-backend triton needs the triton package (pip install triton), which is not importable "
            f"here: {err}. Use --sampling-backend pytorch instead."
        ) from err


class TritonBackend(FusedSamplingBackend):
    name = "triton"
    support_statistics = True

    def __init__(self) -> None:
        self._sample = _kernels("sample")
        self._logprobs = _kernels("logprobs")
        self._offsets: dict[torch.device, torch.Tensor] = {}  # row_seed_offsets, grown to the largest batch

    def sample(self, scaled: torch.Tensor, info: SamplingBatchInfo, generator: Optional[torch.Generator]) -> torch.Tensor:
        ones = torch.ones(scaled.shape[0], dtype=torch.float32, device=scaled.device)  # [B]
        seeds = self._random_seeds(scaled.shape[0], scaled.device, generator)
        positions = torch.zeros_like(seeds)
        sampled = info.top_ks.clamp(min=2)  # the Sampler handles greedy rows itself
        return self._sample.sample_triton(scaled, ones, sampled, info.top_ps, torch.log(info.min_ps), seeds, positions).ids

    def greedy(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """([B] int64 argmax, -1 on invalid rows; [B] bool invalid) in one launch."""
        return self._sample.greedy_triton(logits)

    def sample_step(
        self,
        logits: torch.Tensor,
        info: SamplingBatchInfo,
        positions: Optional[torch.Tensor],
        generator: Optional[torch.Generator],
    ):
        """Every row of the processed `logits` ([B, V] float32): a SampleResult (ids, invalid, lse, ...),
        whose row statistics fill_logprobs reads."""
        seeds = self._seeds(info, logits.shape[0], logits.device, generator)
        if positions is None:
            positions = torch.zeros_like(seeds)
        return self._sample.sample_triton(
            logits, info.temperatures, info.top_ks, info.top_ps, torch.log(info.min_ps), seeds, positions.to(torch.int64)
        )

    def fill_logprobs(
        self,
        output: LogitsProcessorOutput,
        logits: torch.Tensor,
        info: SamplingBatchInfo,
        result,
        mode: str,
        next_ids: torch.Tensor,
        top_logprobs_nums: Optional[list[int]],
        token_ids_logprobs: Optional[list[Optional[list[int]]]],
    ) -> None:
        """Logprobs from the kernel's row statistics: gathers, plus one top-k over the logits when
        top logprobs are asked for (the order of logits / T is the order of the logits)."""
        if mode == "raw":
            fill_logprobs(output, clamped_log_softmax(logits), next_ids, top_logprobs_nums, token_ids_logprobs)
            return
        processed = mode == "processed"
        lse = result.lse_kept if processed else result.lse

        def gather(ids: torch.Tensor) -> torch.Tensor:
            return self._logprobs.token_logprobs_triton(logits, info.temperatures, lse, result.threshold, ids, processed)

        output.next_token_logprobs = gather(next_ids.unsqueeze(1)).squeeze(1)
        max_k = max(top_logprobs_nums or [0])
        if max_k > 0:
            indices = torch.topk(logits, min(max_k, logits.shape[1]), dim=-1).indices  # [B, max_k]
            output.next_token_top_logprobs_val = gather(indices)
            output.next_token_top_logprobs_idx = indices
        fill_token_ids_logprobs(output, token_ids_logprobs, logits.device, gather)

    def _seeds(
        self, info: SamplingBatchInfo, rows: int, device: torch.device, generator: Optional[torch.Generator]
    ) -> torch.Tensor:
        """[B] int64: the request's seed on seeded rows, a fresh random one elsewhere."""
        if info.all_seeded:
            return info.sampling_seed
        seeds = self._random_seeds(rows, device, generator)
        if info.seeded_rows is None:
            return seeds
        return torch.where(info.seeded_mask, info.sampling_seed, seeds)

    def _random_seeds(self, rows: int, device: torch.device, generator: Optional[torch.Generator]) -> torch.Tensor:
        offsets = self._offsets.get(device)
        if offsets is None or offsets.numel() < rows:
            offsets = self._offsets[device] = row_seed_offsets(max(rows, 256), device)
        return unseeded_seeds(draw_noise(generator, device), offsets[:rows])
