"""What /v1/completions and /v1/chat/completions share: the route's parse, fan-out and answer.

A request becomes one GenerateReqInput per prompt, carrying n; the tokenizer manager fans each
out into its n choices and merges their native streams (generate_many), every item tagged with
its choice's "index". Every native item advances one ChoiceTracker (serving_choices), which turns
the cumulative native dict into the piece of text / logprobs that is new. A non-stream response
is a single step from nothing to the final item.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import Any, Generic, Optional, TypeVar

import orjson
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from sglang.srt.entrypoints.openai.protocol import RequestError, Unsupported, UsageInfo, _GenerationRequest
from sglang.srt.entrypoints.openai.serving_choices import (
    ChoiceTracker,
    Events,
    LogprobEntry,
    Piece,
    collect_unless_disconnected,
    prepend,
    usage_of,
)
from sglang.srt.entrypoints.openai.serving_params import grammar_params
from sglang.srt.entrypoints.openai.serving_wire import (
    client_closed_response,
    describe_failure,
    error_response,
    json_response,
    sse_event,
    validation_error,
)
from sglang.srt.managers.io_struct import GenerateReqInput

_DONE_EVENT = b"data: [DONE]\n\n"
RequestT = TypeVar("RequestT", bound=_GenerationRequest)


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
