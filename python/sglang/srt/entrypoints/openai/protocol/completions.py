"""/v1/completions: the request, the fields it refuses, and the response and stream chunk."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, Field, field_validator

from sglang.srt.entrypoints.openai.protocol.common import (
    _COMMON_UNSUPPORTED,
    Unsupported,
    UsageInfo,
    _ChoiceEnd,
    _is_falsy,
    _now,
)
from sglang.srt.entrypoints.openai.protocol.generation import _GenerationRequest

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


COMPLETION_UNSUPPORTED: Unsupported = {
    **_COMMON_UNSUPPORTED,
    "suffix": (_is_falsy, "suffix (insertion) is not implemented"),
    "best_of": (lambda v: v in (None, 1), "best_of > 1 is not implemented; use n"),
}


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    top_logprobs: Optional[list[Optional[dict[str, Optional[float]]]]] = None
    text_offset: list[int] = Field(default_factory=list)


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
