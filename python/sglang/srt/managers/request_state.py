"""The tokenizer manager's state of a running request (one ReqState per child) and the result
dicts built from it: cumulative text, output ids, logprob lists and meta_info."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from sglang.srt.managers.io_struct import StrOut
from sglang.srt.managers.reasoning_tokens import count_reasoning_tokens

TokenText = Callable[[int], Optional[str]]  # a token id -> its text (None without a tokenizer)


@dataclass
class ReqGroup:
    """The children of one request share an event, so one waiter serves all of them."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    children: list["ReqState"] = field(default_factory=list)

    def unfinished(self) -> list["ReqState"]:
        return [c for c in self.children if c.finished_reason is None]


@dataclass
class ReqState:
    rid: str
    index: int
    group: ReqGroup
    stream: bool
    return_logprob: bool
    want_top: bool
    want_token_ids: bool
    text_in_logprobs: bool
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    finished_reason: Optional[dict[str, Any]] = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    sampling_seed: Optional[int] = None
    logprobs: dict[str, list[Any]] = field(default_factory=dict)
    dirty: bool = False
    streamed_ids: int = 0  # output ids already sent in chunks (--stream-output)
    created_at: float = field(default_factory=time.perf_counter)
    last_token_at: Optional[float] = None  # when output ids last arrived (--enable-metrics)
    # Set when the request counts its reasoning tokens (require_reasoning); [] without a parser.
    think_end_ids: Optional[list[int]] = None


def append_logprobs(state: ReqState, out: StrOut, token_text: TokenText) -> None:
    """Extend the state's logprob lists with a result's rows, as [logprob, token_id, text] triples."""
    token, with_text = out.token, state.text_in_logprobs
    lists = {
        "input_token_logprobs": (token.input_token_logprobs, True, _pair_rows),
        "output_token_logprobs": (token.output_token_logprobs, True, _pair_rows),
        "input_top_logprobs": (token.input_top_logprobs, state.want_top, _nested_rows),
        "output_top_logprobs": (token.output_top_logprobs, state.want_top, _nested_rows),
        "input_token_ids_logprobs": (token.input_token_ids_logprobs, state.want_token_ids, _nested_rows),
        "output_token_ids_logprobs": (token.output_token_ids_logprobs, state.want_token_ids, _nested_rows),
    }
    text = token_text if with_text else None
    for key, (rows, wanted, convert) in lists.items():
        if wanted:
            state.logprobs.setdefault(key, []).extend(convert(rows or [], text))


def _pair_rows(pairs: list[list[Any]], token_text: Optional[TokenText]) -> list[list[Any]]:
    """[logprob, token_id] pairs -> [logprob, token_id, text_or_null] triples."""
    return [[lp, tid, token_text(tid) if token_text is not None else None] for lp, tid in pairs]


def _nested_rows(rows: list[Optional[list[list[Any]]]], token_text: Optional[TokenText]) -> list[Any]:
    return [None if row is None else _pair_rows(row, token_text) for row in rows]


def snapshot(state: ReqState, indexed: bool, with_text: bool, delta_ids: bool) -> dict[str, Any]:
    """The state as a result dict (copies: the state keeps growing after the dict is handed out).

    with_text: SGLang's token-only responses (--skip-tokenizer-init) have no "text".
    delta_ids: a streamed chunk carries only the ids new since the previous one (--stream-output).
    """
    meta: dict[str, Any] = {
        "id": state.rid,
        "finish_reason": state.finished_reason,
        "prompt_tokens": state.prompt_tokens,
        "completion_tokens": state.completion_tokens,
        "cached_tokens": state.cached_tokens,
    }
    if state.think_end_ids is not None:
        meta["reasoning_tokens"] = count_reasoning_tokens(state.output_ids, state.think_end_ids)
    meta.update({key: list(rows) for key, rows in state.logprobs.items()})
    if state.sampling_seed is not None:
        meta["sampling_seed"] = state.sampling_seed
    out: dict[str, Any] = {}
    if with_text:
        out["text"] = state.text
    if delta_ids and state.stream:
        out["output_ids"] = state.output_ids[state.streamed_ids :]
        state.streamed_ids = len(state.output_ids)
    else:
        out["output_ids"] = list(state.output_ids)
    out["meta_info"] = meta
    if indexed:
        out["index"] = state.index
    return out
