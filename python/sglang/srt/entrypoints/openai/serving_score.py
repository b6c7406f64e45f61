"""POST /v1/score: SGLang's scoring API.

For every item, the probabilities of `label_token_ids` as the next token after query + item
(item + query with item_first; strings are joined as text, token ids as lists, as SGLang does).
Each item becomes one engine request that asks for the label ids' logprobs at its first output
position; its sampled token is discarded. SGLang sends max_new_tokens=0, whose prefill still
yields those logprobs; this engine records no output logprobs for a zero-token request, so one
token is generated instead (the same single prefill step, which then finishes by length).
The distribution is the temperature-1 one over the whole vocabulary (top-k/top-p/min-p off), so
every logprob mode gives log_softmax of the processed logits; the request's probabilities are
exp(logprob), or a softmax over the label logprobs alone with apply_softmax.
"""

from __future__ import annotations

import math
import uuid
from typing import Any, Optional, Union

import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import ValidationError

from sglang.srt.entrypoints.openai.protocol import (
    RequestError,
    ScoringRequest,
    ScoringResponse,
    UsageInfo,
)
from sglang.srt.entrypoints.openai.serving_choices import collect_unless_disconnected
from sglang.srt.entrypoints.openai.serving_wire import (
    client_closed_response,
    describe_failure,
    error_response,
    json_response,
    validation_error,
)
from sglang.srt.managers.io_struct import GenerateReqInput

# Neutral sampling for the one discarded token: the logprobs read are the model's own next-token
# distribution in every logprob mode (no temperature, no truncated support).
_SCORING_PARAMS = {"max_new_tokens": 1, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0}


class OpenAIServingScore:
    def __init__(self, tokenizer_manager: Any, server_args: Any) -> None:
        self.tokenizer_manager = tokenizer_manager
        self.server_args = server_args

    async def handle(self, raw_request: Request) -> Response:
        try:
            req = parse_scoring_request(await raw_request.body())
            self._check_labels(req.label_token_ids)
        except RequestError as exc:
            return error_response(str(exc), param=exc.param)
        inputs = scoring_inputs(req)
        request_id = f"score-{uuid.uuid4().hex}"
        for i, obj in enumerate(inputs):
            obj.rid = f"{request_id}-{i}"
        events = self.tokenizer_manager.generate_many(inputs)
        try:
            finals = await collect_unless_disconnected(raw_request, events, len(inputs))
            if finals is None:
                return client_closed_response()
            return json_response(self._response(req, finals))
        except Exception as exc:
            failure = describe_failure(exc)
            return json_response(failure, status_code=failure.code)

    def _check_labels(self, label_token_ids: list[int]) -> None:
        # The engine would name its own field (token_ids_logprob); the client sent these.
        vocab = getattr(getattr(self.tokenizer_manager, "ready", None), "vocab_size", None)
        for token_id in label_token_ids:
            if token_id < 0 or (vocab is not None and token_id >= vocab):
                raise RequestError(
                    f"label_token_ids contains {token_id}, outside the vocabulary [0, {vocab})",
                    param="label_token_ids",
                )

    def _response(self, req: ScoringRequest, finals: list[dict[str, Any]]) -> ScoringResponse:
        scores = [label_scores(label_logprobs(f, req.label_token_ids), req.apply_softmax) for f in finals]
        prompt = sum(f["meta_info"]["prompt_tokens"] for f in finals)
        return ScoringResponse(
            scores=scores,
            model=req.model or self.server_args.served_model_name,
            # The discarded token is not output the client asked for.
            usage=UsageInfo(prompt_tokens=prompt, completion_tokens=0, total_tokens=prompt),
        )


def parse_scoring_request(body: bytes) -> ScoringRequest:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RequestError("request body must be a JSON object")
    try:
        return ScoringRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


def scoring_inputs(req: ScoringRequest) -> list[GenerateReqInput]:
    """One engine request per item, in item order."""
    inputs = []
    for item in req.item_list():
        prompt = _join(item, req.query) if req.item_first else _join(req.query, item)
        key = "text" if isinstance(prompt, str) else "input_ids"
        inputs.append(
            GenerateReqInput(
                **{key: prompt},
                sampling_params=dict(_SCORING_PARAMS),
                return_logprob=True,
                token_ids_logprob=list(req.label_token_ids),
            )
        )
    return inputs


def _join(first: Union[str, list[int]], second: Union[str, list[int]]) -> Union[str, list[int]]:
    return first + second  # type: ignore[operator]  # validated: both str or both lists


def label_logprobs(final: dict[str, Any], label_token_ids: list[int]) -> list[Optional[float]]:
    """The labels' logprobs at the first output position of an engine result, in label order."""
    positions = final["meta_info"].get("output_token_ids_logprobs") or []
    if not positions:
        raise RuntimeError("the engine returned no token-id logprobs for a scoring request")
    by_id = {entry[1]: entry[0] for entry in positions[0]}
    return [by_id.get(token_id) for token_id in label_token_ids]


def label_scores(logprobs: list[Optional[float]], apply_softmax: bool) -> list[float]:
    """exp(logprob) per label, or a softmax over the labels' logprobs (apply_softmax).

    A missing or -inf logprob is probability 0. With apply_softmax and every label at the same
    (e.g. the masked minimum) value, the labels share the mass equally.
    """
    values = [-math.inf if lp is None else lp for lp in logprobs]
    if not apply_softmax:
        return [math.exp(v) for v in values]
    top = max(values)
    if top == -math.inf:
        return [1.0 / len(values)] * len(values)
    weights = [math.exp(v - top) for v in values]
    total = sum(weights)
    return [w / total for w in weights]
