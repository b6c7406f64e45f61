"""/v1/responses: OpenAI's Responses API on the chat-completions machinery, as SGLang serves it.

POST /v1/responses renders `instructions` + the conversation (a previous response's input and
output when `previous_response_id` is given) + `input` with the chat template, generates, and
answers a response object, or streams Responses events (response.created, response.in_progress,
response.output_item.added, response.content_part.added, response.output_text.delta...,
response.output_text.done, response.content_part.done, response.output_item.done, a function
call's output_item.added / function_call_arguments.delta... / .done / output_item.done, then
response.completed / response.incomplete / response.failed). Function tools and tool_choice go
through the chat handler: its template, its tool grammar and its tool-call parser. `background: true` answers a
queued response at once and generates in a task (POST /v1/responses/{id}/cancel stops it).
GET /v1/responses/{id} retrieves and DELETE /v1/responses/{id} deletes a stored response
(responses_store keeps them; responses_output builds the response objects and the events).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any, Optional

import orjson
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from sglang.srt.entrypoints.openai.chat_output import ChatChoiceTracker, ChatDelta
from sglang.srt.entrypoints.openai.protocol import (
    RESPONSE_ID_PREFIX,
    RESPONSES_UNSUPPORTED,
    ChatCompletionRequest,
    ErrorResponse,
    RequestError,
    ResponseOutputText,
    ResponsesRequest,
    ResponsesResponse,
)
from sglang.srt.entrypoints.openai.responses_output import EventWriter, Turn, call_events
from sglang.srt.entrypoints.openai.responses_store import MAX_STORED_RESPONSES, Message, ResponseStore, StoredResponse
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.serving_choices import Events, collect_unless_disconnected, prepend
from sglang.srt.entrypoints.openai.serving_params import grammar_params
from sglang.srt.entrypoints.openai.serving_wire import describe_failure, validation_error
from sglang.srt.managers.io_struct import GenerateReqInput


# ----------------------------------------------------------------------------- errors


class ResponsesRequestError(RequestError):
    """A refused request with its HTTP status (400, or 404 for an unknown response id)."""

    def __init__(self, message: str, param: Optional[str] = None, status_code: int = 400) -> None:
        super().__init__(message, param)
        self.status_code = status_code


def _json(body: Any, status_code: int = 200) -> Response:
    data = body.model_dump() if hasattr(body, "model_dump") else body
    return Response(orjson.dumps(data), status_code=status_code, media_type="application/json")


def responses_error(message: str, status_code: int = 400, param: Optional[str] = None,
                    err_type: str = "invalid_request_error") -> Response:
    # SGLang and OpenAI nest the error object for this route (the others answer it flat).
    error = {"message": message, "type": err_type, "param": param, "code": status_code}
    return _json({"error": error}, status_code)


def _failure_response(failure: ErrorResponse) -> Response:
    return responses_error(failure.message, failure.code, failure.param, failure.type)


def _checked_id(response_id: str) -> str:
    if not response_id.startswith(RESPONSE_ID_PREFIX):
        raise ResponsesRequestError(
            f"Invalid 'response_id': '{response_id}'. Expected an ID that begins with '{RESPONSE_ID_PREFIX}'.",
            param="response_id",
        )
    return response_id


def _not_found(response_id: str, param: str = "response_id") -> ResponsesRequestError:
    return ResponsesRequestError(f"Response with id '{response_id}' not found.", param=param, status_code=404)


def _input_error(exc: RequestError, prefix: str) -> RequestError:
    """An error of the chat request built from the input: it names tools / tool_choice, else input."""
    if exc.param in ("tools", "tool_choice"):
        return exc
    return RequestError(f"{prefix}{exc}", param="input")


async def _last_item(events: Events) -> dict[str, Any]:
    final: Optional[dict[str, Any]] = None
    async for item in events:
        final = item
    if final is None:
        raise RuntimeError("the engine ended a request without output")
    return final


# ----------------------------------------------------------------------------- serving


class OpenAIServingResponses:
    def __init__(self, tokenizer_manager: Any, server_args: Any, chat: OpenAIServingChat,
                 capacity: int = MAX_STORED_RESPONSES) -> None:
        self.tokenizer_manager = tokenizer_manager
        self.server_args = server_args
        self.chat = chat
        self.store = ResponseStore(capacity)
        self._background: dict[str, asyncio.Task] = {}

    # ------------------------------------------------------------------ routes

    async def create(self, raw_request: Request) -> Response:
        try:
            turn = self._turn(parse_responses_request(await raw_request.body()))
            obj = self._engine_request(turn)
        except ResponsesRequestError as exc:
            return responses_error(str(exc), exc.status_code, exc.param)
        except RequestError as exc:
            return responses_error(str(exc), param=exc.param)
        events = self.tokenizer_manager.generate_many([obj], grammar_checked=self._grammar_checked(obj))
        if turn.req.background:
            return self._start_background(turn, events)
        if turn.req.stream:
            return await self._stream(turn, events)
        return await self._complete(turn, raw_request, events)

    async def retrieve(self, response_id: str) -> Response:
        try:
            return _json(self._stored(response_id).response)
        except ResponsesRequestError as exc:
            return responses_error(str(exc), exc.status_code, exc.param)

    async def delete(self, response_id: str) -> Response:
        try:
            self._stored(response_id)
        except ResponsesRequestError as exc:
            return responses_error(str(exc), exc.status_code, exc.param)
        await self._stop_background(response_id)
        self.store.pop(response_id)
        return _json({"id": response_id, "object": "response", "deleted": True})

    async def cancel(self, response_id: str) -> Response:
        try:
            stored = self._stored(response_id)
        except ResponsesRequestError as exc:
            return responses_error(str(exc), exc.status_code, exc.param)
        task = self._background.get(response_id)
        if task is None or task.done():
            return responses_error(
                "Only a queued or in-progress background response can be cancelled.", param="response_id"
            )
        stored.response.status = "cancelled"  # before the task stops, so it records nothing else
        await self._stop_background(response_id)
        return _json(stored.response)

    # ------------------------------------------------------------------ request -> engine

    def _turn(self, req: ResponsesRequest) -> Turn:
        history = self._previous_history(req.previous_response_id) + req.input_messages()
        response_id = req.request_id or f"{RESPONSE_ID_PREFIX}{uuid.uuid4().hex}"
        if self.store.get(response_id) is not None or response_id in self._background:
            raise ResponsesRequestError(f"request_id '{response_id}' is already in use", param="request_id")
        model = req.model or self.server_args.served_model_name
        return Turn(req=req, response_id=response_id, model=model, history=history)

    def _previous_history(self, previous_id: Optional[str]) -> list[Message]:
        if previous_id is None:
            return []
        if not previous_id.startswith(RESPONSE_ID_PREFIX):
            raise ResponsesRequestError(
                f"previous_response_id must begin with '{RESPONSE_ID_PREFIX}'", param="previous_response_id"
            )
        previous = self.store.get(previous_id)
        if previous is None:
            raise _not_found(previous_id, param="previous_response_id")
        if previous.response.status in ("queued", "in_progress"):
            raise ResponsesRequestError(
                f"the previous response '{previous_id}' has not finished", param="previous_response_id"
            )
        return list(previous.history)

    def _engine_request(self, turn: Turn) -> GenerateReqInput:
        """The engine request; sets turn.make_parser. The conversation and tools go through the chat
        handler (template, tool_choice's grammar); the reasoning section stays in the text."""
        req = turn.req
        system = [{"role": "system", "content": req.instructions}] if req.instructions is not None else []
        try:
            chat_req = ChatCompletionRequest.model_validate({"messages": system + turn.history, **req.chat_tool_fields()})
            prompt = self.chat.render(chat_req)
        except ValidationError as exc:
            raise _input_error(validation_error(exc), "input: ") from None
        except RequestError as exc:
            raise _input_error(exc, "") from None
        tool_grammar = self.chat.tool_params(chat_req)
        if tool_grammar and req.format_grammar is not None:
            raise RequestError("tool_choice 'required' or a named function cannot be combined with text.format",
                               param="tool_choice")
        tokenizer = getattr(self.tokenizer_manager, "tokenizer", None)
        params = req.sampling_params() | grammar_params(req.format_grammar, self.server_args, tokenizer, "text") | tool_grammar
        turn.make_parser = lambda: self.chat.output_parser(chat_req, reasoning_split=False)
        return GenerateReqInput(
            text=prompt, sampling_params=params, rid=turn.response_id, stream=req.stream, extra_key=req.cache_namespace,
            priority=req.priority,
        )

    @staticmethod
    def _grammar_checked(obj: GenerateReqInput) -> bool:
        # Any grammar here (text.format's or the tools') was validated by _engine_request.
        return any(kind in obj.sampling_params for kind in ("json_schema", "structural_tag"))

    def _stored(self, response_id: str) -> StoredResponse:
        stored = self.store.get(_checked_id(response_id))
        if stored is None:
            raise _not_found(response_id)
        return stored

    def _remember(self, turn: Turn, response: ResponsesResponse) -> None:
        if turn.req.store:
            self.store.put(turn.stored(response))

    # ------------------------------------------------------------------ answering

    async def _complete(self, turn: Turn, raw_request: Request, events: Events) -> Response:
        try:
            finals = await collect_unless_disconnected(raw_request, events, 1)
        except Exception as exc:
            return _failure_response(describe_failure(exc))
        if finals is None:
            return responses_error("the client closed the request", 499, err_type="ClientClosedRequest")
        response = turn.finished(finals[0])
        self._remember(turn, response)
        return _json(response)

    async def _stream(self, turn: Turn, events: Events) -> Response:
        # The first item first, so that a request the engine rejects is still a plain 400.
        try:
            first = await anext(events)
        except Exception as exc:
            await events.aclose()
            return _failure_response(describe_failure(exc))
        return StreamingResponse(self._sse(turn, first, events), media_type="text/event-stream")

    async def _sse(self, turn: Turn, first: dict[str, Any], events: Events) -> AsyncIterator[bytes]:
        event = EventWriter()
        started = turn.response("in_progress").model_dump()
        yield event("response.created", response=started)
        yield event("response.in_progress", response=started)
        ids = {"item_id": turn.message_id, "output_index": 0, "content_index": 0}
        yield event("response.output_item.added", output_index=0, item=turn.message("", "in_progress").model_dump()
                    | {"content": []})
        yield event("response.content_part.added", **ids, part=ResponseOutputText(text="").model_dump())
        tracker, final = ChatChoiceTracker(0, None, turn.make_parser()), first
        parsed, item_ids = ChatDelta(), {}
        try:
            async for item in prepend(first, events):
                final, piece = item, tracker.step(item)
                parsed = parsed.add(ChatDelta(content=piece.text, tool_calls=piece.tool_calls))
                if piece.text:
                    yield event("response.output_text.delta", **ids, delta=piece.text, logprobs=[])
                for chunk in call_events(event, piece.tool_calls, item_ids):
                    yield chunk
        except Exception as exc:
            response = turn.failed(describe_failure(exc))
            self._remember(turn, response)
            yield event("response.failed", response=response.model_dump())
            return
        finally:
            await events.aclose()
        response = turn.finished(final, parsed)
        message = response.output[0]
        yield event("response.output_text.done", **ids, text=message.content[0].text, logprobs=[])
        yield event("response.content_part.done", **ids, part=message.content[0].model_dump())
        yield event("response.output_item.done", output_index=0, item=message.model_dump())
        for index, call in enumerate(response.function_calls(), start=1):
            yield event("response.function_call_arguments.done", item_id=call.id, output_index=index,
                        arguments=call.arguments)
            yield event("response.output_item.done", output_index=index, item=call.model_dump())
        self._remember(turn, response)
        yield event(f"response.{response.status}", response=response.model_dump())

    # ------------------------------------------------------------------ background

    def _start_background(self, turn: Turn, events: Events) -> Response:
        queued = turn.response("queued")
        self.store.put(turn.stored(queued))
        task = asyncio.create_task(self._run_background(turn, events), name=f"response-{turn.response_id}")
        self._background[turn.response_id] = task
        task.add_done_callback(lambda _: self._background.pop(turn.response_id, None))
        return _json(queued)

    async def _run_background(self, turn: Turn, events: Events) -> None:
        stored = self.store.get(turn.response_id)
        if stored is not None:
            stored.response.status = "in_progress"
        try:
            response = turn.finished(await _last_item(events))
        except Exception as exc:  # recorded on the stored response; nobody is waiting to be told
            response = turn.failed(describe_failure(exc))
        finally:
            await events.aclose()
        if self.store.get(turn.response_id) is not None:  # deleted meanwhile: nothing to record
            self._remember(turn, response)

    async def _stop_background(self, response_id: str) -> None:
        task = self._background.get(response_id)
        if task is not None:
            task.cancel()  # closes the engine stream, which aborts the request
            await asyncio.gather(task, return_exceptions=True)


def parse_responses_request(body: bytes) -> ResponsesRequest:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RequestError("request body must be a JSON object")
    for name, (accepted, why) in RESPONSES_UNSUPPORTED.items():
        if not accepted(data.get(name)):
            raise RequestError(f"'{name}' is not supported by this server: {why}.", param=name)
    try:
        return ResponsesRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None
