"""The request fields /v1/completions and /v1/chat/completions share."""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import ConfigDict, Field, StrictInt, field_validator, model_validator

from sglang.srt.entrypoints.openai.protocol.common import MAX_N, SEED_MAX, SEED_MIN, RequestError, cache_namespace
from sglang.srt.entrypoints.openai.protocol.formats import (
    GRAMMAR_PARAMS,
    RESPONSE_FORMAT_TYPES,
    Grammar,
    ResponseFormat,
    _check_format_type,
)
from sglang.srt.entrypoints.openai.protocol_base import _Nested, _Strict

class StreamOptions(_Nested):
    include_usage: bool = False
    # With include_usage: every chunk also carries the usage of its choice so far (vLLM's and
    # SGLang's extension).
    continuous_usage_stats: bool = False
    # Random padding OpenAI adds against size side channels; carries no content, so a
    # server without it answers the same tokens.
    include_obfuscation: bool = False


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
