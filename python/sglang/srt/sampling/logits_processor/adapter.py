"""AdapterLogitsProcessor: per-request callables on the batch API (vLLM's adapter).

A subclass implements `is_argmax_invariant()` and `new_req_logits_processor(params)`, which
returns a callable for the request or None. A callable of two arguments gets
(output_ids, logits_row), one of three (prompt_ids, output_ids, logits_row); logits_row is the
request's [V] row, and the callable returns the processed row. Rows are called one by one.
"""

from __future__ import annotations

import inspect
from abc import abstractmethod
from functools import partial
from typing import Any, Callable, Optional, Sequence

import torch

from sglang.srt.sampling.logits_processor.row_state import RowState, RowStateProcessor

RequestLogitsProcessor = Callable[..., torch.Tensor]


class _Callable(RowState):
    def __init__(self, prompt_ids: Sequence[int], output_ids: Sequence[int], fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__(prompt_ids, output_ids)
        self.fn = fn


class AdapterLogitsProcessor(RowStateProcessor):
    @abstractmethod
    def new_req_logits_processor(self, params: Any) -> Optional[RequestLogitsProcessor]:
        raise NotImplementedError

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        raise NotImplementedError

    @classmethod
    def acts_on(cls, params: Any) -> bool:
        return True  # only the instance knows (new_req_logits_processor)

    def _new_row(self, params: Any, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> Optional[_Callable]:
        fn = self.new_req_logits_processor(params)
        if fn is None:
            return None
        takes_prompt = len(inspect.signature(fn).parameters) == 3
        bound = partial(fn, prompt_ids, output_ids) if takes_prompt else partial(fn, output_ids)
        return _Callable(prompt_ids, output_ids, bound)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, state in self.states.items():
            view = logits[row]  # [V]
            result = state.fn(view)
            if result is not view:
                view.copy_(result)
        return logits
