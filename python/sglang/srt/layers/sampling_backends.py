"""Sampling backends: the interface the Sampler calls, the built-in backends and their registry.

A plain backend (SamplingBackend) only draws the unseeded rows of temperature-scaled logits;
greedy rows, seeded rows (hash-Gumbel), logprobs and the NaN guard are the Sampler's job and
the same for every such backend. A fused backend (FusedSamplingBackend) runs the whole step in
its own kernels. Every backend samples from the support defined in sgl_kernel_ext.sampling.support
(ties at the k-th value kept, joint top-p, min-p).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Callable, Optional, Protocol

import torch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampling_ops import (
    Support,
    compute_support,
    draw_unseeded,
    inverse_cdf_draw,
    min_p_threshold,
    uniform_open_closed,
)
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo


class SamplingBackend(ABC):
    """What the Sampler calls on every backend."""

    name: str

    @abstractmethod
    def sample(self, scaled: torch.Tensor, info: SamplingBatchInfo, generator: Optional[torch.Generator]) -> torch.Tensor:
        """Token ids [B] int64 drawn from each row's filtered softmax of `scaled` ([B, V] float32)."""


class FusedStepResult(Protocol):
    """What a fused step returns: the Sampler reads ids and invalid, and hands the whole result
    back to the backend's fill_logprobs (which may keep row statistics on it)."""

    ids: torch.Tensor  # [B] int64, -1 on invalid rows
    invalid: torch.Tensor  # [B] bool


class FusedSamplingBackend(SamplingBackend):
    """A backend whose kernels run the whole step (greedy rows, NaN guard, temperature, filters,
    every row's draw, logprob statistics); the Sampler then calls these instead of `sample`."""

    # Whether sample_step's result carries each row's support as `threshold` and `lse_kept` ([B]
    # float32 over logits / temperature): the watermark then selects from them on the device.
    support_statistics: bool = False

    @abstractmethod
    def greedy(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """An all-greedy batch: ([B] int64 argmax, lowest id on ties, -1 on invalid rows; [B] bool invalid)."""

    @abstractmethod
    def sample_step(
        self,
        logits: torch.Tensor,
        info: SamplingBatchInfo,
        positions: Optional[torch.Tensor],
        generator: Optional[torch.Generator],
    ) -> FusedStepResult:
        """Every row of the processed, unscaled `logits` ([B, V] float32), which stay unscaled."""

    @abstractmethod
    def fill_logprobs(
        self,
        output: LogitsProcessorOutput,
        logits: torch.Tensor,
        info: SamplingBatchInfo,
        result: Optional[FusedStepResult],
        mode: str,
        next_ids: torch.Tensor,
        top_logprobs_nums: Optional[list[int]],
        token_ids_logprobs: Optional[list[Optional[list[int]]]],
    ) -> None:
        """Set the logprobs of `mode` on `output`, from sample_step's result."""


def batch_support(scaled: torch.Tensor, info: SamplingBatchInfo) -> Optional[Support]:
    """The batch's support thresholds, or None when no sampled row filters anything."""
    if not (info.need_top_k_sampling or info.need_top_p_sampling or info.need_min_p_sampling):
        return None
    return every_row_support(scaled, info)


def every_row_support(scaled: torch.Tensor, info: SamplingBatchInfo) -> Support:
    """The support of every row of the batch (`scaled` [B, V]), greedy rows (top_k 1) included."""
    return compute_support(
        scaled,
        info.top_ks,
        info.top_ps,
        info.min_ps,
        window=info.max_top_k,
        need_top_p=info.need_top_p_sampling,
        need_min_p=info.need_min_p_sampling,
    )


class PytorchBackend(SamplingBackend):
    """Plain torch: thresholds from a top-k window (or a sort when some row has no top-k), then one
    inverse-CDF draw per row."""

    name = "pytorch"

    def sample(self, scaled: torch.Tensor, info: SamplingBatchInfo, generator: Optional[torch.Generator]) -> torch.Tensor:
        return draw_unseeded(scaled, batch_support(scaled, info), generator)


class FlashInferBackend(SamplingBackend):
    """flashinfer.sampling kernels: joint top-k/top-p from probs; min-p rows sample from probs
    restricted to our support so the set matches every other backend."""

    name = "flashinfer"

    def __init__(self) -> None:
        try:
            self._ops = importlib.import_module("flashinfer.sampling")
        except ImportError as err:
            raise RuntimeError(
                "--sampling-backend flashinfer needs the flashinfer-python package "
                f"(pip install flashinfer-python), which is not importable here: {err}. "
                "Use --sampling-backend pytorch instead."
            ) from err

    def sample(self, scaled: torch.Tensor, info: SamplingBatchInfo, generator: Optional[torch.Generator]) -> torch.Tensor:
        probs = torch.softmax(scaled, dim=-1)  # [B, V] float32
        if info.need_min_p_sampling:
            support = batch_support(scaled, info)
            probs = torch.where(support.keeps(scaled), probs, torch.zeros_like(probs))
            # The kernel's inverse-CDF draw assumes each row sums to 1.
            probs = probs / probs.sum(dim=-1, keepdim=True)
            ids = self._ops.sampling_from_probs(probs, generator=generator)
        elif info.need_top_k_sampling or info.need_top_p_sampling:
            ids = self._ops.top_k_top_p_sampling_from_probs(
                probs, info.top_ks, info.top_ps, filter_apply_order="joint", generator=generator
            )
        else:
            ids = self._ops.sampling_from_probs(probs, generator=generator)
        return ids.long()


class AscendBackend(SamplingBackend):
    """torch_npu's fused top-k/top-p when importable and every row is eligible (1 <= top_k <= 1024);
    otherwise the same logits path in plain torch."""

    name = "ascend"

    def __init__(self) -> None:
        try:
            torch_npu = importlib.import_module("torch_npu")
        except ImportError:
            torch_npu = None
        self._npu_top_k_top_p = getattr(torch_npu, "npu_top_k_top_p", None)
        self._fallback = PytorchBackend()

    def sample(self, scaled: torch.Tensor, info: SamplingBatchInfo, generator: Optional[torch.Generator]) -> torch.Tensor:
        if self._npu_top_k_top_p is None or not info.npu_top_k_top_p_eligible:
            return self._fallback.sample(scaled, info, generator)
        filtered = self._npu_top_k_top_p(scaled, info.top_ps, info.top_ks)  # [B, V], dropped -> -inf
        threshold = min_p_threshold(filtered.amax(dim=-1, keepdim=True), torch.log(info.min_ps))  # [B, 1]
        u = uniform_open_closed(scaled.shape[0], scaled.device, generator)
        return inverse_cdf_draw(filtered, threshold, u)


def _lazy_triton_backend() -> SamplingBackend:
    # Imported when chosen: importing triton costs seconds.
    from sglang.srt.layers.triton_sampling_backend import TritonBackend

    return TritonBackend()


BUILT_IN_BACKENDS: dict[str, Callable[[], SamplingBackend]] = {
    PytorchBackend.name: PytorchBackend,
    FlashInferBackend.name: FlashInferBackend,
    AscendBackend.name: AscendBackend,
    "triton": _lazy_triton_backend,
}
# Built-in and registered backends by name; each factory builds a fresh backend.
BACKENDS: dict[str, Callable[[], SamplingBackend]] = dict(BUILT_IN_BACKENDS)


def check_backend_class(cls: type) -> None:
    """Raise TypeError unless `cls` is a SamplingBackend implementing every method its interface
    declares (SamplingBackend's, and FusedSamplingBackend's for a fused backend)."""
    if not (isinstance(cls, type) and issubclass(cls, SamplingBackend)):
        raise TypeError(
            f"A sampling backend must be a subclass of SamplingBackend (or FusedSamplingBackend), got {cls!r}."
        )
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        interface = FusedSamplingBackend if issubclass(cls, FusedSamplingBackend) else SamplingBackend
        raise TypeError(
            f"Sampling backend {cls.__name__} does not implement {', '.join(missing)}, "
            f"declared by {interface.__name__}."
        )


def register_backend(name: str, cls: type) -> None:
    """Make `name` build a Sampler over `cls()`, checked against the interface now."""
    check_backend_class(cls)
    BACKENDS[name] = cls
