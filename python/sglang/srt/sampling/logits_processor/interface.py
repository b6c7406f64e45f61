"""The batch-level logits-processor interface (vLLM's V1 API, with our SamplingParams).

A processor instance serves one batch: row i of the logits it is given is row i of that batch.
Before every sampling step it gets `update_state(batch_update)` describing how the rows changed
since the previous step (None: they did not), applied in the order removed -> added -> moved, and
then `apply(logits)`. A row's state belongs to its index; `output_ids` in `added` is the
request's live output list, which already holds every token sampled before the step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING, Any, Callable, Mapping, MutableMapping, Optional, Sequence, TypeVar

import torch

if TYPE_CHECKING:
    from sglang.srt.sampling.sampling_params import SamplingParams


class MoveDirectionality(Enum):
    UNIDIRECTIONAL = auto()  # i's state goes to j; i is empty afterwards
    SWAP = auto()  # i and j exchange their states


# (index, params, prompt_ids, output_ids): output_ids is the request's live output list.
AddedRequest = tuple[int, "SamplingParams", Sequence[int], Sequence[int]]
MovedRequest = tuple[int, int, MoveDirectionality]


@dataclass(frozen=True)
class BatchUpdate:
    """How the batch changed since the previous step; apply removed, then added, then moved."""

    batch_size: int
    removed: Sequence[int]
    added: Sequence[AddedRequest]
    moved: Sequence[MovedRequest]


class LogitsProcessor(ABC):
    """A batch-level processor, loaded at server start (`--logits-processors module:QualName`,
    or the `sglang.logits_processors` entry-point group); one instance per batch."""

    @abstractmethod
    def __init__(self, server_args: Any, device: torch.device, is_pin_memory: bool) -> None:
        raise NotImplementedError

    @abstractmethod
    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        """Called before every apply; None means the batch is unchanged (its outputs may have grown)."""
        raise NotImplementedError

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: [B, V] float32, may be changed in place; return the processed logits."""
        raise NotImplementedError

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True when apply never changes a row's argmax: then it is skipped for all-greedy batches."""
        raise NotImplementedError

    @classmethod
    def validate_params(cls, params: "SamplingParams") -> None:
        """Raise ValueError (a 400 naming this processor) for per-request arguments it cannot take;
        those arguments are in params.custom_params."""

    @classmethod
    def acts_on(cls, params: "SamplingParams") -> bool:
        """Whether the processor may change this request's row. A batch where it acts on no row
        does not run it, and when it raises, exactly these rows fail."""
        return True

    def row_views(self) -> Optional[Mapping[int, tuple[Sequence[int], Sequence[int]]]]:
        """{row: (prompt_ids, output_ids)} as this processor holds them, for the
        SGLANG_CHECK_LOGITS_PROCESSORS check; None: the processor is not checked."""
        return None


State = TypeVar("State")


def apply_batch_update(
    states: MutableMapping[int, State],
    batch_update: Optional[BatchUpdate],
    new_state: Callable[["SamplingParams", Sequence[int], Sequence[int]], Optional[State]],
) -> bool:
    """Apply `batch_update` to per-row `states` (removed -> added -> moved); `new_state` gives an
    added row's state, None for a row the processor ignores. Returns whether anything changed."""
    if batch_update is None:
        return False
    changed = False
    for index in batch_update.removed:
        changed |= states.pop(index, None) is not None
    for index, params, prompt_ids, output_ids in batch_update.added:
        state = new_state(params, prompt_ids, output_ids)
        changed |= states.pop(index, None) is not None
        if state is not None:
            states[index] = state
            changed = True
    for i, j, direction in batch_update.moved:
        a, b = states.pop(i, None), states.pop(j, None)
        if a is not None:
            states[j] = a
        if direction == MoveDirectionality.SWAP and b is not None:
            states[i] = b
        changed |= a is not None or b is not None
    return changed
