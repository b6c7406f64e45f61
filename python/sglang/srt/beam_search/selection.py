"""Beam selection as batched tensor work.

A request of width k keeps k live beams (the frontier). Each step every beam row contributes its
top 2k next-token log-probabilities; the candidates of a request are the k * 2k sums
cum_logprob + logprob, ranked best first, of which the first 2k are examined in order:
a candidate whose token is a stop token, or whose text hits a stop string or stop_regex
(stop_text.py), finishes (its beam joins the finished pool), any other survives, and the walk
stops once k candidates survived. Fewer than k survivors ends the request (SGLang's early
stop), unless masks (a grammar, allowed_token_ids) left fewer than 2k
finite candidates: then the survivors go on and the request's other rows idle as dead beams
(cumulative log-probability -inf, so none of their candidates is ever taken); no survivor at
all ends it. The global top 2k of the k x V sums is always among these k x 2k, so no row's full
vocabulary is ranked. On the last allowed step (max_new_tokens) the best k candidates all finish.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch


class RowCandidates(NamedTuple):
    logprobs: torch.Tensor  # [R, C] float32, best first
    token_ids: torch.Tensor  # [R, C] int64


class Selection(NamedTuple):
    """Per request (G of them), its first C ranked candidates."""

    token_ids: torch.Tensor  # [G, C] int64
    parents: torch.Tensor  # [G, C] int64, index of the beam (row within the request) extended
    scores: torch.Tensor  # [G, C] float32, new cumulative log-probabilities
    survives: torch.Tensor  # [G, C] bool, at most k per request, in rank order
    finishes: torch.Tensor  # [G, C] bool, examined stop-token candidates
    ends: torch.Tensor  # [G] bool, the request ends at this step


def row_candidates(logits: torch.Tensor, num_candidates: int) -> RowCandidates:
    """Top `num_candidates` log-probabilities of each row of `logits` [R, V] (fully processed
    logits: penalties, bias, masks and processors applied, no temperature)."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)  # [R, 1]
    values, ids = torch.topk(x, num_candidates, dim=-1)  # [R, C] each, sorted
    return RowCandidates(values - lse, ids)


class Ranked(NamedTuple):
    """Per request (G of them), its first C candidates by new cumulative log-probability."""

    token_ids: torch.Tensor  # [G, C] int64
    parents: torch.Tensor  # [G, C] int64, index of the beam (row within the request) extended
    scores: torch.Tensor  # [G, C] float32, best first


def rank_candidates(
    cum_logprobs: torch.Tensor,  # [G, K] float32, -inf on rows past a request's beam count
    logprobs: torch.Tensor,  # [G, K, C] float32, C = 2 * width
    token_ids: torch.Tensor,  # [G, K, C] int64
) -> Ranked:
    g, k, c = logprobs.shape
    sums = (cum_logprobs.unsqueeze(2) + logprobs).reshape(g, k * c)  # [G, K*C]
    scores, flat = torch.topk(sums, c, dim=1)  # [G, C], sorted best first
    return Ranked(token_ids.reshape(g, k * c).gather(1, flat), flat // c, scores)


def walk_candidates(
    ranked: Ranked,
    stop_ids: torch.Tensor,  # [G, S] int64, padded with -1
    width: int,
    final: torch.Tensor,  # [G] bool: the step reaches max_new_tokens
    text_stops: Optional[torch.Tensor] = None,  # [G, C] bool: the candidate's text hits a stop string
) -> Selection:
    """The walk over ranked candidates (see the module docstring); a text stop finishes a
    candidate as a stop token does."""
    tokens, parents, scores = ranked
    c = tokens.shape[1]
    valid = scores > float("-inf")
    is_stop = (tokens.unsqueeze(2) == stop_ids.unsqueeze(1)).any(dim=2)  # [G, C]
    if text_stops is not None:
        is_stop = is_stop | text_stops
    is_stop = is_stop & ~final.unsqueeze(1)
    live = valid & ~is_stop
    rank = live.long().cumsum(1)  # 1-based rank among live candidates
    survives = live & (rank <= width)
    examined = valid & ((rank - live.long()) < width)
    finishes = is_stop & examined
    top_k = torch.arange(c, device=tokens.device).unsqueeze(0) < width  # [1, C]
    on_final = final.unsqueeze(1)
    survives = torch.where(on_final, torch.zeros_like(survives), survives)
    finishes = torch.where(on_final, top_k & valid, finishes)
    count = survives.sum(dim=1)  # [G]
    ends = final | (count == 0) | ((count < width) & valid.all(dim=1))
    return Selection(tokens, parents, scores, survives, finishes, ends)


def joint_select(
    cum_logprobs: torch.Tensor,  # [G, K] float32
    logprobs: torch.Tensor,  # [G, K, C] float32
    token_ids: torch.Tensor,  # [G, K, C] int64
    stop_ids: torch.Tensor,  # [G, S] int64, padded with -1
    width: int,
    final: torch.Tensor,  # [G] bool
) -> Selection:
    """One selection step for G requests of the same width, stop tokens only."""
    return walk_candidates(rank_candidates(cum_logprobs, logprobs, token_ids), stop_ids, width, final)


def beam_score(cum_logprob: float, length: int, length_penalty: float) -> float:
    """The length-normalised score beams are ranked by at the end."""
    return cum_logprob / (length**length_penalty)
