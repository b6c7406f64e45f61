"""/v1/chat/completions: messages, the request, the fields it refuses, and the response and deltas."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, Field, PrivateAttr, field_validator, model_serializer, model_validator

from sglang.srt.entrypoints.openai.protocol.common import (
    _COMMON_UNSUPPORTED,
    RequestError,
    Unsupported,
    UsageInfo,
    _ChoiceEnd,
    _is_absent,
    _is_falsy,
    _now,
)
from sglang.srt.entrypoints.openai.protocol.generation import _GenerationRequest
from sglang.srt.entrypoints.openai.protocol_base import _Nested
from sglang.srt.entrypoints.openai.tool_protocol import (
    RequestToolCall,
    ToolCallOut,
    ToolChoice,
    ToolDefinition,
    check_tool_choice,
)

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


class TopLogprob(BaseModel):
    token: str
    bytes: list[int]
    logprob: Optional[float]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] = Field(default_factory=list)


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
