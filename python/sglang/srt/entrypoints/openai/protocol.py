"""OpenAI request and response schemas (completions, chat completions, models).

Requests are validated strictly (no string-to-number coercion). Unknown top-level keys are
ignored because OpenAI clients send many optional keys; nested objects (messages, content
parts, stream_options) reject unknown keys. Known OpenAI fields this server cannot honour
are listed in `*_UNSUPPORTED` and rejected with a 400 that names them, never dropped.
A JSON `null` means "use the default", as in the native API.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Callable, Literal, NamedTuple, Optional, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    StrictInt,
    Tag,
    field_validator,
    model_serializer,
    model_validator,
)

from sglang.srt.entrypoints.openai.protocol_base import _Nested, _Strict
from sglang.srt.entrypoints.openai.tool_protocol import (
    NamedToolChoice,
    RequestToolCall,
    ToolCallOut,
    ToolChoice,
    ToolDefinition,
    check_tool_choice,
)

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


# ----------------------------------------------------------------------------- response_format


class Grammar(NamedTuple):
    """The one grammar sampling param a response format sets: its name and its text."""

    kind: Literal["json_schema", "structural_tag"]
    text: str


# SGLang's mapping of json_object: any JSON object.
JSON_OBJECT_SCHEMA = '{"type": "object"}'
# The engine's rule (SamplingParams): at most one of these per request.
GRAMMAR_PARAMS = ("json_schema", "regex", "ebnf", "structural_tag")


class TextFormat(_Nested):
    type: Literal["text"]

    def grammar(self) -> Optional[Grammar]:
        return None


class JsonObjectFormat(_Nested):
    type: Literal["json_object"]

    def grammar(self) -> Optional[Grammar]:
        return Grammar("json_schema", JSON_OBJECT_SCHEMA)


class _SchemaFields(_Nested):
    """OpenAI's json_schema description (nested under `json_schema` in chat, flat in Responses)."""

    name: str = Field(min_length=1)
    description: Optional[str] = None
    # `schema` would shadow a BaseModel attribute; the wire name is kept through the alias.
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema")
    # Accepted for OpenAI compatibility only: the grammar always enforces the whole schema, so
    # strict=false gets the same (stricter than asked) output.
    strict: Optional[bool] = None

    def grammar(self) -> Optional[Grammar]:
        # Without a schema nothing is asked beyond a JSON object: json_object's mapping.
        if self.schema_ is None:
            return Grammar("json_schema", JSON_OBJECT_SCHEMA)
        return Grammar("json_schema", json.dumps(self.schema_))


class JsonSchemaFormat(_Nested):
    type: Literal["json_schema"]
    json_schema: _SchemaFields

    def grammar(self) -> Optional[Grammar]:
        return self.json_schema.grammar()


class StructuralTagStructure(_Nested):
    begin: str
    schema_: dict[str, Any] = Field(alias="schema")
    end: str


class StructuralTagFormat(_Nested):
    """SGLang's form (structures + triggers), or xgrammar's own (`format`), passed on as JSON."""

    type: Literal["structural_tag"]
    structures: Optional[list[StructuralTagStructure]] = None
    triggers: Optional[list[str]] = None
    format: Optional[dict[str, Any]] = None

    @model_validator(mode="after")
    def _one_form(self) -> "StructuralTagFormat":
        legacy = (self.structures is not None, self.triggers is not None)
        if self.format is not None and any(legacy):
            raise ValueError("give either structures and triggers (SGLang's form) or format (xgrammar's), not both")
        if self.format is None and not all(legacy):
            raise ValueError("a structural_tag needs structures and triggers (or xgrammar's format)")
        return self

    def grammar(self) -> Optional[Grammar]:
        return Grammar("structural_tag", json.dumps(self.model_dump(by_alias=True, exclude_none=True)))


def _format_union(members: dict[str, type[_Nested]]) -> Any:
    """A union picked by `type` (the keys). Tags contain "[" so that error locations drop them,
    as they drop pydantic's own union-member tags (serving_base._clean_loc)."""

    def tag(value: Any) -> Optional[str]:
        return f"format[{value.get('type')}]" if isinstance(value, dict) else None

    tagged = tuple(Annotated[model, Tag(f"format[{kind}]")] for kind, model in members.items())
    return Annotated[Union[tagged], Discriminator(tag)]


def _check_format_type(value: Any, allowed: tuple[str, ...]) -> Any:
    """One message listing the allowed types, instead of pydantic's about discriminator tags."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in allowed:
        listed = ", ".join(repr(t) for t in allowed)
        got = f"got type {kind!r}" if isinstance(value, dict) else f"got {type(value).__name__}"
        raise ValueError(f"must be an object whose type is one of {listed}; {got}")
    return value


_RESPONSE_FORMATS: dict[str, type[_Nested]] = {
    "text": TextFormat,
    "json_object": JsonObjectFormat,
    "json_schema": JsonSchemaFormat,
    "structural_tag": StructuralTagFormat,
}
RESPONSE_FORMAT_TYPES = tuple(_RESPONSE_FORMATS)
ResponseFormat = _format_union(_RESPONSE_FORMATS)


# ----------------------------------------------------------------------------- requests


class RequestError(ValueError):
    """A request the server refuses before any generation starts (HTTP 400); names the field."""

    def __init__(self, message: str, param: Optional[str] = None) -> None:
        super().__init__(message)
        self.param = param


class StreamOptions(_Nested):
    include_usage: bool = False
    # With include_usage: every chunk also carries the usage of its choice so far (vLLM's and
    # SGLang's extension).
    continuous_usage_stats: bool = False
    # Random padding OpenAI adds against size side channels; carries no content, so a
    # server without it answers the same tokens.
    include_obfuscation: bool = False


class TextContentPart(_Nested):
    type: Literal["text"]
    text: str


class ChatMessage(_Nested):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextContentPart]] = ""
    name: Optional[str] = None
    # An assistant message's calls, and the call a tool message answers.
    tool_calls: list[RequestToolCall] = Field(default_factory=list)
    tool_call_id: Optional[str] = None
    # An earlier answer's reasoning, echoed back; templates that keep reasoning read it.
    reasoning_content: Optional[str] = None
    annotations: list[Any] = Field(default_factory=list)

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        for part in value if isinstance(value, list) else ():
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind != "text":
                raise ValueError(f"content parts of type {kind!r} are not supported (only 'text')")
        return value

    @model_validator(mode="after")
    def _tool_fields_fit_the_role(self) -> "ChatMessage":
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a message with role 'tool' needs the tool_call_id of the call it answers")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only a message with role 'assistant' carries tool_calls")
        return self

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
        if self.tool_calls:
            out["tool_calls"] = [call.template_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
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
    # Built-in batch-level logits processors (vLLM's names), and vLLM's extra-arguments field,
    # merged into custom_params for --logits-processors plugins.
    allowed_token_ids: Optional[list[int]] = None
    bad_words: Optional[list[str]] = None
    no_repeat_ngram_size: Optional[int] = None
    thinking_token_budget: Optional[int] = None
    vllm_xargs: Optional[dict[str, Any]] = None
    # Two-context guidance (sampling_params.guidance), as an extra body field.
    guidance: Optional[dict[str, Any]] = None
    # Structured outputs: OpenAI's response_format, or SGLang's grammar fields (sent as they are).
    response_format: Optional[ResponseFormat] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    # SGLang: the engine request id, which is also the response id (one choice) or its prefix.
    rid: Optional[str] = Field(None, min_length=1)
    # SGLang/vLLM: prefix-cache namespaces; requests share cached prefixes only within one.
    cache_salt: Optional[str] = None
    extra_key: Optional[str] = None
    # SGLang: the admission priority (--enable-priority-scheduling); a signed 64-bit integer.
    priority: Optional[StrictInt] = None
    # SGLang: per-request watermark settings {enabled, key, context_window} (sampling/watermarking).
    watermark: Optional[dict[str, Any]] = None

    @property
    def cache_namespace(self) -> Optional[str]:
        return cache_namespace(self.cache_salt, self.extra_key)

    @field_validator("response_format", mode="before")
    @classmethod
    def _known_format(cls, value: Any) -> Any:
        return _check_format_type(value, RESPONSE_FORMAT_TYPES)

    @property
    def format_grammar(self) -> Optional[Grammar]:
        return self.response_format.grammar() if self.response_format is not None else None

    @model_validator(mode="after")
    def _one_grammar(self) -> "_GenerationRequest":
        # Checked here, not left to the engine, so that the 400 names response_format, which the
        # engine never sees.
        grammar = self.format_grammar
        others = [name for name in GRAMMAR_PARAMS if getattr(self, name, None) is not None]
        if grammar is not None and others:
            raise RequestError(
                f"response_format (which sets {grammar.kind}) cannot be combined with {', '.join(others)}: "
                f"only one of {', '.join(GRAMMAR_PARAMS)} can be set",
                param="response_format",
            )
        return self

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> "_GenerationRequest":
        if self.stream_options is not None and not self.stream:
            raise RequestError("stream_options is only allowed when stream is true", param="stream_options")
        return self

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and self.stream_options.continuous_usage_stats


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
        "add_generation_prompt",
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
    # vLLM / SGLang: end the prompt inside the final assistant message so the model continues it.
    continue_final_message: bool = False
    # vLLM: None = true (the assistant header is appended); a top-level field, not a template kwarg.
    add_generation_prompt: Optional[bool] = None
    # With --reasoning-parser: reasoning_content split out of the content (separate_reasoning), and
    # streamed as it comes or in one delta once the section ends (stream_reasoning).
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    tools: Optional[list[ToolDefinition]] = None
    # Set by the chat handler once the prompt is rendered: the template opened a think section.
    _prompt_opens_reasoning: bool = PrivateAttr(False)
    # None: "auto" with tools, else "none" (OpenAI's default).
    tool_choice: Optional[ToolChoice] = None
    parallel_tool_calls: bool = True
    # SGLang: each choice carries the prompt's token ids (non-streaming responses only).
    return_prompt_token_ids: bool = False

    @property
    def effective_tool_choice(self) -> ToolChoice:
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    @model_validator(mode="after")
    def _prompt_ids_not_streamed(self) -> "ChatCompletionRequest":
        if self.return_prompt_token_ids and self.stream:
            raise RequestError(
                "return_prompt_token_ids is not supported with streaming. "
                "Please set stream=false when using return_prompt_token_ids=true.",
                param="return_prompt_token_ids",
            )
        return self

    @property
    def template_tools(self) -> Optional[list[dict[str, Any]]]:
        """The tools the chat template is given: none when tool_choice is none."""
        if not self.tools or self.effective_tool_choice == "none":
            return None
        return [tool.template_dict() for tool in self.tools]

    @model_validator(mode="after")
    def _tool_choice_fits_the_tools(self) -> "ChatCompletionRequest":
        problem = check_tool_choice(self.tools, self.effective_tool_choice)
        if problem is not None:
            raise RequestError(problem, param="tool_choice")
        return self

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

    @model_validator(mode="after")
    def _continue_needs_an_open_assistant_message(self) -> "ChatCompletionRequest":
        if not self.continue_final_message:
            return self
        if self.add_generation_prompt:  # vLLM's rule: the two ask for contradictory prompts
            raise RequestError(
                "continue_final_message and add_generation_prompt cannot both be true",
                param="continue_final_message",
            )
        if self.messages[-1].role != "assistant":
            raise RequestError(
                "continue_final_message requires the last message to be the assistant's",
                param="continue_final_message",
            )
        return self


def cache_namespace(cache_salt: Optional[str], extra_key: Optional[str]) -> Optional[str]:
    """SGLang's combination of a request's prefix-cache namespaces: the salt, then the extra key."""
    parts = [p for p in (cache_salt, extra_key) if p is not None]
    return "".join(parts) if parts else None


def _is_absent(value: Any) -> bool:
    return value is None


def _is_falsy(value: Any) -> bool:
    return not value


# field -> (accepted(value), why anything else is refused)
Unsupported = dict[str, tuple[Callable[[Any], bool], str]]

# SGLang request fields (0.5.x) this server has no machinery for. Unknown keys are otherwise
# ignored (OpenAI clients send many), so these are named here to be refused, never dropped.
_COMMON_UNSUPPORTED: Unsupported = {
    "lora_path": (_is_absent, "LoRA adapters are not implemented"),
    "return_hidden_states": (_is_falsy, "hidden states are not returned by this server"),
    "return_routed_experts": (_is_falsy, "routed experts are not returned (no MoE models)"),
    "return_cached_tokens_details": (_is_falsy, "cache tier details are not reported"),
    "return_token_ids": (_is_falsy, "token ids are not returned on the OpenAI routes; use /generate"),
    "return_meta_info": (_is_falsy, "meta_info is not returned on the OpenAI routes; use /generate"),
    "session_id": (_is_absent, "sessions are not implemented"),
    "session_params": (_is_absent, "sessions are not implemented"),
    "bootstrap_host": (_is_absent, "prefill/decode disaggregation is not implemented"),
    "bootstrap_port": (_is_absent, "prefill/decode disaggregation is not implemented"),
    "bootstrap_room": (_is_absent, "prefill/decode disaggregation is not implemented"),
    "data_parallel_rank": (_is_absent, "data parallelism is not implemented"),
    "routed_dp_rank": (_is_absent, "data parallelism is not implemented"),
    "disagg_prefill_dp_rank": (_is_absent, "data parallelism is not implemented"),
    "images_config": (_is_absent, "image inputs are not implemented"),
    "ngram_corpus_id": (_is_absent, "n-gram speculative decoding is not implemented"),
    "custom_labels": (_is_absent, "custom metric labels are not implemented"),
}

CHAT_UNSUPPORTED: Unsupported = {
    **_COMMON_UNSUPPORTED,
    "functions": (_is_falsy, "the deprecated functions field is not implemented; use tools"),
    "function_call": (lambda v: v in (None, "none"), "function calling is not implemented; use tools and tool_choice"),
    "audio": (_is_absent, "audio output is not implemented"),
    "modalities": (lambda v: v in (None, ["text"]), "only the 'text' modality is implemented"),
    "prediction": (_is_absent, "predicted outputs are not implemented"),
    "web_search_options": (_is_absent, "web search is not implemented"),
    "reasoning_effort": (_is_absent, "reasoning effort control is not implemented"),
    "verbosity": (_is_absent, "verbosity control is not implemented"),
    "store": (_is_falsy, "completions are not stored by this server"),
    "reasoning": (_is_absent, "reasoning controls are not implemented"),
    "input_ids": (_is_absent, "pre-tokenized chat prompts are not implemented; use /v1/completions"),
    "task": (_is_absent, "DeepSeek quick-instruction tasks are not implemented"),
    "max_dynamic_patch": (_is_absent, "image inputs are not implemented"),
    "min_dynamic_patch": (_is_absent, "image inputs are not implemented"),
    "use_audio_in_video": (_is_falsy, "audio inputs are not implemented"),
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


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)
    # SGLang's field, and OpenAI's place for it (completion_tokens_details, only when nonzero).
    reasoning_tokens: int = 0
    completion_tokens_details: Optional[CompletionTokensDetails] = None


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
    content: Optional[str]
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[ToolCallOut]] = None

    @model_serializer
    def _without_absent_calls(self) -> dict[str, Any]:
        # reasoning_content is always sent (null where empty); tool_calls only when there are some.
        out = {"role": self.role, "content": self.content, "reasoning_content": self.reasoning_content}
        if self.tool_calls:
            out["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        return out


class ChatCompletionChoice(_ChoiceEnd):
    index: int
    message: AssistantMessage
    logprobs: Optional[ChatLogprobs] = None
    prompt_token_ids: Optional[list[int]] = None  # SGLang's return_prompt_token_ids

    @model_serializer(mode="wrap")
    def _without_absent_prompt_ids(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        if self.prompt_token_ids is None:
            out.pop("prompt_token_ids", None)
        return out


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
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[ToolCallOut]] = None

    @model_serializer
    def _only_set(self) -> dict[str, Any]:
        # A delta carries what changed: role once, then content and tool calls; reasoning_content
        # is always there (null where empty), as SGLang's deltas carry it.
        out: dict[str, Any] = {k: v for k, v in (("role", self.role), ("content", self.content)) if v is not None}
        out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        return out


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


# ----------------------------------------------------------------------------- /v1/score


class ScoringRequest(_Strict):
    """SGLang's scoring request: query and items both text, or both token ids."""

    model_config = ConfigDict(extra="forbid")  # not an OpenAI route: a misspelt field is named

    query: Union[str, list[int]]
    items: Union[str, list[str], list[list[int]]]
    label_token_ids: list[int] = Field(min_length=1)
    apply_softmax: bool = False
    item_first: bool = False
    model: Optional[str] = None

    @model_validator(mode="after")
    def _same_kind(self) -> "ScoringRequest":
        if not self.item_list():
            raise RequestError("items must not be empty", param="items")
        text_query = isinstance(self.query, str)
        if any(isinstance(item, str) != text_query for item in self.item_list()):
            kind = "strings" if text_query else "lists of token ids"
            raise RequestError(f"items must be {kind}, like query", param="items")
        return self

    def item_list(self) -> list[Union[str, list[int]]]:
        return [self.items] if isinstance(self.items, str) else list(self.items)


class ScoringResponse(BaseModel):
    scores: list[list[float]]  # per item, one probability per label_token_ids entry, in order
    model: str
    usage: Optional[UsageInfo] = None
    object: Literal["scoring"] = "scoring"


# ----------------------------------------------------------------------------- /v1/responses


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
