"""Types every OpenAI route shares: limits, the 400 error, usage, refusal tables, the model card."""

from __future__ import annotations

import time
from typing import Any, Callable, Literal, Optional, Union

from pydantic import BaseModel, Field

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


class RequestError(ValueError):
    """A request the server refuses before any generation starts (HTTP 400); names the field."""

    def __init__(self, message: str, param: Optional[str] = None) -> None:
        super().__init__(message)
        self.param = param


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


def _now() -> int:
    return int(time.time())


class _ChoiceEnd(BaseModel):
    # The native finish type ("stop" | "length" | "abort") and what matched a stop.
    finish_reason: Optional[str] = None
    matched_stop: Union[int, str, None] = None


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
