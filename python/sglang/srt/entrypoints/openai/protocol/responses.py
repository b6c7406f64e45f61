"""/v1/responses: input items, tools, the text format, the request, and the response object."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictInt, Tag, field_validator, model_validator

from sglang.srt.entrypoints.openai.protocol.common import (
    RequestError,
    Unsupported,
    _is_absent,
    _is_falsy,
    _now,
    cache_namespace,
)
from sglang.srt.entrypoints.openai.protocol.formats import (
    Grammar,
    JsonObjectFormat,
    TextFormat,
    _check_format_type,
    _format_union,
    _SchemaFields,
)
from sglang.srt.entrypoints.openai.protocol_base import _Nested, _Strict

class ResponseInputText(_Nested):
    # Earlier output echoed back as input carries output_text parts with their annotations.
    type: Literal["input_text", "output_text", "text"]
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class ResponseInputMessage(_Nested):
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[ResponseInputText]]
    # Present on output messages that a client passes back as input; they carry no content.
    id: Optional[str] = None
    status: Optional[str] = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        for part in value if isinstance(value, list) else ():
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind not in ("input_text", "output_text", "text"):
                raise ValueError(f"content parts of type {kind!r} are not supported (only text)")
        return value

    def to_chat_message(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "\n".join(part.text for part in content)
        return {"role": self.role, "content": content}


class ResponseFunctionCallInput(_Nested):
    """A call of an earlier response, passed back as input."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: Optional[str] = None
    status: Optional[str] = None


class ResponseFunctionCallOutputInput(_Nested):
    """The client's answer to a call: it becomes a tool message."""

    type: Literal["function_call_output"]
    call_id: str
    output: str
    id: Optional[str] = None
    status: Optional[str] = None


def _input_item_kind(value: Any) -> Optional[str]:
    # A message may leave out its type.
    if isinstance(value, dict):
        return f"item[{value.get('type', 'message')}]"
    return f"item[{getattr(value, 'type', None)}]"


ResponseInputItem = Annotated[
    Union[
        Annotated[ResponseInputMessage, Tag("item[message]")],
        Annotated[ResponseFunctionCallInput, Tag("item[function_call]")],
        Annotated[ResponseFunctionCallOutputInput, Tag("item[function_call_output]")],
    ],
    Discriminator(_input_item_kind),
]
RESPONSE_INPUT_TYPES = ("message", "function_call", "function_call_output")


def _input_chat_messages(items: list[Any]) -> list[dict[str, Any]]:
    """Input items as chat messages: consecutive calls join one assistant message."""
    out: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, ResponseInputMessage):
            out.append(item.to_chat_message())
        elif isinstance(item, ResponseFunctionCallOutputInput):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        else:
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            if not (out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls")):
                out.append({"role": "assistant", "content": "", "tool_calls": []})
            out[-1]["tool_calls"].append(call)
    return out


class ResponsesFunctionTool(_Strict):
    """A Responses API function tool (flat: name and parameters beside type)."""

    type: Literal["function"]
    name: str = Field(min_length=1)
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None

    def chat_tool(self) -> dict[str, Any]:
        return {"type": "function", "function": self.model_dump(exclude={"type"}, exclude_none=True)}


class ResponsesNamedToolChoice(_Nested):
    type: Literal["function"]
    name: str


class ResponsesJsonSchemaFormat(_SchemaFields):
    """The Responses API's json_schema format: the same fields, not nested under `json_schema`."""

    type: Literal["json_schema"]


_RESPONSES_FORMATS: dict[str, type[_Nested]] = {
    "text": TextFormat,
    "json_object": JsonObjectFormat,
    "json_schema": ResponsesJsonSchemaFormat,
}
RESPONSES_FORMAT_TYPES = tuple(_RESPONSES_FORMATS)


class ResponseTextConfig(_Nested):
    format: Optional[_format_union(_RESPONSES_FORMATS)] = None

    @field_validator("format", mode="before")
    @classmethod
    def _known_format(cls, value: Any) -> Any:
        return _check_format_type(value, RESPONSES_FORMAT_TYPES)

    def echo(self) -> dict[str, Any]:
        """The `text` a response object reports: the format as given, text by default."""
        fmt = self.format or TextFormat(type="text")
        return {"format": {"type": fmt.type, **fmt.model_dump(by_alias=True, exclude_none=True)}}


# SGLang's default temperature for /v1/responses (its chat default is 1.0).
RESPONSES_DEFAULT_TEMPERATURE = 0.7
RESPONSE_ID_PREFIX = "resp_"


class ResponsesRequest(_Strict):
    """POST /v1/responses: OpenAI's fields this server honours, then SGLang's extras."""

    model_config = ConfigDict(extra="ignore")

    input: Union[str, list[ResponseInputItem]]
    model: Optional[str] = None
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    stream: bool = False
    store: bool = True
    background: bool = False
    previous_response_id: Optional[str] = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    user: Optional[str] = None
    parallel_tool_calls: bool = True
    tools: list[ResponsesFunctionTool] = Field(default_factory=list)
    tool_choice: Union[Literal["auto", "none", "required"], ResponsesNamedToolChoice] = "auto"
    text: ResponseTextConfig = Field(default_factory=ResponseTextConfig)
    # SGLang extras.
    request_id: Optional[str] = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: Optional[Union[str, list[str]]] = None
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    priority: Optional[StrictInt] = None  # --enable-priority-scheduling
    cache_salt: Optional[str] = None  # prefix-cache namespaces, as on the other routes
    extra_key: Optional[str] = None

    @property
    def cache_namespace(self) -> Optional[str]:
        return cache_namespace(self.cache_salt, self.extra_key)

    @model_validator(mode="after")
    def _consistent(self) -> "ResponsesRequest":
        if self.input == [] and self.previous_response_id is None:
            raise RequestError("input must not be empty", param="input")
        if self.background and not self.store:
            raise RequestError("background responses must be stored (store=true)", param="background")
        if self.background and self.stream:
            raise RequestError("background responses cannot be streamed", param="background")
        if self.request_id is not None and not self.request_id.startswith(RESPONSE_ID_PREFIX):
            raise RequestError(f"request_id must begin with '{RESPONSE_ID_PREFIX}'", param="request_id")
        return self

    def input_messages(self) -> list[dict[str, Any]]:
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        return _input_chat_messages(self.input)

    def chat_tool_fields(self) -> dict[str, Any]:
        """tools / tool_choice / parallel_tool_calls in the chat request's shape."""
        choice = self.tool_choice
        if isinstance(choice, ResponsesNamedToolChoice):
            choice = {"type": "function", "function": {"name": choice.name}}
        if not self.tools:  # a required or named choice without tools is refused by the chat request
            return {} if choice in ("auto", "none") else {"tool_choice": choice}
        return {"tools": [t.chat_tool() for t in self.tools], "tool_choice": choice,
                "parallel_tool_calls": self.parallel_tool_calls}

    def tool_choice_echo(self) -> Any:
        choice = self.tool_choice
        return choice.model_dump() if isinstance(choice, ResponsesNamedToolChoice) else choice

    def sampling_params(self) -> dict[str, Any]:
        params = {
            "max_new_tokens": self.max_output_tokens,  # None = up to the rest of the context
            "temperature": self.effective_temperature,
            "top_p": self.effective_top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
        }
        if self.stop is not None:
            params["stop"] = self.stop
        return params

    @property
    def format_grammar(self) -> Optional[Grammar]:
        return self.text.format.grammar() if self.text.format is not None else None

    @property
    def effective_temperature(self) -> float:
        return RESPONSES_DEFAULT_TEMPERATURE if self.temperature is None else self.temperature

    @property
    def effective_top_p(self) -> float:
        return 1.0 if self.top_p is None else self.top_p


def _is_format_only(value: Any) -> bool:
    # text.format is honoured (ResponseTextConfig); any other key (verbosity) is not.
    return value is None or (isinstance(value, dict) and set(value) <= {"format"})


RESPONSES_UNSUPPORTED: Unsupported = {
    "include": (_is_falsy, "extra output data (include) is not implemented"),
    "reasoning": (_is_absent, "reasoning controls are not implemented"),
    "text": (_is_format_only, "only text.format is implemented (verbosity control is not)"),
    "truncation": (lambda v: v in (None, "disabled"), "truncation is not implemented; only 'disabled' is accepted"),
    "max_tool_calls": (_is_absent, "a limit on tool calls is not implemented"),
    "top_logprobs": (lambda v: v in (None, 0), "logprobs are not returned by /v1/responses"),
    "prompt": (_is_absent, "stored prompt templates are not implemented"),
    "conversation": (_is_absent, "the Conversations API is not implemented; use previous_response_id"),
    "service_tier": (lambda v: v in (None, "auto", "default"), "service tiers are not implemented"),
}


class ResponseOutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class ResponseOutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[ResponseOutputText]


class ResponseFunctionCall(BaseModel):
    """A call the model made (an output item)."""

    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class ResponseUsage(BaseModel):
    """OpenAI's usage fields, plus the chat-style names SGLang's non-stream responses carry."""

    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int] = Field(default_factory=lambda: {"reasoning_tokens": 0})
    total_tokens: int
    prompt_tokens: int
    completion_tokens: int

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int) -> "ResponseUsage":
        return cls(
            input_tokens=prompt,
            input_tokens_details={"cached_tokens": cached},
            output_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens=prompt,
            completion_tokens=completion,
        )


ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]


class ResponsesResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=_now)
    status: ResponseStatus
    model: str
    output: list[Union[ResponseOutputMessage, ResponseFunctionCall]] = Field(default_factory=list)
    usage: Optional[ResponseUsage] = None
    error: Optional[dict[str, Any]] = None
    incomplete_details: Optional[dict[str, Any]] = None
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = None
    previous_response_id: Optional[str] = None
    reasoning: dict[str, Any] = Field(default_factory=lambda: {"effort": None, "summary": None})
    store: bool = True
    background: bool = False
    temperature: float
    top_p: float
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: Any = "auto"
    tools: list[Any] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    truncation: Literal["disabled"] = "disabled"
    user: Optional[str] = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    def output_text(self) -> str:
        return "".join(part.text for item in self.output if item.type == "message" for part in item.content)

    def function_calls(self) -> list[ResponseFunctionCall]:
        return [item for item in self.output if item.type == "function_call"]
