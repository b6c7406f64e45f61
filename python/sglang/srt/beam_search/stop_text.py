"""Stop strings and stop_regex: the match test every request's output runs (Req.check_finished),
and its use on the ranked beam candidates of one selection step.

A candidate whose history (its parent beam's output ids plus its token) ends in text that holds
a stop string, or matches a stop_regex in its tail, finishes as a stopped beam; its
finish_reason names the string or pattern, and its text is cut where the match begins (unless
no_stop_trim), as for any request.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple, Optional, Sequence

import torch

from sglang.srt.sampling.sampling_params import MAX_LEN


class StopMatch(NamedTuple):
    matched: str  # the stop string or the stop_regex pattern (finish_reason "matched")
    text: str  # the text it matched (the detokenizer cuts the output where it begins)


def has_stop_text(params: Any) -> bool:
    return bool(params.stop_strs or params.stop_regex_strs)


def match_stop_text(tokenizer: Any, params: Any, output_ids: Sequence[int]) -> Optional[StopMatch]:
    """The first stop string (then stop_regex) found in the decoded tail of `output_ids`."""
    if tokenizer is None or not has_stop_text(params):
        return None
    if params.stop_strs:
        tail = _decode_tail(tokenizer, output_ids, params.stop_str_max_len)
        for stop in params.stop_strs:
            if stop and stop in tail:
                return StopMatch(stop, stop)
    if params.stop_regex_strs:
        tail = _decode_tail(tokenizer, output_ids, params.stop_regex_max_len)
        for pattern in params.stop_regex_strs:
            match = re.search(pattern, tail)
            if match:
                return StopMatch(pattern, match.group(0))
    return None


def _decode_tail(tokenizer: Any, output_ids: Sequence[int], max_len_tokens: int) -> str:
    # One extra token: a stop string can start inside the token before its last one.
    n = len(output_ids) if max_len_tokens >= MAX_LEN else max_len_tokens + 1
    return tokenizer.decode(list(output_ids[-n:]), skip_special_tokens=False)


def candidate_stops(
    histories: Sequence[Sequence[int]],  # each live beam's output ids, indexed by parent
    parents: Sequence[int],  # [C] the ranked candidates' parent beams
    tokens: Sequence[int],  # [C] their tokens
    valid: Sequence[bool],  # [C] False for -inf candidates (never examined)
    params: Any,
    tokenizer: Any,
) -> list[Optional[StopMatch]]:
    """The stop-text match of each ranked candidate of one request (None where it has none).
    min_new_tokens holds stop text back as it does for any request; the beams advance in
    lockstep, so every candidate has the same new length."""
    new_len = len(histories[0]) + 1
    if new_len < params.min_new_tokens:
        return [None] * len(tokens)
    return [
        match_stop_text(tokenizer, params, list(histories[p]) + [t]) if ok else None
        for p, t, ok in zip(parents, tokens, valid)
    ]


def ranked_text_stops(
    groups: Sequence[Any],  # BeamGroups, in the order of the ranked rows
    parents: torch.Tensor,  # [G, C] int64, ranked candidates' parent beams
    tokens: torch.Tensor,  # [G, C] int64
    scores: torch.Tensor,  # [G, C] float32
) -> tuple[Optional[torch.Tensor], list[list[Optional[StopMatch]]]]:
    """Each ranked candidate's stop-text match, per request ([None] * C for requests without stop
    text), and their mask [G, C] bool for the walk (None when no request has stop text)."""
    c = tokens.shape[1]
    matches: list[list[Optional[StopMatch]]] = []
    for gi, group in enumerate(groups):
        leader = group.leader
        if leader.tokenizer is None or not has_stop_text(leader.sampling_params):
            matches.append([None] * c)
            continue
        valid = (scores[gi] > float("-inf")).tolist()
        histories = [row.output_ids for row in group.rows]
        matches.append(candidate_stops(histories, parents[gi].tolist(), tokens[gi].tolist(), valid,
                                       leader.sampling_params, leader.tokenizer))
    if all(m is None for row in matches for m in row):
        return None, matches
    return torch.tensor([[m is not None for m in row] for row in matches], dtype=torch.bool), matches
