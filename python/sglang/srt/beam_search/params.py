"""The request combinations beam search refuses (HTTP 400 naming beam_width), checked on the
params alone: those SGLang refuses, except grammars, stop strings / stop_regex and
min_new_tokens, which beams here honour (docs/sampling.md)."""

from __future__ import annotations

from typing import Any


def verify_beam_params(params: Any, vocab_size: int) -> None:
    """Raise ValueError for a beam_width > 1 request this server cannot search."""
    k = params.beam_width
    if params.n > k:
        raise ValueError(f"n ({params.n}) cannot exceed beam_width ({k}): n is the number of beams returned.")
    if 2 * k > vocab_size:
        raise ValueError(f"beam_width ({k}) is too large for the vocabulary of {vocab_size} tokens.")
    if params.max_new_tokens is not None and params.max_new_tokens < 1:
        raise ValueError(f"beam_width ({k}) needs max_new_tokens of at least 1, got {params.max_new_tokens}.")
    if getattr(params, "guidance", None) is not None:
        raise ValueError("beam_width > 1 does not support guidance.")
    if getattr(params, "watermark", None) is not None:
        raise ValueError("beam_width > 1 does not support watermark (beams are selected, not drawn).")


def verify_beam_request(params: Any, return_logprob: bool, input_len: int, max_running: int, max_total_tokens: int) -> None:
    """The request-level fields beam search refuses, and the widths this server cannot hold."""
    k = params.beam_width or 1
    if k <= 1:
        return
    if return_logprob:
        raise ValueError("beam_width > 1 does not support return_logprob.")
    if k > max_running:
        raise ValueError(f"beam_width ({k}) needs {k} request slots; this server runs at most {max_running} requests at once.")
    if params.max_new_tokens is not None and input_len + k * params.max_new_tokens > max_total_tokens:
        need = input_len + k * params.max_new_tokens
        raise ValueError(f"beam_width ({k}) needs up to {need} KV-cache tokens; the server holds {max_total_tokens}.")
