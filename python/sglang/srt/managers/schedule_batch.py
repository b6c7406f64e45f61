"""Req and ScheduleBatch: the per-request and per-batch state the scheduler owns.

This module holds only what the sampling subsystem reads; the engine grows it (KV slots,
prefix info, logprob bookkeeping) without changing these fields.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from sglang.srt.sampling.sampling_params import SamplingParams


class Req:
    """One request as the scheduler sees it."""

    def __init__(
        self,
        rid: str,
        origin_input_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_ids: Optional[set[int]] = None,
        custom_logit_processor: Optional[str] = None,
        tokenizer: Any = None,
    ) -> None:
        self.rid = rid
        self.origin_input_ids = list(origin_input_ids)
        self.output_ids: list[int] = []
        self.sampling_params = sampling_params
        self.eos_token_ids = set(eos_token_ids or ())
        self.custom_logit_processor = custom_logit_processor
        self.tokenizer = tokenizer
        self.finished_reason: Optional[dict] = None
        # A processor sees its request through "__req__"; a proxy so the params do not keep
        # a finished request alive.
        params = sampling_params.custom_params
        if custom_logit_processor is not None and isinstance(params, dict):
            params = dict(params)
            params["__req__"] = weakref.proxy(self)
        self.custom_params: Optional[dict] = params if isinstance(params, dict) else None

    def stop_token_ids(self) -> set[int]:
        """Every id that ends this request: request stop ids, model/generation-config EOS, tokenizer EOS."""
        ids = set(self.sampling_params.stop_token_ids or ())
        ids |= self.eos_token_ids
        if self.tokenizer is not None:
            ids |= set(getattr(self.tokenizer, "additional_stop_token_ids", None) or ())
            eos = getattr(self.tokenizer, "eos_token_id", None)
            if eos is not None:
                ids.add(eos)
        return ids


@dataclass
class ScheduleBatch:
    """The running batch; `sampling_info` is built from it by SamplingBatchInfo.from_schedule_batch."""

    reqs: list[Req]
    device: torch.device | str = "cpu"
    enable_custom_logit_processor: bool = False
    custom_logit_processor_allowlist: Optional[frozenset[str]] = None
    sampling_info: Any = field(default=None, repr=False)

    def batch_size(self) -> int:
        return len(self.reqs)
