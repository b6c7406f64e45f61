"""OpenAI request and response schemas (completions, chat completions, models).

Requests are validated strictly (no string-to-number coercion). Unknown top-level keys are
ignored because OpenAI clients send many optional keys; nested objects (messages, content
parts, stream_options) reject unknown keys. Known OpenAI fields this server cannot honour
are listed in `*_UNSUPPORTED` and rejected with a 400 that names them, never dropped.
A JSON `null` means "use the default", as in the native API.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

# Each choice becomes its own engine request; a bound keeps one HTTP call from flooding the queue.
MAX_N = 128
SEED_MIN = -(2**63)
SEED_MAX = 2**63 - 1

# The five parameters whose default may come from the model's generation_config (chat only).
OPENAI_SAMPLING_DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class _Nested(_Strict):
    model_config = ConfigDict(extra="forbid")


# ----------------------------------------------------------------------------- requests


class RequestError(ValueError):
    """A request the server refuses before any generation starts (HTTP 400); names the field."""

    def __init__(self, message: str, param: Optional[str] = None) -> None:
        super().__init__(message)
        self.param = param


class StreamOptions(_Nested):
    include_usage: bool = False
    # Random padding OpenAI adds against size side channels; carries no content, so a
    # server without it answers the same tokens.
    include_obfuscation: bool = False


class TextContentPart(_Nested):
    type: Literal["text"]
    text: str


class ChatMessage(_Nested):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[TextContentPart]] = ""
    name: Optional[str] = None
    # Clients echo previous assistant messages back whole; empty tool calls mean nothing.
    tool_calls: list[Any] = Field(default_factory=list, max_length=0)
    annotations: list[Any] = Field(default_factory=list)

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        for part in value if isinstance(value, list) else ():
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind != "text":
                raise ValueError(f"content parts of type {kind!r} are not supported (only 'text')")
        return value

    def to_template_dict(self) -> dict[str, Any]:
        """The message as chat templates expect it: content as one string."""
        content = self.content
        if isinstance(content, list):
            content = "\n".join(part.text for part in content)
        # Templates know system, not OpenAI's newer name for the same role.
        role = "system" if self.role == "developer" else self.role
        out: dict[str, Any] = {"role": role, "content": content}
        if self.name is not None:
            out["name"] = self.name
        return out


class _GenerationRequest(_Strict):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI, then SGLang extras)."""

    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=0)
    # None = not set by the user: the serving layer picks the default (see OPENAI_SAMPLING_DEFAULTS).
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = Field(None, ge=SEED_MIN, le=SEED_MAX)
    logit_bias: Optional[dict[str, float]] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: Optional[str] = None
    # SGLang extras.
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    min_tokens: int = Field(0, ge=0)
    stop_token_ids: Optional[list[int]] = None
    stop_regex: Optional[Union[str, list[str]]] = None
    ignore_eos: bool = False
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    custom_logit_processor: Optional[str] = None
    custom_params: Optional[dict[str, Any]] = None
    # Grammar constraints go to the engine, which names them in its 400 until it supports them.
    regex: Optional[str] = None
    ebnf: Optional[str] = None

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> "_GenerationRequest":
        if self.stream_options is not None and not self.stream:
            raise RequestError("stream_options is only allowed when stream is true", param="stream_options")
        return self

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def _is_prompt_list(value: Any) -> bool:
    if not (isinstance(value, list) and value):
        return False
    return (
        all(isinstance(p, str) for p in value) or _is_token_ids(value) or all(_is_token_ids(p) for p in value)
    )


class CompletionRequest(_GenerationRequest):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int = Field(16, ge=0)
    logprobs: Optional[int] = Field(None, ge=0)
    echo: bool = False
    json_schema: Optional[str] = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Any:
        # One message for every wrong shape, instead of one per member of the union.
        if not (isinstance(value, str) or _is_prompt_list(value)):
            raise ValueError(
                "must be a string, a non-empty list of strings, a non-empty list of token ids, "
                "or a non-empty list of non-empty lists of token ids"
            )
        return value

    def prompts(self) -> list[Union[str, list[int]]]:
        """One entry per prompt: text or token ids."""
        p = self.prompt
        if isinstance(p, str) or isinstance(p[0], int):
            return [p]
        return list(p)


# apply_chat_template's own arguments: set through chat_template_kwargs they would bypass the
# checks on tools and messages or change what the call returns.
_RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int = Field(0, ge=0)
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables_only(cls, value: dict[str, Any]) -> dict[str, Any]:
        reserved = sorted(_RESERVED_TEMPLATE_KWARGS & value.keys())
        if reserved:
            raise ValueError(f"may not set {', '.join(reserved)}")
        return value

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise RequestError("top_logprobs requires logprobs to be true", param="top_logprobs")
        return self


def _is_absent(value: Any) -> bool:
    return value is None


def _is_falsy(value: Any) -> bool:
    return not value


# field -> (accepted(value), why anything else is refused)
Unsupported = dict[str, tuple[Callable[[Any], bool], str]]

_COMMON_UNSUPPORTED: Unsupported = {
    "lora_path": (_is_absent, "LoRA adapters are not implemented"),
    "return_hidden_states": (_is_falsy, "hidden states are not returned by this server"),
}

CHAT_UNSUPPORTED: Unsupported = {
    **_COMMON_UNSUPPORTED,
    "tools": (_is_falsy, "tool calling is not implemented"),
    "tool_choice": (
        lambda v: v in (None, "none"),
        "tool calling is not implemented; only 'none' is accepted",
    ),
    "functions": (_is_falsy, "function calling is not implemented"),
    "function_call": (lambda v: v in (None, "none"), "function calling is not implemented"),
    "response_format": (
        lambda v: v is None or v == {"type": "text"},
        "structured output is not implemented; only {'type': 'text'} is accepted",
    ),
    "audio": (_is_absent, "audio output is not implemented"),
    "modalities": (lambda v: v in (None, ["text"]), "only the 'text' modality is implemented"),
    "prediction": (_is_absent, "predicted outputs are not implemented"),
    "web_search_options": (_is_absent, "web search is not implemented"),
    "reasoning_effort": (_is_absent, "reasoning effort control is not implemented"),
    "verbosity": (_is_absent, "verbosity control is not implemented"),
    "store": (_is_falsy, "completions are not stored by this server"),
    "continue_final_message": (_is_falsy, "continuing the final message is not implemented"),
}

COMPLETION_UNSUPPORTED: Unsupported = {
    **_COMMON_UNSUPPORTED,
    "suffix": (_is_falsy, "suffix (insertion) is not implemented"),
    "best_of": (lambda v: v in (None, 1), "best_of > 1 is not implemented; use n"),
}


# ----------------------------------------------------------------------------- responses


class ErrorResponse(BaseModel):
    object: Literal["error"] = "error"
    message: str
    type: str
    param: Optional[str] = None
    code: int


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    top_logprobs: Optional[list[Optional[dict[str, Optional[float]]]]] = None
    text_offset: list[int] = Field(default_factory=list)


class TopLogprob(BaseModel):
    token: str
    bytes: list[int]
    logprob: Optional[float]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] = Field(default_factory=list)


def _now() -> int:
    return int(time.time())


class _ChoiceEnd(BaseModel):
    # The native finish type ("stop" | "length" | "abort") and what matched a stop.
    finish_reason: Optional[str] = None
    matched_stop: Union[int, str, None] = None


class CompletionChoice(_ChoiceEnd):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo


class CompletionStreamResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: Optional[UsageInfo] = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatCompletionChoice(_ChoiceEnd):
    index: int
    message: AssistantMessage
    logprobs: Optional[ChatLogprobs] = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None

    @model_serializer
    def _only_set(self) -> dict[str, Any]:
        # A delta carries only what changed: role once, then content.
        return {k: v for k, v in (("role", self.role), ("content", self.content)) if v is not None}


class ChatCompletionStreamChoice(_ChoiceEnd):
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChatLogprobs] = None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: Optional[UsageInfo] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "sglang"
    root: Optional[str] = None
    max_model_len: Optional[int] = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
