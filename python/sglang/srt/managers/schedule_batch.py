"""Req and ScheduleBatch: the per-request and per-batch state the scheduler owns."""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from sglang.srt.beam_search.stop_text import match_stop_text
from sglang.srt.layers.sampling_report import ReportAsk
from sglang.srt.managers.sampling_report_out import PendingReport
from sglang.srt.model_executor.step import LogprobRequest
from sglang.srt.sampling.sampling_params import SamplingParams


def eos_ids(model_eos_ids: set[int], tokenizer: Any) -> set[int]:
    """The model's EOS ids (config / generation config) and the tokenizer's EOS and extra stop ids."""
    ids = set(model_eos_ids)
    if tokenizer is not None:
        ids |= set(getattr(tokenizer, "additional_stop_token_ids", None) or ())
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos is not None:
            ids.add(eos)
    return ids


# Arrival order of requests (every TP rank creates the same requests in the same order).
_ARRIVALS = itertools.count()


class Req:
    """One request as the scheduler sees it."""

    is_guide = False  # a guide context (managers/guidance_pairs.py) rather than a client's request

    def __init__(
        self,
        rid: str,
        origin_input_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_ids: Optional[set[int]] = None,
        custom_logit_processor: Optional[str] = None,
        tokenizer: Any = None,
        logprob: Optional[LogprobRequest] = None,
        stream: bool = False,
    ) -> None:
        self.rid = rid
        self.origin_input_ids = list(origin_input_ids)
        self.output_ids: list[int] = []
        self.sampling_params = sampling_params
        self.eos_token_ids = set(eos_token_ids or ())
        self.custom_logit_processor = custom_logit_processor
        self.tokenizer = tokenizer
        self.logprob = logprob
        self.stream = stream
        self.finished_reason: Optional[dict] = None
        self.matched_text: Optional[str] = None
        # A processor sees its request through "__req__"; a proxy so the params do not keep
        # a finished request alive.
        params = sampling_params.custom_params
        if custom_logit_processor is not None and isinstance(params, dict):
            params = dict(params)
            params["__req__"] = weakref.proxy(self)
        self.custom_params: Optional[dict] = params if isinstance(params, dict) else None

        # Engine bookkeeping.
        self.req_pool_idx: Optional[int] = None
        self.kv_len = 0  # tokens whose K/V are in the cache
        self.cached_tokens = 0  # prompt tokens whose K/V came from the prefix cache
        self.last_node: Any = None  # the deepest radix-cache node the request holds locked
        self.extra_key: Optional[str] = None  # its prefix-cache namespace (cache_salt / extra_key)
        self.grammar: Any = None  # its BaseGrammarObject once compiled (json_schema, regex, ebnf, structural_tag)
        self.require_reasoning = False  # the output starts in a reasoning section: the grammar waits for its end
        self.sent_output_len = 0  # output ids already sent to the detokenizer
        self.finish_sent = False
        self.kv_failed = False  # a failed step wrote (part of) its K/V: released without caching
        self.pending_logprobs = _PendingLogprobs()
        self.beam: Any = None  # its BeamGroup when beam_width > 1 (leader and members share it)
        self.beam_results: Any = None  # the returned beams, once the search finished
        self.guide: Any = None  # its GuideReq when sampling_params.guidance is set
        self.guidance_alpha: list[float] = []  # mixture guidance: the alpha of each output token
        self.sampling_report: Optional[ReportAsk] = None  # support / behaviour logprobs / entropy asked for
        self.pending_report = PendingReport()
        self.priority = 0  # --enable-priority-scheduling orders the waiting queue by it
        self.arrival = next(_ARRIVALS)  # priority preemption retracts the latest arrival among equals
        self.retraction_count = 0  # times priority preemption retracted it (meta_info "num_retractions")
        # Speculative decoding (managers/spec_decode.py): verify steps, drafts proposed, drafts accepted.
        self.spec_verify_ct = self.spec_draft_token_num = self.spec_accept_token_num = 0
        self._ending_ids: Optional[frozenset[int]] = None  # _check_stop_token's set, made at its first call

    @property
    def return_logprob(self) -> bool:
        return self.logprob is not None

    @property
    def fill_ids(self) -> list[int]:
        """The tokens a prefill runs over: the prompt, and after a retraction the output so far."""
        return self.origin_input_ids + self.output_ids if self.output_ids else self.origin_input_ids

    def finished(self) -> bool:
        return self.finished_reason is not None

    def stop_token_ids(self) -> set[int]:
        """Every id that ends this request: request stop ids, model/generation-config EOS, tokenizer EOS."""
        return set(self.sampling_params.stop_token_ids or ()) | self.eos_ids()

    def eos_ids(self) -> set[int]:
        return eos_ids(self.eos_token_ids, self.tokenizer)

    def abort(self, message: str, status_code: int = 400, err_type: str = "BadRequestError") -> None:
        self.finished_reason = {"type": "abort", "message": message, "status_code": status_code, "err_type": err_type}

    def check_finished(self) -> None:
        """Decide whether the last appended token ends the request (SGLang's order: stop strings and
        regexes, stop tokens, length, grammar terminated). min_new_tokens holds the stop strings and
        tokens back; a grammar that accepted its stop token ends the request even with ignore_eos."""
        if self.finished():
            return
        params = self.sampling_params
        last = self.output_ids[-1]
        if len(self.output_ids) >= params.min_new_tokens:
            if self._check_stop_text() or self._check_stop_token(last):
                return
        if params.max_new_tokens is not None and len(self.output_ids) >= params.max_new_tokens:
            self.finished_reason = {"type": "length", "length": params.max_new_tokens}
        elif self.grammar is not None and self.grammar.is_terminated():
            self.finished_reason = {"type": "stop", "matched": last}

    def _check_stop_token(self, token: int) -> bool:
        if self._ending_ids is None:
            # Built once: the params and the tokenizer are fixed for the request's life.
            params = self.sampling_params
            # ignore_eos ignores EOS only: explicit stop_token_ids still stop.
            self._ending_ids = frozenset(params.stop_token_ids or ()) | (frozenset() if params.ignore_eos else self.eos_ids())
        if token in self._ending_ids:
            self.finished_reason = {"type": "stop", "matched": token}
            return True
        return False

    def _check_stop_text(self) -> bool:
        match = match_stop_text(self.tokenizer, self.sampling_params, self.output_ids)
        if match is None:
            return False
        self.finished_reason = {"type": "stop", "matched": match.matched}
        self.matched_text = match.text
        return True


@dataclass
class _PendingLogprobs:
    """Logprobs computed but not yet sent to the detokenizer."""

    output_token: list[list[Any]] = field(default_factory=list)
    output_top: list[list[list[Any]]] = field(default_factory=list)
    output_token_ids: list[list[list[Any]]] = field(default_factory=list)
    input_token: Optional[list[list[Any]]] = None
    input_top: Optional[list[Optional[list[list[Any]]]]] = None
    input_token_ids: Optional[list[Optional[list[list[Any]]]]] = None


@dataclass
class ScheduleBatch:
    """The running batch; `sampling_info` is built from it by SamplingBatchInfo.from_schedule_batch."""

    reqs: list[Req]
    device: torch.device | str = "cpu"
    enable_custom_logit_processor: bool = False
    custom_logit_processor_allowlist: Optional[frozenset[str]] = None
    loaded_logits_processors: Optional[Any] = None  # the server's batch-level processor classes
    sampling_info: Any = field(default=None, repr=False)

    def batch_size(self) -> int:
        return len(self.reqs)

    def merge(self, other: "ScheduleBatch") -> None:
        """Append `other`'s requests (newly prefilled). This object stays the one the penalty
        orchestrator was built on: it reads its reqs."""
        self.sampling_info.merge_batch(other.sampling_info)
        self.reqs = self.reqs + other.reqs
