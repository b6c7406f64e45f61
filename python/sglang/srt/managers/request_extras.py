"""SGLang's per-request fields beyond sampling: the returned sampling information
(return_sampling_mask, sampling_logprobs_mode, return_entropy, return_prompt_token_ids), the
scheduling priority and the thinking budget (max_thinking_tokens). Each is checked in the
tokenizer manager (a ValueError naming the field, HTTP 400) before anything is queued."""

from __future__ import annotations

import sys
from typing import Any, Optional

from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.sampling_report_out import SAMPLING_LOGPROBS_MODES
from sglang.srt.sampling.sampling_params import TOP_K_ALL, SamplingParams

PRIORITY_RANGE = (-(1 << 63), (1 << 63) - 1)  # SGLang's signed 64-bit priorities
PRIORITY_DISABLED_MESSAGE = "Using priority is disabled for this server. Please send a new request without a priority."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_extras(obj: GenerateReqInput, params: SamplingParams, server_args: Any, has_tokenizer: bool) -> None:
    """Check the fields and fold max_thinking_tokens into `params` (the thinking-budget processor)."""
    for name in ("return_sampling_mask", "return_entropy", "return_prompt_token_ids", "require_reasoning"):
        if not isinstance(getattr(obj, name), bool):
            raise ValueError(f"{name} must be a boolean, got {getattr(obj, name)!r}.")
    _check_sampling_mask(obj, params, server_args.sampling_mask_max_tokens)
    _check_priority(obj.priority)
    budget = obj.max_thinking_tokens
    if budget is not None:
        if not (_is_int(budget) and budget >= 0):
            raise ValueError(f"max_thinking_tokens must be a non-negative integer, got {budget!r}.")
        if not has_tokenizer:
            raise ValueError("max_thinking_tokens needs the tokenizer to find the think markers, which --skip-tokenizer-init leaves unloaded.")
        params.thinking_token_budget = budget


def _check_sampling_mask(obj: GenerateReqInput, params: SamplingParams, max_tokens: int) -> None:
    mode = obj.sampling_logprobs_mode
    if mode is not None and mode not in SAMPLING_LOGPROBS_MODES:
        raise ValueError(f"sampling_logprobs_mode must be one of {', '.join(SAMPLING_LOGPROBS_MODES)}, got {mode!r}.")
    if mode is not None and not obj.return_sampling_mask:
        raise ValueError("sampling_logprobs_mode can only be set when return_sampling_mask=true.")
    top_k = params.top_k
    if obj.return_sampling_mask and top_k != 1 and not 1 < top_k <= max_tokens:
        shown = -1 if top_k >= TOP_K_ALL else top_k  # -1 normalises to TOP_K_ALL
        raise ValueError(
            f"return_sampling_mask requires top_k=1 for greedy sampling or finite 1 < top_k <= {max_tokens}; "
            f"got top_k={shown}. Lower top_k or increase --sampling-mask-max-tokens."
        )


def _check_priority(priority: Any) -> None:
    if priority is None:
        return
    low, high = PRIORITY_RANGE
    if not (_is_int(priority) and low <= priority <= high):
        raise ValueError(f"priority must be a signed 64-bit integer between {low} and {high}, got {priority!r}.")


def message_fields(obj: GenerateReqInput, server_args: Any) -> dict[str, Any]:
    """The scheduler message's fields for a checked request's sampling report, prompt ids, priority
    and reasoning start."""
    return {
        "return_sampling_mask": obj.return_sampling_mask,
        "sampling_logprobs_mode": obj.sampling_logprobs_mode or "selected",
        "return_entropy": obj.return_entropy,
        "return_prompt_token_ids": obj.return_prompt_token_ids,
        "priority": resolved_priority(obj.priority, server_args),
        "require_reasoning": obj.require_reasoning,
    }


def priority_refused(priority: Optional[int], server_args: Any) -> bool:
    """A priority sent to a server without priority scheduling that refuses them
    (--abort-on-priority-when-disabled; SGLang answers 503); otherwise such a priority is ignored."""
    return priority is not None and not server_args.enable_priority_scheduling and server_args.abort_on_priority_when_disabled


def resolved_priority(priority: Optional[int], server_args: Any) -> Optional[int]:
    """The priority the scheduler orders by: the request's, else --default-priority-value, else the
    lowest (last admitted); None without --enable-priority-scheduling."""
    if not server_args.enable_priority_scheduling:
        return None
    if priority is not None:
        return priority
    if server_args.default_priority_value is not None:
        return server_args.default_priority_value
    return sys.maxsize if server_args.schedule_low_priority_values_first else -sys.maxsize - 1


def priority_sign(server_args: Any) -> Optional[int]:
    """Sort-key sign of a priority (smaller keys first); None without priority scheduling."""
    if not server_args.enable_priority_scheduling:
        return None
    return 1 if server_args.schedule_low_priority_values_first else -1
