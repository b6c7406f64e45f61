"""Lifecycle shared by every batched penalizer.

A penalizer holds per-row state only once some request in the batch needs it (`prepare`);
until then every batched operation is a no-op, so unused penalties cost nothing per step.
"""

from __future__ import annotations

import abc
import weakref
from typing import TYPE_CHECKING, Any, Protocol

import torch

from sglang.srt.sampling.penaltylib.token_counts import TokenCounts

if TYPE_CHECKING:
    from sgl_kernel_ext.sampling.penalties import PenaltyLists


class PenalizerHost(Protocol):
    """What a penalizer reads from the orchestrator that owns it."""

    device: torch.device | str
    vocab_size: int

    def reqs(self) -> list[Any]: ...


class _BatchedPenalizer(abc.ABC):
    """One penalty over a batch. Subclasses build state from the reqs' current host lists."""

    # Multiplicative penalizers run after every additive one (see BatchedPenalizerOrchestrator.apply).
    is_multiplicative: bool = False

    def __init__(self, orchestrator: PenalizerHost) -> None:
        # Weak, because the orchestrator owns its penalizers.
        self._orchestrator_ref = weakref.ref(orchestrator)
        self._is_prepared = False

    @property
    def orchestrator(self) -> PenalizerHost:
        orchestrator = self._orchestrator_ref()
        if orchestrator is None:
            raise RuntimeError(f"{type(self).__name__}: its orchestrator no longer exists")
        return orchestrator

    @property
    def device(self) -> torch.device | str:
        return self.orchestrator.device

    def is_prepared(self) -> bool:
        return self._is_prepared

    def is_required(self) -> bool:
        """Whether any request in the orchestrator's current batch needs this penalty."""
        return any(self._is_required_for(req.sampling_params) for req in self.orchestrator.reqs())

    def prepare(self) -> None:
        if not self._is_prepared:
            self._prepare()
            self._is_prepared = True

    def prepare_if_required(self) -> bool:
        if self.is_required():
            self.prepare()
            return True
        return False

    def teardown(self) -> None:
        if self._is_prepared:
            self._teardown()
            self._is_prepared = False

    def cumulate_output_tokens(self, output_ids: torch.Tensor) -> None:
        """Record one freshly sampled token per row (`output_ids` [B] int64, negative = skip)."""
        if self._is_prepared:
            self._cumulate_output_tokens(output_ids)

    def apply(self, logits: torch.Tensor) -> None:
        """Penalise `logits` [B, V] in place."""
        if self._is_prepared:
            self._apply(logits)

    def filter(self, keep_indices: torch.Tensor) -> None:
        if self._is_prepared:
            self._filter(keep_indices)

    def merge(self, their: _BatchedPenalizer) -> None:
        """Append `their` rows; if either side is prepared, both are (each from its own reqs)."""
        if not self._is_prepared and not their._is_prepared:
            return
        self.prepare()
        their.prepare()
        self._merge(their)

    def write_fused(self, lists: "PenaltyLists") -> bool:
        """Point the fused penalty kernels' `lists` at this penalty's state; False when the kernels
        do not know this penalty, and the batch's penalties run through `apply` instead."""
        return False

    def record_fused_update(self) -> None:
        """Host bookkeeping after the fused update kernel recorded a step's tokens in this state."""

    @abc.abstractmethod
    def _is_required_for(self, sampling_params: Any) -> bool: ...

    @abc.abstractmethod
    def _prepare(self) -> None: ...

    @abc.abstractmethod
    def _teardown(self) -> None: ...

    @abc.abstractmethod
    def _cumulate_output_tokens(self, output_ids: torch.Tensor) -> None: ...

    @abc.abstractmethod
    def _apply(self, logits: torch.Tensor) -> None: ...

    @abc.abstractmethod
    def _filter(self, keep_indices: torch.Tensor) -> None: ...

    @abc.abstractmethod
    def _merge(self, their: Any) -> None: ...


def per_row_tensor(values: list[float], device: torch.device | str) -> torch.Tensor:
    """[B, 1] float32 column of one parameter per row, so it broadcasts against [B, L] state."""
    return torch.tensor(values, dtype=torch.float32).reshape(-1, 1).to(device)


class _OutputTokenPenalizer(_BatchedPenalizer):
    """Additive penalty driven by how often each row has generated each token.

    Subclasses say which sampling param is the per-row penalty and how a count becomes
    a multiple of it; the logits lose penalty * weight(count) at each seen token.
    """

    def _is_required_for(self, sampling_params: Any) -> bool:
        return self._penalty_of(sampling_params) != 0.0

    def _prepare(self) -> None:
        reqs = self.orchestrator.reqs()
        self.penalties = per_row_tensor([self._penalty_of(r.sampling_params) for r in reqs], self.device)
        self.output_counts = TokenCounts.from_lists([r.output_ids for r in reqs], self.device)

    def _teardown(self) -> None:
        del self.penalties
        del self.output_counts

    def _cumulate_output_tokens(self, output_ids: torch.Tensor) -> None:
        self.output_counts.add(output_ids)

    def _apply(self, logits: torch.Tensor) -> None:
        counts = self.output_counts
        # Pads point at column 0 with a zero delta, so no masking is needed.
        delta = -self.penalties * self._weight(counts.counts)  # [B, L] float32
        logits.scatter_add_(1, counts.ids.clamp(min=0), delta.to(logits.dtype))

    def _filter(self, keep_indices: torch.Tensor) -> None:
        self.penalties = self.penalties.index_select(0, keep_indices)
        self.output_counts.filter(keep_indices)

    def _merge(self, their: _OutputTokenPenalizer) -> None:
        self.penalties = torch.cat([self.penalties, their.penalties])
        self.output_counts.merge(their.output_counts)

    def record_fused_update(self) -> None:
        self.output_counts.record_added()

    @staticmethod
    @abc.abstractmethod
    def _penalty_of(sampling_params: Any) -> float: ...

    @staticmethod
    @abc.abstractmethod
    def _weight(counts: torch.Tensor) -> torch.Tensor:
        """Multiple of the penalty for each count ([B, L] float32; 0 at pads)."""
