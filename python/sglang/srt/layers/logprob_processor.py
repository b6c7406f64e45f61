"""Logprobs returned to clients: which distribution, and the sampled / top-k / token-id gathers.

Modes (per server, never per batch, so a row's logprobs never depend on its batch-mates):
  scaled     log_softmax(processed logits / temperature)   SGLang's default
  raw        log_softmax(processed logits)                  SGLANG_RETURN_ORIGINAL_LOGPROB=1
  processed  the scaled distribution restricted to the top-k / top-p / min-p support and
             renormalised (what the token was actually drawn from)
"processed logits" means after penalties, logit_bias, masks and custom processors.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

import torch

LOGPROBS_MODES = ("scaled", "raw", "processed")


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def default_logprobs_mode() -> str:
    """`raw` when SGLANG_RETURN_ORIGINAL_LOGPROB is set, else SGLANG_LOGPROBS_MODE, else `scaled`."""
    if _env_true("SGLANG_RETURN_ORIGINAL_LOGPROB"):
        return "raw"
    mode = os.environ.get("SGLANG_LOGPROBS_MODE", "scaled").strip().lower()
    if mode not in LOGPROBS_MODES:
        raise ValueError(f"SGLANG_LOGPROBS_MODE must be one of {', '.join(LOGPROBS_MODES)}, got {mode!r}.")
    return mode


def clamped_log_softmax(values: torch.Tensor) -> torch.Tensor:
    """log_softmax in float32 with -inf clamped to the dtype minimum, so no -inf leaves the server."""
    logprobs = torch.log_softmax(values.float(), dim=-1)
    return logprobs.clamp_(min=torch.finfo(logprobs.dtype).min)


def fill_logprobs(
    output,
    logprobs: torch.Tensor,
    next_token_ids: Optional[torch.Tensor],
    top_logprobs_nums: Optional[list[int]],
    token_ids_logprobs: Optional[list[Optional[list[int]]]],
) -> None:
    """Gather what was asked for from `logprobs` ([B, V]) onto `output` (a LogitsProcessorOutput).

    Sets `next_token_logprobs` [B]; `next_token_top_logprobs_val/idx` [B, max_k] (row i uses its
    first top_logprobs_nums[i] columns); `next_token_token_ids_logprobs_val` [B, L] with
    `next_token_token_ids_logprobs_idx` the requested id lists (row i uses its first len(ids) columns).
    """
    if next_token_ids is not None:
        # Flagged rows carry id -1; their logprob is meaningless and read from column 0.
        safe_ids = next_token_ids.clamp(min=0).unsqueeze(1)
        output.next_token_logprobs = logprobs.gather(1, safe_ids).squeeze(1)
    max_k = max(top_logprobs_nums or [0])
    if max_k > 0:
        values, indices = torch.topk(logprobs, min(max_k, logprobs.shape[1]), dim=-1)
        output.next_token_top_logprobs_val = values
        output.next_token_top_logprobs_idx = indices
    fill_token_ids_logprobs(output, token_ids_logprobs, logprobs.device, lambda index: logprobs.gather(1, index))


def fill_token_ids_logprobs(
    output,
    token_ids_logprobs: Optional[list[Optional[list[int]]]],
    device: torch.device,
    gather: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    """Set `next_token_token_ids_logprobs_val` to `gather(index)` ([B, L] float32) for the requested
    ids as index ([B, L] int64; row i's first len(ids) columns, padded with id 0), and `_idx` to the
    id lists; nothing when no row asks for any."""
    if token_ids_logprobs is None or not any(ids for ids in token_ids_logprobs):
        return
    width = max(len(ids or ()) for ids in token_ids_logprobs)
    padded = [list(ids or ()) + [0] * (width - len(ids or ())) for ids in token_ids_logprobs]
    output.next_token_token_ids_logprobs_val = gather(torch.tensor(padded, dtype=torch.int64, device=device))
    output.next_token_token_ids_logprobs_idx = [list(ids or ()) for ids in token_ids_logprobs]
