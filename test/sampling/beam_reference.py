"""Reference beam searches for the beam tests, written from the definition (SGLang's semantics),
over a function giving the next-token log-probabilities of a history: a step-by-step beam
search, and an exhaustive enumeration of every continuation."""

from __future__ import annotations

import itertools
from typing import Callable, Optional

import torch

StepLogprobs = Callable[[list[int]], torch.Tensor]  # generated ids -> [V] float64 log-probabilities


def beam_search(step: StepLogprobs, width: int, max_new_tokens: int, stop_ids: set[int],
                length_penalty: float = 1.0, n: Optional[int] = None) -> list[tuple[list[int], float, Optional[int]]]:
    """(ids, score, matched stop id or None) of the n best beams, best first. Each step ranks the
    top-2k extensions of every live beam by cumulative log-probability and walks the best 2k:
    stop tokens finish, others survive until k survived; fewer than k survivors end the search,
    unless masks left fewer than 2k finite candidates (then the survivors go on), or none
    survived; at max_new_tokens the best k finite extensions finish."""
    frontier: list[tuple[list[int], float]] = [([], 0.0)]
    finished: list[tuple[list[int], float, Optional[int]]] = []
    for t in range(max_new_tokens):
        candidates = []
        for history, cum in frontier:
            values, ids = step(history).topk(2 * width)
            candidates += [(cum + float(v), history + [int(i)]) for v, i in zip(values, ids)]
        candidates.sort(key=lambda c: -c[0])
        candidates = candidates[: 2 * width]
        finite = [c for c in candidates if c[0] > float("-inf")]
        if t + 1 >= max_new_tokens:
            finished += [(ids, cum, None) for cum, ids in finite[:width]]
            break
        survivors = []
        for cum, ids in finite:
            if len(survivors) == width:
                break
            if ids[-1] in stop_ids:
                finished.append((ids, cum, ids[-1]))
            else:
                survivors.append((ids, cum))
        if not survivors or (len(survivors) < width and len(finite) == len(candidates)):
            finished += [(ids, cum, None) for ids, cum in survivors]
            break
        frontier = survivors
    scored = [(ids, cum / len(ids) ** length_penalty, matched) for ids, cum, matched in finished]
    scored.sort(key=lambda b: -b[1])
    return scored[:width][: n or width]


def exhaustive(step: StepLogprobs, tokens: list[int], length: int, count: int) -> list[tuple[list[int], float]]:
    """The `count` best continuations of `length` tokens drawn from `tokens`, by total
    log-probability, enumerated one by one."""
    scored = []
    for seq in itertools.product(tokens, repeat=length):
        total = sum(float(step(list(seq[:i]))[tok]) for i, tok in enumerate(seq))
        scored.append((list(seq), total))
    scored.sort(key=lambda s: -s[1])
    return scored[:count]


def hf_step(model, prompt: list[int], frequency_penalty: float = 0.0, logit_bias: Optional[dict[int, float]] = None,
            allowed: Optional[list[int]] = None,
            allowed_after: Optional[Callable[[list[int]], list[int]]] = None) -> StepLogprobs:
    """Log-probabilities of the HF model's next token after prompt + history, with the frequency
    penalty over the history, the logit bias and the allowed-token mask (`allowed`, or
    `allowed_after(history)`, e.g. a grammar's) applied first."""
    cache: dict[tuple[int, ...], torch.Tensor] = {}

    @torch.no_grad()
    def step(history: list[int]) -> torch.Tensor:
        key = tuple(history)
        if key not in cache:
            logits = model(torch.tensor([prompt + history]), use_cache=False).logits[0, -1].double()
            for tok in history:
                logits[tok] -= frequency_penalty
            for tok, bias in (logit_bias or {}).items():
                logits[tok] += bias
            ids = allowed if allowed_after is None else allowed_after(history)
            if ids is not None:
                mask = torch.full_like(logits, float("-inf"))
                mask[ids] = 0
                logits = logits + mask
            cache[key] = torch.log_softmax(logits, dim=-1)
        return cache[key]

    return step
