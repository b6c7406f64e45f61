"""What /v1/completions and /v1/chat/completions share: parsing, streaming, errors.

A request becomes one GenerateReqInput per prompt, carrying n; the tokenizer manager fans each
out into its n choices and merges their native streams (generate_many), every item tagged with
its choice's "index". Every native item advances one ChoiceTracker, which turns the cumulative
native dict into the piece of text / logprobs that is new. A non-stream response is a single
step from nothing to the final item.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Optional, TypeVar, Union

import orjson
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from sglang.srt.entrypoints.openai.protocol import (
    OPENAI_SAMPLING_DEFAULTS,
    CompletionTokensDetails,
    ErrorResponse,
    Grammar,
    PromptTokensDetails,
    RequestError,
    Unsupported,
    UsageInfo,
    _GenerationRequest,
)
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import ServiceUnavailableError

logger = logging.getLogger(__name__)

_DONE_EVENT = b"data: [DONE]\n\n"

# A native logprob entry: [logprob, token_id, text_or_None].
LogprobEntry = list[Any]
TopEntries = Optional[list[LogprobEntry]]
LogprobFormat = Callable[[list[LogprobEntry], list[TopEntries], int], BaseModel]
RequestT = TypeVar("RequestT", bound=_GenerationRequest)
# The tokenizer manager's merged native items, each with "index" = its choice.
Events = AsyncIterator[dict[str, Any]]


# ----------------------------------------------------------------------------- wire helpers


def json_response(body: BaseModel, status_code: int = 200) -> Response:
    # orjson writes NaN and +-inf as null, which is what clients of a JSON API can parse.
    return Response(orjson.dumps(body.model_dump()), status_code=status_code, media_type="application/json")


def error_body(
    message: str, err_type: str = "BadRequestError", code: int = 400, param: Optional[str] = None
) -> ErrorResponse:
    return ErrorResponse(message=message, type=err_type, param=param, code=code)


def error_response(
    message: str, err_type: str = "BadRequestError", code: int = 400, param: Optional[str] = None
) -> Response:
    return json_response(error_body(message, err_type, code, param), status_code=code)


def sse_event(body: Union[BaseModel, dict[str, Any]]) -> bytes:
    data = body.model_dump() if isinstance(body, BaseModel) else body
    return b"data: " + orjson.dumps(data) + b"\n\n"


def describe_failure(exc: Exception) -> ErrorResponse:
    """400 for what the engine rejected as invalid input, 500 (logged) for anything else."""
    if isinstance(exc, ValueError):
        return error_body(str(exc), param=getattr(exc, "param", None))
    if isinstance(exc, ServiceUnavailableError):
        return error_body(str(exc), "ServiceUnavailable", 503)
    logger.error("OpenAI request failed", exc_info=exc)
    return error_body("internal server error", "InternalServerError", 500)


def validation_error(exc: ValidationError) -> RequestError:
    """One readable message naming the field, from pydantic's list of errors."""
    errors = exc.errors()
    # Union members each report a failure; the deepest location is the most specific one.
    depth = max(len(_clean_loc(e["loc"])) for e in errors)
    chosen = [e for e in errors if len(_clean_loc(e["loc"])) == depth]
    loc = _clean_loc(chosen[0]["loc"])
    messages = dict.fromkeys(_error_message(e) for e in chosen)
    path = _format_loc(loc)
    text = "; ".join(messages)
    param = str(loc[0]) if loc else getattr(chosen[0].get("ctx", {}).get("error"), "param", None)
    return RequestError(f"{path}: {text}" if path else text, param=param)


def _clean_loc(loc: tuple[Union[int, str], ...]) -> tuple[Union[int, str], ...]:
    # pydantic inserts union-member tags ("str", "list[int]", ...) into error locations.
    return tuple(p for p in loc if isinstance(p, int) or ("[" not in p and p not in _TYPE_TAGS))


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def _format_loc(loc: tuple[Union[int, str], ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _error_message(error: Mapping[str, Any]) -> str:
    if error["type"] == "value_error":  # our own validators: their text, without pydantic's prefix
        return str(error["ctx"]["error"])
    return error["msg"]


# ----------------------------------------------------------------------------- sampling params


def common_sampling_params(req: _GenerationRequest, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """SGLang sampling_params for what both endpoints share; unset values are left out.

    `defaults` are the model's generation_config values, consulted only for parameters the
    user did not set and before OpenAI's own defaults.
    """
    params: dict[str, Any] = {
        "min_new_tokens": req.min_tokens,
        "stop": req.stop,
        "stop_token_ids": req.stop_token_ids,
        "stop_regex": req.stop_regex,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "ignore_eos": req.ignore_eos,
        "no_stop_trim": req.no_stop_trim,
        "skip_special_tokens": req.skip_special_tokens,
        "spaces_between_special_tokens": req.spaces_between_special_tokens,
        "logit_bias": req.logit_bias,
        "guidance": req.guidance,
        "watermark": req.watermark,
        **processor_params(req),
        "regex": req.regex,
        "ebnf": req.ebnf,
    }
    for name, openai_default in OPENAI_SAMPLING_DEFAULTS.items():
        value = getattr(req, name)
        params[name] = value if value is not None else defaults.get(name, openai_default)
    return {k: v for k, v in params.items() if v is not None}


# Built-in processor parameters a vLLM client may send inside vllm_xargs (MinerU sends
# no_repeat_ngram_size there): taken as the first-class parameter, not left for a plugin.
BUILT_IN_PROCESSOR_PARAMS = ("allowed_token_ids", "bad_words", "no_repeat_ngram_size", "thinking_token_budget")


def processor_params(req: _GenerationRequest) -> dict[str, Any]:
    """custom_params (vllm_xargs merged under it) and the built-in processors' parameters."""
    xargs = dict(req.vllm_xargs or {})
    params = {name: xargs.pop(name, None) for name in BUILT_IN_PROCESSOR_PARAMS}
    for name in BUILT_IN_PROCESSOR_PARAMS:
        if getattr(req, name) is not None:
            params[name] = getattr(req, name)
    custom = {**xargs, **(req.custom_params or {})}
    params["custom_params"] = custom or None
    return params


def grammar_params(grammar: Optional[Grammar], server_args: Any, tokenizer: Any, param: str) -> dict[str, str]:
    """The sampling param a response format sets ({} for none), validated here, where the
    request enters, so that the 400's message and `param` name the client's field (the engine's
    would name json_schema / structural_tag); the engine is told not to validate it again."""
    if grammar is None:
        return {}
    backend = getattr(server_args, "grammar_backend", "xgrammar")
    if tokenizer is None:
        raise RequestError(f"{param} needs the tokenizer, which --skip-tokenizer-init leaves unloaded", param=param)
    if backend == "none":
        raise RequestError(f"{param} needs a grammar backend; this server runs with --grammar-backend none", param=param)
    # Imported here: the grammar libraries are loaded only once a request uses one.
    from sglang.srt.constrained.base_grammar_backend import GrammarKey
    from sglang.srt.constrained.grammar_backends import validate_grammar

    try:
        validate_grammar(backend, GrammarKey(grammar.kind, grammar.text))
    except ValueError as exc:
        raise RequestError(f"{param}: {exc}", param=param) from None
    return {grammar.kind: grammar.text}


# ----------------------------------------------------------------------------- per-choice progress


@dataclass
class Piece:
    """What one native item adds to one choice."""

    index: int
    text: str
    logprobs: Optional[BaseModel]
    has_tokens: bool
    finish_reason: Optional[str]
    matched_stop: Union[int, str, None]
    # Chat only: what the reasoning and tool-call parsers took out of the text.
    reasoning: str = ""
    tool_calls: list[Any] = field(default_factory=list)
    prompt_token_ids: Optional[list[int]] = None  # chat's return_prompt_token_ids

    def is_empty(self) -> bool:
        return not (self.text or self.reasoning or self.tool_calls or self.has_tokens) and self.finish_reason is None


class ChoiceTracker:
    """Turns one choice's cumulative native items into pieces that are new since the last one."""

    def __init__(
        self, index: int, logprob_format: Optional[LogprobFormat], echo: Optional[str] = None
    ) -> None:
        self.index = index
        self.logprob_format = logprob_format
        self.echo = echo  # prompt text still to emit, ahead of the first generated text
        self.text_len = 0
        self.logprob_len = 0
        self.offset = 0  # characters emitted so far, for completion text_offset

    def step(self, item: dict[str, Any]) -> Piece:
        meta = item["meta_info"]
        text = item["text"][self.text_len :]
        self.text_len = max(self.text_len, len(item["text"]))
        entries, tops = self._new_logprobs(meta)
        if self.echo is not None:
            text = self.echo + text
            entries, tops = _input_logprobs(meta, entries, tops)
            self.echo = None
        logprobs = self.logprob_format(entries, tops, self.offset) if self.logprob_format else None
        self.offset += len(text)
        finish = meta.get("finish_reason") or {}
        return Piece(
            self.index, text, logprobs, bool(entries), finish.get("type"), finish.get("matched"),
            prompt_token_ids=item.get("prompt_token_ids"),
        )

    def _new_logprobs(self, meta: Mapping[str, Any]) -> tuple[list[LogprobEntry], list[TopEntries]]:
        entries = meta.get("output_token_logprobs") or []
        tops = meta.get("output_top_logprobs") or []
        start, self.logprob_len = self.logprob_len, len(entries)
        return entries[start:], _pad(tops[start : len(entries)], len(entries) - start)


def _input_logprobs(
    meta: Mapping[str, Any], entries: list[LogprobEntry], tops: list[TopEntries]
) -> tuple[list[LogprobEntry], list[TopEntries]]:
    """Prompt logprobs (echo) ahead of the output ones."""
    prompt = meta.get("input_token_logprobs") or []
    prompt_tops = _pad(meta.get("input_top_logprobs") or [], len(prompt))
    return prompt + entries, prompt_tops + tops


def _pad(tops: list[TopEntries], length: int) -> list[TopEntries]:
    return list(tops[:length]) + [None] * (length - len(tops))


async def _collect(events: Events, count: int) -> list[dict[str, Any]]:
    """The last (complete) item of every choice."""
    finals: dict[int, dict[str, Any]] = {}
    async for item in events:
        finals[item["index"]] = item
    if len(finals) != count:
        raise RuntimeError("the engine ended a request without output")
    return [finals[i] for i in range(count)]


async def collect_unless_disconnected(
    raw_request: Request, events: Events, count: int
) -> Optional[list[dict[str, Any]]]:
    """The last item of every choice, or None when the client left first; raises what the engine
    raised. Nothing else notices a client that leaves a non-stream request, so it is watched here
    and the engine streams are closed at once (aborting their requests)."""
    work = asyncio.ensure_future(_collect(events, count))
    watch = asyncio.ensure_future(_until_disconnected(raw_request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        work.cancel()
        await asyncio.gather(work, watch, return_exceptions=True)
    return None if work.cancelled() else work.result()


def client_closed_response() -> Response:
    return error_response("the client closed the request", "ClientClosedRequest", 499)


async def _until_disconnected(raw_request: Request) -> None:
    # The body has been read, so the next ASGI message can only be the client's disconnect.
    while (await raw_request.receive())["type"] != "http.disconnect":
        pass


async def prepend(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield first
    async for item in rest:
        yield item


def usage_of(finals: list[dict[str, Any]], n: int) -> UsageInfo:
    """Usage over all choices; a prompt shared by its n choices is counted once."""
    metas = [item["meta_info"] for item in finals]
    groups = [metas[i : i + n] for i in range(0, len(metas), n)]
    prompt = sum(group[0]["prompt_tokens"] for group in groups)
    completion = sum(m["completion_tokens"] for m in metas)
    cached = sum(max(m.get("cached_tokens", 0) for m in group) for group in groups)
    reasoning = sum(m.get("reasoning_tokens", 0) for m in metas)
    return UsageInfo(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        reasoning_tokens=reasoning,
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=reasoning) if reasoning else None,
    )


# ----------------------------------------------------------------------------- serving


class OpenAIServingBase(ABC, Generic[RequestT]):
    request_model: type[RequestT]
    unsupported: Unsupported
    id_prefix: str

    def __init__(self, tokenizer_manager: Any, server_args: Any) -> None:
        self.tokenizer_manager = tokenizer_manager
        self.server_args = server_args

    async def handle(self, raw_request: Request) -> Response:
        """The route: validate, fan out to the engine, answer in full or as SSE."""
        try:
            req = self.parse(await raw_request.body())
            inputs = self.convert(req)
        except RequestError as exc:
            return error_response(str(exc), param=exc.param)
        request_id = req.rid or f"{self.id_prefix}{uuid.uuid4().hex}"
        for i, obj in enumerate(inputs):
            # A client's rid names the engine request of its single prompt as it is (SGLang);
            # the tokenizer manager names the n > 1 children `{rid}_{i}`.
            obj.rid = req.rid if req.rid and len(inputs) == 1 else f"{request_id}-{i}"
        events = self.tokenizer_manager.generate_many(inputs, grammar_checked=self.grammar_checked(req))
        count = len(inputs) * req.n
        if req.stream:
            return await self._stream(req, request_id, events, count)
        return await self._complete(req, request_id, raw_request, events, count)

    def parse(self, body: bytes) -> RequestT:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise RequestError(f"request body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise RequestError("request body must be a JSON object")
        for name, (accepted, why) in self.unsupported.items():
            if not accepted(data.get(name)):
                raise RequestError(f"'{name}' is not supported by this server: {why}.", param=name)
        try:
            return self.request_model.model_validate(data)
        except ValidationError as exc:
            raise validation_error(exc) from None

    def format_params(self, req: RequestT) -> dict[str, str]:
        """The grammar sampling param of req.response_format, validated (RequestError if not)."""
        tokenizer = getattr(self.tokenizer_manager, "tokenizer", None)
        return grammar_params(req.format_grammar, self.server_args, tokenizer, "response_format")

    def grammar_checked(self, req: RequestT) -> bool:
        """Whether convert validated the request's grammar (a response_format's, by format_params),
        so that the engine does not again."""
        return req.format_grammar is not None

    def model_name(self, req: RequestT) -> str:
        return req.model or self.server_args.served_model_name

    def token_text(self, entry: LogprobEntry) -> str:
        """The text of a logprob entry's token (the engine sends it when asked; decode otherwise)."""
        if entry[2] is not None:
            return entry[2]
        tokenizer = getattr(self.tokenizer_manager, "tokenizer", None)
        return tokenizer.decode([entry[1]]) if tokenizer is not None else f"token_id:{entry[1]}"

    @abstractmethod
    def convert(self, req: RequestT) -> list[GenerateReqInput]:
        """One engine request per prompt, each with sampling_params n = req.n (its choices are
        at positions k * n .. k * n + n - 1); RequestError if impossible."""

    @abstractmethod
    def trackers(self, req: RequestT, count: int) -> list[ChoiceTracker]:
        """A fresh tracker per choice."""

    @abstractmethod
    def full_response(
        self, req: RequestT, request_id: str, pieces: list[Piece], usage: UsageInfo
    ) -> BaseModel:
        """The non-stream response body."""

    @abstractmethod
    def stream_chunk(
        self, req: RequestT, request_id: str, pieces: list[Piece], usage: Optional[UsageInfo] = None
    ) -> BaseModel:
        """One SSE chunk (no pieces and a usage = the final usage chunk)."""

    def stream_preamble(self, req: RequestT, request_id: str, count: int) -> list[BaseModel]:
        """Chunks sent before any generated text."""
        return []

    async def _complete(
        self,
        req: RequestT,
        request_id: str,
        raw_request: Request,
        events: Events,
        count: int,
    ) -> Response:
        try:
            finals = await collect_unless_disconnected(raw_request, events, count)
        except Exception as exc:
            failure = describe_failure(exc)
            return json_response(failure, status_code=failure.code)
        if finals is None:
            return client_closed_response()
        pieces = [tracker.step(item) for tracker, item in zip(self.trackers(req, count), finals)]
        return json_response(self.full_response(req, request_id, pieces, usage_of(finals, req.n)))

    async def _stream(
        self, req: RequestT, request_id: str, events: Events, count: int
    ) -> Response:
        # Wait for the first item so that a rejected request still gets a plain 400 response.
        try:
            first = await anext(events)
        except Exception as exc:
            await events.aclose()
            failure = describe_failure(exc)
            return json_response(failure, status_code=failure.code)
        return StreamingResponse(
            self._sse(req, request_id, first, events, count), media_type="text/event-stream"
        )

    async def _sse(
        self,
        req: RequestT,
        request_id: str,
        first: dict[str, Any],
        events: Events,
        count: int,
    ) -> AsyncIterator[bytes]:
        trackers = self.trackers(req, count)
        finals: list[dict[str, Any]] = [{} for _ in range(count)]
        try:
            for chunk in self.stream_preamble(req, request_id, count):
                yield sse_event(chunk)
            async for item in prepend(first, events):
                finals[item["index"]] = item
                piece = trackers[item["index"]].step(item)
                if not piece.is_empty():
                    usage = usage_of([item], 1) if req.continuous_usage else None
                    yield sse_event(self.stream_chunk(req, request_id, [piece], usage))
            if req.include_usage:
                yield sse_event(self.stream_chunk(req, request_id, [], usage_of(finals, req.n)))
        except Exception as exc:
            yield sse_event({"error": describe_failure(exc).model_dump()})
        finally:
            await events.aclose()
        yield _DONE_EVENT
