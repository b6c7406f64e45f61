"""Messages between the processes, as msgspec structs encoded with msgpack (never pickle).

TokenizerManager --(TokenizedGenerateReqInput | AbortReq | FlushCacheReq)--> Scheduler (rank 0)
Scheduler --BatchTokenOut--> DetokenizerManager --BatchStrOut--> TokenizerManager
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

import msgspec


@dataclass
class GenerateReqInput:
    """One request as the HTTP layer hands it to TokenizerManager.generate_request.

    Native /generate batches and OpenAI requests are split into these before they reach the
    tokenizer manager; `sampling_params` is the raw JSON dict (validated there).
    """

    text: Optional[str] = None
    input_ids: Optional[list[int]] = None
    sampling_params: dict[str, Any] = field(default_factory=dict)
    rid: Optional[str] = None
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    token_ids_logprob: Optional[list[int]] = None
    return_text_in_logprobs: bool = False
    custom_logit_processor: Optional[str] = None
    # SGLang's prefix-cache namespace: requests share cached prefixes only with the same key.
    extra_key: Optional[str] = None


class TokenizedGenerateReqInput(msgspec.Struct, tag=True):
    rid: str
    input_ids: list[int]
    # SamplingParams.to_dict() of params the tokenizer manager has normalized and verified.
    sampling_params: dict[str, Any]
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    token_ids_logprob: Optional[list[int]] = None
    custom_logit_processor: Optional[str] = None
    stream: bool = False
    extra_key: Optional[str] = None


class AbortReq(msgspec.Struct, tag=True):
    rid: str


class FlushCacheReq(msgspec.Struct, tag=True):
    """Empty the prefix cache (sent only while no request runs)."""


SchedulerInput = Union[TokenizedGenerateReqInput, AbortReq, FlushCacheReq]


class TokenOut(msgspec.Struct):
    """What one request gained in one scheduler step (scheduler -> detokenizer)."""

    rid: str
    new_output_ids: list[int]
    # None while running; {"type": "stop", "matched": int | str} | {"type": "length", "length": n}
    # | {"type": "abort", "message": str, "status_code": int, "err_type": str}
    finished_reason: Optional[dict[str, Any]]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    # Logprobs of the new tokens, only for requests that asked: [logprob, token_id] pairs.
    output_token_logprobs: Optional[list[list[Any]]] = None
    output_top_logprobs: Optional[list[list[list[Any]]]] = None  # per new token, its top-k pairs
    output_token_ids_logprobs: Optional[list[list[list[Any]]]] = None  # per new token, the asked ids
    # Prompt logprobs, sent once with the first output (first position's logprob is None).
    input_token_logprobs: Optional[list[list[Any]]] = None
    input_top_logprobs: Optional[list[Optional[list[list[Any]]]]] = None
    input_token_ids_logprobs: Optional[list[Optional[list[list[Any]]]]] = None
    # The text that triggered a stop-string / stop-regex finish, for trimming the output.
    matched_text: Optional[str] = None


class BatchTokenOut(msgspec.Struct):
    outs: list[TokenOut]


class StrOut(msgspec.Struct):
    """TokenOut plus the text the new tokens add (detokenizer -> tokenizer manager).

    On the final message the text is already trimmed at a matched stop string unless
    no_stop_trim was set.
    """

    token: TokenOut
    new_text: str


class BatchStrOut(msgspec.Struct):
    outs: list[StrOut]


class SchedulerReady(msgspec.Struct):
    """Sent once by scheduler rank 0 to the launcher when the model is loaded."""

    vocab_size: int
    context_len: int
    max_total_num_tokens: int
    max_running_requests: int
    eos_token_ids: list[int]
    model_path: str


_encoder = msgspec.msgpack.Encoder()


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decoder(kind: Any) -> msgspec.msgpack.Decoder:
    """A reusable decoder for one message type (or a tagged Union)."""
    return msgspec.msgpack.Decoder(kind)
