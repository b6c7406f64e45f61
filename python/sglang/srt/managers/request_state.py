"""The tokenizer manager's state of a running request (one ReqState per child) and the result
dicts built from it: cumulative text, output ids, logprob lists and meta_info."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from sglang.srt.beam_search.types import BeamSequence
from sglang.srt.managers.io_struct import StrOut, TokenizedGenerateReqInput
from sglang.srt.managers.sampling_report_out import accumulate, meta_fields
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
    num_retractions: int = 0  # times priority preemption retracted it
    spec_counts: tuple[int, int, int] = (0, 0, 0)  # speculative verify steps, accepted and proposed drafts
    sampling_seed: Optional[int] = None
    logprobs: dict[str, list[Any]] = field(default_factory=dict)
    guidance_alpha: Optional[list[float]] = None  # mixture guidance: one alpha per output token
    reports: dict[str, list[Any]] = field(default_factory=dict)  # sampling masks / entropy (sampling_report_out)
    prompt_token_ids: Optional[list[int]] = None  # return_prompt_token_ids
    dirty: bool = False
    streamed_ids: int = 0  # output ids already sent in chunks (--stream-output)
    created_at: float = field(default_factory=time.perf_counter)
    last_token_at: Optional[float] = None  # when output ids last arrived (--enable-metrics)
    beam_results: Optional[list[BeamSequence]] = None  # a finished beam search's returned beams
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
        "num_retractions": state.num_retractions,
    }
    meta.update(spec_meta(state.spec_counts, state.completion_tokens))
    if state.think_end_ids is not None:
        meta["reasoning_tokens"] = count_reasoning_tokens(state.output_ids, state.think_end_ids)
    meta.update({key: list(rows) for key, rows in state.logprobs.items()})
    meta.update(meta_fields(state.reports))
    if state.sampling_seed is not None:
        meta["sampling_seed"] = state.sampling_seed
    if state.guidance_alpha is not None:
        meta["guidance_alpha"] = list(state.guidance_alpha)
    out: dict[str, Any] = {}
    if with_text:
        out["text"] = state.text
    if delta_ids and state.stream:
        out["output_ids"] = state.output_ids[state.streamed_ids :]
        state.streamed_ids = len(state.output_ids)
    else:
        out["output_ids"] = list(state.output_ids)
    if state.beam_results:
        meta = beam_meta_info(meta, state.beam_results, with_text)
    if state.prompt_token_ids is not None:
        out["prompt_token_ids"] = list(state.prompt_token_ids)
    out["meta_info"] = meta
    if indexed:
        out["index"] = state.index
    return out


def beam_meta_info(meta: dict[str, Any], beams: list[BeamSequence], with_text: bool) -> dict[str, Any]:
    """SGLang's beam response: the best beam's meta_info (with its sequence_score) at the top,
    and under "beam_results" every returned beam as {text, output_ids, meta_info}, best first;
    the first beam's meta_info is the full one, the others carry finish_reason and score."""
    results = []
    for i, beam in enumerate(beams):
        beam_meta = dict(meta) if i == 0 else {}
        beam_meta["finish_reason"] = beam.finish_reason
        beam_meta["sequence_score"] = beam.sequence_score
        entry: dict[str, Any] = {"text": beam.text or ""} if with_text else {}
        entry["output_ids"] = list(beam.output_ids)
        entry["meta_info"] = beam_meta
        results.append(entry)
    top = dict(results[0]["meta_info"])
    top["beam_results"] = results
    return top


def spec_meta(counts: tuple[int, int, int], completion_tokens: int) -> dict[str, Any]:
    """SGLang's speculative meta_info of a request that ran verify steps (none without)."""
    verify_ct, accepted, proposed = counts
    if verify_ct == 0:
        return {}
    return {
        "spec_verify_ct": verify_ct,
        "spec_accept_token_num": accepted,
        "spec_draft_token_num": proposed,
        "spec_accept_length": completion_tokens / verify_ct,
        "spec_accept_rate": accepted / proposed if proposed else 0.0,
        "spec_num_correct_drafts": accepted,
        "spec_num_proposed_drafts": proposed,
    }


def apply_token_out(state: ReqState, out: StrOut, token_text: TokenText) -> None:
    """One results message's text, ids, counters, logprobs and per-token extras into the state."""
    token = out.token
    state.text = out.text if out.text is not None else state.text + out.new_text
    state.output_ids.extend(token.new_output_ids)
    state.prompt_tokens = token.prompt_tokens
    state.completion_tokens = token.completion_tokens
    state.cached_tokens = token.cached_tokens
    state.num_retractions = token.num_retractions
    state.spec_counts = (token.spec_verify_ct, token.spec_accept_token_num, token.spec_draft_token_num)
    if state.return_logprob:
        append_logprobs(state, out, token_text)
    if token.guidance_alpha is not None:
        state.guidance_alpha = (state.guidance_alpha or []) + token.guidance_alpha  # one list per message
    accumulate(state.reports, token)


def child_state(
    child: TokenizedGenerateReqInput, index: int, group: ReqGroup, text_in_logprobs: bool,
    think_end_ids: Optional[list[int]],
) -> ReqState:
    """The state of one scheduled child (index within its request's n) of `group`."""
    return ReqState(
        rid=child.rid,
        index=index,
        group=group,
        stream=child.stream,
        return_logprob=child.return_logprob,
        want_top=child.top_logprobs_num > 0,
        want_token_ids=child.token_ids_logprob is not None,
        text_in_logprobs=text_in_logprobs,
        sampling_seed=child.sampling_params.get("sampling_seed"),
        prompt_token_ids=child.input_ids if child.return_prompt_token_ids else None,
        think_end_ids=think_end_ids,
    )
