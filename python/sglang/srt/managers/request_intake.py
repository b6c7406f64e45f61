"""A scheduler request (Req) from the tokenizer manager's message, and the checks that it can
run at all: a non-empty prompt, within the context length and the KV cache."""

from __future__ import annotations

from typing import Any, Optional

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.managers.sampling_report_out import report_ask
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.model_executor.step import LogprobRequest
from sglang.srt.sampling.sampling_params import SamplingParams


class InvalidRequest(ValueError):
    """A message the scheduler refuses (HTTP 400); `req` carries its rid for the answer."""

    def __init__(self, req: Req, message: str) -> None:
        super().__init__(message)
        self.req = req


def req_from_message(
    message: TokenizedGenerateReqInput, context_len: int, eos_token_ids: set[int], tokenizer: Optional[Any]
) -> Req:
    """The Req of a message; raises InvalidRequest when its params do not decode."""
    try:
        params = SamplingParams.from_message(message.sampling_params)
    except (TypeError, ValueError) as err:  # not the tokenizer manager's normalized params
        raise InvalidRequest(Req(message.rid, message.input_ids, SamplingParams()), str(err)) from None
    if params.max_new_tokens is None:
        # SGLang's meaning of null: the rest of the context.
        params.max_new_tokens = max(context_len - len(message.input_ids), 0)
    logprob = None
    if message.return_logprob:
        start = message.logprob_start_len if message.logprob_start_len >= 0 else len(message.input_ids)
        logprob = LogprobRequest(message.top_logprobs_num, message.token_ids_logprob, start)
    req = Req(
        message.rid,
        message.input_ids,
        params,
        eos_token_ids=eos_token_ids,
        custom_logit_processor=message.custom_logit_processor,
        tokenizer=tokenizer,
        logprob=logprob,
        stream=message.stream,
    )
    req.extra_key = message.extra_key
    req.sampling_report = report_ask(message.return_sampling_mask, message.sampling_logprobs_mode, message.return_entropy)
    req.priority = message.priority or 0
    req.require_reasoning = message.require_reasoning
    return req


def kv_budget(req: Req, context_len: int) -> int:
    """KV tokens the request may use in total: prompt plus every token it may generate."""
    max_new = req.sampling_params.max_new_tokens
    if max_new is None:
        return context_len
    return len(req.origin_input_ids) + max_new


def check_fits(req: Req, context_len: int, max_total_tokens: int) -> None:
    """Raises InvalidRequest when the request can never run on this server."""
    need = kv_budget(req, context_len)
    if len(req.origin_input_ids) == 0:
        raise InvalidRequest(req, "The input is empty: at least one prompt token is required.")
    if need > context_len:
        raise InvalidRequest(
            req, f"The prompt ({len(req.origin_input_ids)} tokens) plus max_new_tokens exceeds the context length {context_len}."
        )
    if need > max_total_tokens:
        raise InvalidRequest(req, f"The request needs {need} KV-cache tokens; the server holds {max_total_tokens}.")
