"""Runs the batch's penalizers: feeds them sampled tokens, applies them to logits, and keeps
their per-row state aligned with the batch through filter and merge."""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterable, Optional

import torch

from sglang.srt.sampling.penaltylib.base import _BatchedPenalizer
from sglang.srt.sampling.penaltylib.frequency_penalty import BatchedFrequencyPenalizer
from sglang.srt.sampling.penaltylib.min_new_tokens import BatchedMinNewTokensPenalizer
from sglang.srt.sampling.penaltylib.presence_penalty import BatchedPresencePenalizer
from sglang.srt.sampling.penaltylib.repetition_penalty import BatchedRepetitionPenalizer

# Also the apply order: additive penalties first, in a fixed order so float results do not
# depend on how a caller spelled the set, then scaling (repetition).
DEFAULT_PENALIZERS: tuple[type[_BatchedPenalizer], ...] = (
    BatchedFrequencyPenalizer,
    BatchedPresencePenalizer,
    BatchedMinNewTokensPenalizer,
    BatchedRepetitionPenalizer,
)


def _apply_order(cls: type[_BatchedPenalizer]) -> tuple[bool, int, str]:
    rank = DEFAULT_PENALIZERS.index(cls) if cls in DEFAULT_PENALIZERS else len(DEFAULT_PENALIZERS)
    return (cls.is_multiplicative, rank, cls.__qualname__)


class BatchedPenalizerOrchestrator:
    """Penalties for one ScheduleBatch (anything with `reqs` and `device`)."""

    def __init__(
        self,
        vocab_size: int,
        batch: Any,
        penalizers: Optional[Iterable[type[_BatchedPenalizer]]] = None,
    ) -> None:
        self.vocab_size = vocab_size
        self.batch = batch
        self.device: torch.device | str = batch.device
        classes = DEFAULT_PENALIZERS if penalizers is None else penalizers
        self.penalizers: dict[type[_BatchedPenalizer], _BatchedPenalizer] = {
            cls: cls(self) for cls in sorted(set(classes), key=_apply_order)
        }
        self.is_required = False
        for penalizer in self.penalizers.values():
            self.is_required |= penalizer.prepare_if_required()

    @property
    def batch(self) -> Any:
        return self._batch_ref()

    @batch.setter
    def batch(self, value: Any) -> None:
        # Weak, so a retired batch is not kept alive by its sampling info.
        self._batch_ref: Callable[[], Any] = (lambda: None) if value is None else weakref.ref(value)

    def reqs(self) -> list:
        batch = self.batch
        if batch is None:
            raise RuntimeError("BatchedPenalizerOrchestrator: its batch no longer exists")
        return batch.reqs

    def cumulate_output_tokens(self, output_ids: torch.Tensor) -> None:
        """Record the token each row just sampled (`output_ids` [B] int64; negative = none)."""
        for penalizer in self.penalizers.values():
            penalizer.cumulate_output_tokens(output_ids)

    def apply(self, logits: torch.Tensor) -> None:
        """Penalise `logits` [B, V] in place: additive penalties, then repetition scaling."""
        for penalizer in self.penalizers.values():
            penalizer.apply(logits)

    def filter(self, keep_indices: torch.Tensor) -> None:
        """Keep rows `keep_indices` (int64). `batch.reqs` must already hold only the kept reqs."""
        if not self.is_required:
            return
        if keep_indices.numel() == 0:
            self.release()
            return
        keep_indices = keep_indices.to(device=self.device, dtype=torch.int64)
        for penalizer in self.penalizers.values():
            if not penalizer.is_prepared():
                continue
            if penalizer.is_required():
                penalizer.filter(keep_indices)
            else:
                penalizer.teardown()
        self.is_required = any(p.is_prepared() for p in self.penalizers.values())

    def merge(self, their: BatchedPenalizerOrchestrator) -> None:
        """Append `their` rows after ours. Call before `batch.reqs` is extended, since a
        penalizer only one side needs is prepared on the other from that side's reqs."""
        if not self.is_required and not their.is_required:
            return
        for cls in sorted(self.penalizers.keys() | their.penalizers.keys(), key=_apply_order):
            mine = self.penalizers.get(cls) or cls(self)
            theirs = their.penalizers.get(cls) or cls(their)
            mine.merge(theirs)
            self.penalizers[cls] = mine
        self.penalizers = {cls: self.penalizers[cls] for cls in sorted(self.penalizers, key=_apply_order)}
        self.is_required = any(p.is_prepared() for p in self.penalizers.values())

    def release(self) -> None:
        """Drop all state and the batch reference; the orchestrator is inert afterwards."""
        for penalizer in self.penalizers.values():
            penalizer.teardown()
        self.penalizers.clear()
        self.batch = None
        self.is_required = False
