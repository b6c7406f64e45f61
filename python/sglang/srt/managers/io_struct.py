"""Messages between the processes, as msgspec structs encoded with msgpack (never pickle).

TokenizerManager --(TokenizedGenerateReqInput | AbortReq | FlushCacheReq | GetLoadReq)--> Scheduler (rank 0)
Scheduler --BatchTokenOut (+ SchedulerLoad)--> DetokenizerManager --BatchStrOut--> TokenizerManager
(the DetokenizerManager in a process of its own, or inline in the TokenizerManager's: --detokenizer-mode)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import msgspec

from sglang.srt.beam_search.types import BeamSequence


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
    # SGLang's returned sampling information (managers/sampling_report_out.py).
    return_sampling_mask: bool = False
    sampling_logprobs_mode: Optional[str] = None  # "selected" (default) or "support"
    return_entropy: bool = False
    return_prompt_token_ids: bool = False
    # SGLang's scheduling and reasoning fields (managers/request_extras.py).
    priority: Optional[int] = None
    max_thinking_tokens: Optional[int] = None
    # SGLang's top-level form of sampling_params.watermark (one of the two, not both).
    watermark: Any = None
    # The output starts in a reasoning section: meta_info.reasoning_tokens counts it
    # (managers/reasoning_tokens) and, with --reasoning-parser, a grammar applies after it.
    require_reasoning: bool = False


class TokenizedGenerateReqInput(msgspec.Struct, tag=True):
    rid: str
    input_ids: list[int]
    # SamplingParams.to_message() of params the tokenizer manager has normalized and verified:
    # the scheduler rebuilds them (SamplingParams.from_message) without normalizing again.
    sampling_params: dict[str, Any]
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    token_ids_logprob: Optional[list[int]] = None
    custom_logit_processor: Optional[str] = None
    stream: bool = False
    extra_key: Optional[str] = None
    # The results endpoint of the tokenizer worker that sent it (--tokenizer-worker-num > 1).
    http_worker_ipc: Optional[str] = None
    return_sampling_mask: bool = False
    sampling_logprobs_mode: str = "selected"
    return_entropy: bool = False
    return_prompt_token_ids: bool = False  # read by the tokenizer manager only
    priority: Optional[int] = None  # None: the server's default (--default-priority-value)
    require_reasoning: bool = False  # the grammar applies after the think-end marker (constrained/reasoning_gate.py)


# err_type of an abort finish_reason for --max-queued-requests refusals (HTTP 503) and for the
# requests of a failed scheduler step (500).
QUEUE_FULL = "QueueFull"
STEP_ERROR = "StepError"


class AbortReq(msgspec.Struct, tag=True):
    rid: str
    abort_all: bool = False  # every request the scheduler holds, whichever worker sent it


class FlushCacheReq(msgspec.Struct, tag=True):
    """Empty the prefix cache (sent only while no request runs)."""


class GetLoadReq(msgspec.Struct, tag=True):
    """Ask scheduler rank 0 for a SchedulerLoad; it comes back with the results (BatchTokenOut.load)."""

    req_id: int
    http_worker_ipc: Optional[str] = None  # where the answer goes (see TokenizedGenerateReqInput)


SchedulerInput = Union[TokenizedGenerateReqInput, AbortReq, FlushCacheReq, GetLoadReq]


class SchedulerLoad(msgspec.Struct):
    """The scheduler's live state (/get_server_info, /metrics). Idle means num_running_reqs ==
    num_queue_reqs == 0, req_slots_free == req_slots_total and num_used_tokens == 0, i.e.
    num_free_tokens + num_evictable_tokens == max_total_num_tokens: every KV slot is free or
    holds a cached prefix that no request uses."""

    req_id: int
    num_running_reqs: int  # admitted and not yet released (running, prefilling, finishing)
    num_queue_reqs: int  # waiting for admission, grammar compiles included
    req_slots_free: int
    req_slots_total: int
    max_total_num_tokens: int
    num_free_tokens: int
    num_evictable_tokens: int  # cached prefixes no request holds
    num_used_tokens: int  # held by requests: max_total - free - evictable
    token_usage: float  # num_used_tokens / max_total_num_tokens (SGLang's token usage)
    num_steps: int
    num_failed_steps: int
    # Step time (scheduler submit -> result read) histogram: cumulative counts per upper bound.
    step_time_buckets: list[float]
    step_time_counts: list[int]
    step_time_sum: float
    # SGLang's scheduler gauges: requests waiting for a grammar compile (also in num_queue_reqs),
    # decode tokens/s over the last --decode-log-interval steps, and the cached share of the last
    # prefill step's prompt tokens.
    num_grammar_queue_reqs: int = 0
    gen_throughput: float = 0.0
    cache_hit_rate: float = 0.0


def sum_loads(loads: list[SchedulerLoad]) -> SchedulerLoad:
    """One server's load from its --dp-size replicas' answers to one query: counts add up, the
    step-time histograms (same bounds everywhere) add bucket by bucket."""
    first = loads[0]
    totals = {
        name: sum(getattr(load, name) for load in loads)
        for name in ("num_running_reqs", "num_queue_reqs", "req_slots_free", "req_slots_total", "max_total_num_tokens",
                     "num_free_tokens", "num_evictable_tokens", "num_used_tokens", "num_steps", "num_failed_steps",
                     "step_time_sum", "num_grammar_queue_reqs", "gen_throughput")
    }
    return SchedulerLoad(
        req_id=first.req_id,
        token_usage=totals["num_used_tokens"] / max(1, totals["max_total_num_tokens"]),
        step_time_buckets=first.step_time_buckets,
        step_time_counts=[sum(counts) for counts in zip(*(load.step_time_counts for load in loads))],
        cache_hit_rate=sum(load.cache_hit_rate for load in loads) / len(loads),
        **totals,
    )


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
    # Sampling reports of the new tokens, only for requests that asked (return_sampling_mask: ids
    # per token, and per token a logprob or one per id; return_entropy: a float per token).
    output_token_sampling_mask: Optional[list[list[int]]] = None
    output_token_sampling_logprobs: Optional[list[Any]] = None
    output_token_entropy_val: Optional[list[float]] = None
    # The text that triggered a stop-string / stop-regex finish, for trimming the output.
    matched_text: Optional[str] = None
    # A streamed request's stop strings, on its first message (unless no_stop_trim): the
    # detokenizer holds back a text tail that may be the start of one.
    stop_strs: Optional[list[str]] = None
    # A finished beam-search request: its n best beams, best first (new_output_ids is the first).
    beam_results: Optional[list[BeamSequence]] = None
    # Mixture guidance (sampling_params.guidance): the alpha of each new token.
    guidance_alpha: Optional[list[float]] = None
    # Speculative decoding: verify steps so far, draft tokens proposed and accepted.
    spec_verify_ct: int = 0
    spec_accept_token_num: int = 0
    spec_draft_token_num: int = 0
    # Times priority preemption retracted the request (SGLang's meta_info "num_retractions").
    num_retractions: int = 0


class BatchTokenOut(msgspec.Struct):
    outs: list[TokenOut]
    load: Optional[SchedulerLoad] = None  # the answer to a GetLoadReq
    # The tokenizer worker every out (and the load) belongs to; the detokenizer forwards there.
    http_worker_ipc: Optional[str] = None


class StrOut(msgspec.Struct):
    """TokenOut plus the text the new tokens add (detokenizer -> tokenizer manager).

    The detokenizer owns stop trimming: while streaming it holds back a tail that may be the
    start of a stop string, and the final message's text is trimmed at a matched stop string or
    regex match unless no_stop_trim was set. When that trim reaches into text already sent (a
    stop_regex match is not held back), `text` is the request's whole text, replacing it.
    """

    token: TokenOut
    new_text: str
    text: Optional[str] = None


class BatchStrOut(msgspec.Struct):
    outs: list[StrOut]
    load: Optional[SchedulerLoad] = None  # passed through from BatchTokenOut


class SchedulerReady(msgspec.Struct):
    """Sent once by scheduler rank 0 to the launcher when the model is loaded."""

    vocab_size: int
    context_len: int
    max_total_num_tokens: int
    max_running_requests: int
    eos_token_ids: list[int]
    model_path: str


def replicas_ready(messages: Sequence[SchedulerReady]) -> SchedulerReady:
    """The server's facts from its --dp-size replicas' ready messages (dp rank order): replica 0's,
    with max_total_num_tokens the KV capacity of all replicas together (what /get_server_info
    reports at its top level)."""
    return msgspec.structs.replace(messages[0], max_total_num_tokens=sum(m.max_total_num_tokens for m in messages))


class ReplicaLoad(msgspec.Struct):
    """Scheduler rank 0 of replica dp_rank -> the data-parallel controller (or, with one replica,
    the HTTP process): SGLang's /get_load fields, and the count the controller's in-transit
    estimate needs."""

    dp_rank: int
    num_reqs: int  # running and waiting
    num_waiting_reqs: int
    num_tokens: int  # KV tokens held by requests, plus the prompt tokens of waiting ones
    num_reqs_received: int  # generate requests received since start


_encoder = msgspec.msgpack.Encoder()


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decoder(kind: Any) -> msgspec.msgpack.Decoder:
    """A reusable decoder for one message type (or a tagged Union)."""
    return msgspec.msgpack.Decoder(kind)
