"""What /v1/responses answers: the response objects of one create request, and the Responses
server-sent events of a streamed one."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import orjson

from sglang.srt.entrypoints.openai.chat_output import ChatDelta, ChatOutputParser, merge_calls
from sglang.srt.entrypoints.openai.protocol import (
    ErrorResponse,
    ResponseFunctionCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponsesRequest,
    ResponsesResponse,
    ResponseStatus,
    ResponseUsage,
)
from sglang.srt.entrypoints.openai.responses_store import Message, StoredResponse

@dataclass
class Turn:
    """One create request: what its response objects are built from."""

    req: ResponsesRequest
    response_id: str
    model: str
    history: list[Message]  # previous conversation + this input, without instructions
    # A fresh parser of the output (its tool calls); set once the chat request is built.
    make_parser: Callable[[], ChatOutputParser] = lambda: ChatOutputParser(None, None)
    message_id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(self, status: ResponseStatus, **fields: Any) -> ResponsesResponse:
        req = self.req
        return ResponsesResponse(
            id=self.response_id, created_at=self.created_at, status=status, model=self.model,
            instructions=req.instructions, max_output_tokens=req.max_output_tokens,
            previous_response_id=req.previous_response_id, store=req.store, background=req.background,
            temperature=req.effective_temperature, top_p=req.effective_top_p, tool_choice=req.tool_choice_echo(),
            tools=[t.model_dump(exclude_none=True) for t in req.tools],
            parallel_tool_calls=req.parallel_tool_calls, user=req.user, metadata=req.metadata,
            text=req.text.echo(), **fields,
        )

    def message(self, text: str, status: str) -> ResponseOutputMessage:
        return ResponseOutputMessage(id=self.message_id, status=status, content=[ResponseOutputText(text=text)])

    def finished(self, final: dict[str, Any], parsed: Optional[ChatDelta] = None) -> ResponsesResponse:
        """The response for the engine's last item: completed (also on reaching max_output_tokens:
        SGLang's answer, which SGLang clients and the openai client's stream helper expect;
        OpenAI's own API says incomplete there). `parsed` is the streamed parse of the output;
        without it the text is parsed here. The message comes first, then the calls."""
        if parsed is None:
            parser = self.make_parser()
            parsed = parser.feed(final["text"]).add(parser.finish())
        meta = final["meta_info"]
        usage = ResponseUsage.of(meta["prompt_tokens"], meta["completion_tokens"], meta.get("cached_tokens", 0))
        finish = meta.get("finish_reason") or {}
        status = "incomplete" if finish.get("type") == "abort" else "completed"
        output = [self.message(parsed.content, status), *function_calls(parsed, status)]
        if finish.get("type") == "abort":
            error = {"code": "server_error", "message": finish.get("message", "the request was aborted")}
            return self.response("failed", output=output, usage=usage, error=error)
        return self.response("completed", output=output, usage=usage)

    def failed(self, failure: ErrorResponse) -> ResponsesResponse:
        return self.response("failed", error={"code": "server_error", "message": failure.message})

    def stored(self, response: ResponsesResponse) -> StoredResponse:
        answer: Message = {"role": "assistant", "content": response.output_text()}
        calls = response.function_calls()
        if calls:
            answer["tool_calls"] = [
                {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
            ]
        return StoredResponse(response, self.history + ([answer] if response.output else []))


def function_calls(parsed: ChatDelta, status: str) -> list[ResponseFunctionCall]:
    return [
        ResponseFunctionCall(id=f"fc_{call_id.removeprefix('call_')}", call_id=call_id, name=name, arguments=arguments,
                             status=status)
        for call_id, name, arguments in merge_calls(parsed.tool_calls)
    ]


class EventWriter:
    """Server-sent Responses events: `event: <type>` + `data: <json>` with a sequence number."""

    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(body) + b"\n\n"


def call_events(event: EventWriter, deltas: list[Any], item_ids: dict[int, str]) -> list[bytes]:
    """A call's item (after the message, at output_index 1 + its index) opens with its first
    delta; its argument text follows as deltas. `item_ids` keeps each call's item id."""
    out = []
    for delta in deltas:
        if delta.id is not None:
            item_ids[delta.index] = f"fc_{delta.id.removeprefix('call_')}"
            item = ResponseFunctionCall(id=item_ids[delta.index], call_id=delta.id, name=delta.function.name,
                                        arguments="", status="in_progress")
            out.append(event("response.output_item.added", output_index=1 + delta.index, item=item.model_dump()))
        if delta.function.arguments:
            out.append(event("response.function_call_arguments.delta", output_index=1 + delta.index,
                             item_id=item_ids[delta.index], delta=delta.function.arguments))
    return out
