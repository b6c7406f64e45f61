"""The model-free watermark detector (standard library only): score each distinct context's
generated token by -log(1 - u), whose sum over n contexts is Gamma(n, 1) without a watermark.

The hash is the one the sampler draws with (README of this package):
  context_hash = murmur3_x86_32(c_1 .. c_L),                    length 4 L
  token_hash   = murmur3_x86_32(key_lo, key_hi, context_hash, t), length 16
  u            = (token_hash + 0.5) / 2**32
and, with a second key, a per-context coin murmur3_x86_32(a_lo, a_hi, b_lo, b_hi, context_hash)
(length 20) below floor(P * 2**32) picks key A, else key B.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Iterable, Optional, Sequence

from sglang.srt.sampling.watermarking.config import MAX_CONTEXT_WINDOW, MAX_CONTEXTS_PER_REQUEST, parse_key

_MASK32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def murmur3_words(words: Sequence[int]) -> int:
    """MurmurHash3 x86-32 (seed 0) of 32-bit words, length 4 * len(words)."""
    h = 0
    for word in words:
        k = (word & _MASK32) * 0xCC9E2D51 & _MASK32
        k = _rotl32(k, 15) * 0x1B873593 & _MASK32
        h = (_rotl32(h ^ k, 13) * 5 + 0xE6546B64) & _MASK32
    h ^= 4 * len(words)
    h = (h ^ (h >> 16)) * 0x85EBCA6B & _MASK32
    h = (h ^ (h >> 13)) * 0xC2B2AE35 & _MASK32
    return h ^ (h >> 16)


def context_hash(context: Sequence[int]) -> int:
    return murmur3_words(context)


def token_hash(key: int, ctx_hash: int, token_id: int) -> int:
    return murmur3_words((key & _MASK32, (key >> 32) & _MASK32, ctx_hash, token_id))


def key_coin(key_a: int, key_b: int, ctx_hash: int) -> int:
    return murmur3_words((key_a & _MASK32, (key_a >> 32) & _MASK32, key_b & _MASK32, (key_b >> 32) & _MASK32, ctx_hash))


def gamma_log_survival(score: float, shape: int) -> float:
    """log P(Gamma(shape, 1) > score) = -score + log sum_{k < shape} score**k / k!  (shape >= 1)."""
    if score <= 0:
        return 0.0
    log_score = math.log(score)
    terms = [k * log_score - math.lgamma(k + 1) for k in range(shape)]
    top = max(terms)
    return min(0.0, -score + top + math.log(math.fsum(math.exp(t - top) for t in terms)))


@dataclass(frozen=True)
class WatermarkStatistics:
    num_contexts: int
    score: float
    z_score: float
    p_value: float
    log_p_value: float  # finite where p_value underflows to 0

    @classmethod
    def from_scores(cls, scores: Sequence[float]) -> "WatermarkStatistics":
        n = len(scores)
        if n == 0:
            return cls(num_contexts=0, score=0.0, z_score=0.0, p_value=1.0, log_p_value=0.0)
        score = math.fsum(scores)
        log_p = gamma_log_survival(score, n)
        return cls(num_contexts=n, score=score, z_score=(score - n) / math.sqrt(n), p_value=math.exp(log_p), log_p_value=log_p)


@dataclass(frozen=True)
class WatermarkDetection:
    combined: WatermarkStatistics
    key_a_all_positions: WatermarkStatistics
    key_b_all_positions: Optional[WatermarkStatistics]
    key_a_partition: Optional[WatermarkStatistics]
    key_b_partition: Optional[WatermarkStatistics]
    prefix_limit_reached: bool
    tokens_examined: int
    repeated_contexts: int
    skipped_initial_tokens: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _token_ids(values: Iterable[int], name: str) -> list[int]:
    ids = list(values)
    for value in ids:
        if isinstance(value, bool) or not isinstance(value, Integral) or not 0 <= value <= _MASK32:
            raise ValueError(f"{name} must be unsigned 32-bit integers.")
    return [int(v) for v in ids]


def _bounded_int(name: str, value: int, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or not 1 <= value <= limit:
        raise ValueError(f"{name} must be an integer from 1 to {limit}.")
    return int(value)


def _uniform_score(key: int, ctx_hash: int, token_id: int) -> float:
    u = (token_hash(key, ctx_hash, token_id) + 0.5) / 2**32
    return -math.log1p(-u)


class WatermarkDetector:
    """Scores token ids generated with `key` (and `key_b`, for dual-key output)."""

    def __init__(
        self,
        key: str,
        *,
        key_b: Optional[str] = None,
        mixing_probability: float = 0.5,
        context_window: int = 4,
        max_contexts: int = MAX_CONTEXTS_PER_REQUEST,
    ) -> None:
        p = mixing_probability
        if isinstance(p, bool) or not isinstance(p, Real) or not 0 < p < 1:
            raise ValueError("mixing_probability must be strictly between 0 and 1.")
        self._key_a = parse_key(key, "key")
        self._key_b = None if key_b is None else parse_key(key_b, "key_b")
        self._threshold = int(p * (1 << 32))
        self.context_window = _bounded_int("context_window", context_window, MAX_CONTEXT_WINDOW)
        self.max_contexts = _bounded_int("max_contexts", max_contexts, MAX_CONTEXTS_PER_REQUEST)

    def detect_tokens(self, token_ids: Iterable[int], *, prompt_token_ids: Iterable[int] = ()) -> WatermarkDetection:
        """Each generated token whose context (the `context_window` tokens before it, prompt tail
        included) is new is scored once, up to `max_contexts` distinct contexts. Without prompt ids
        the first `context_window` tokens, whose contexts reach into the unknown prompt, are skipped."""
        prompt = _token_ids(prompt_token_ids, "prompt_token_ids")
        completion = _token_ids(token_ids, "token_ids")
        h = self.context_window
        tokens = prompt[-h:] + completion
        start = min(len(prompt), h)
        first = start if prompt else min(h, len(completion))
        seen: set[tuple[int, ...]] = set()
        a_all: list[float] = []
        b_all: list[float] = []
        a_part: list[float] = []
        b_part: list[float] = []
        repeated, examined = 0, first - start
        for pos in range(first, len(tokens)):
            examined = pos - start + 1
            context = tuple(tokens[max(0, pos - h) : pos])
            if context in seen:
                repeated += 1
                continue
            seen.add(context)
            self._score(context_hash(context), tokens[pos], a_all, b_all, a_part, b_part)
            if len(seen) == self.max_contexts:
                break
        dual = self._key_b is not None
        stats = WatermarkStatistics.from_scores
        return WatermarkDetection(
            combined=stats(a_part + b_part if dual else a_all),
            key_a_all_positions=stats(a_all),
            key_b_all_positions=stats(b_all) if dual else None,
            key_a_partition=stats(a_part) if dual else None,
            key_b_partition=stats(b_part) if dual else None,
            prefix_limit_reached=len(seen) == self.max_contexts,
            tokens_examined=examined,
            repeated_contexts=repeated,
            skipped_initial_tokens=first - start,
        )

    def _score(self, ctx: int, token: int, a_all: list, b_all: list, a_part: list, b_part: list) -> None:
        score_a = _uniform_score(self._key_a, ctx, token)
        a_all.append(score_a)
        if self._key_b is None:
            return
        score_b = _uniform_score(self._key_b, ctx, token)
        b_all.append(score_b)
        if key_coin(self._key_a, self._key_b, ctx) < self._threshold:
            a_part.append(score_a)
        else:
            b_part.append(score_b)

    def detect_text(self, text: str, tokenizer, *, prompt_token_ids: Iterable[int] = ()) -> WatermarkDetection:
        """detect_tokens of `tokenizer.encode(text, add_special_tokens=False)`."""
        return self.detect_tokens(tokenizer.encode(text, add_special_tokens=False), prompt_token_ids=prompt_token_ids)


def detect(
    token_ids: Iterable[int],
    *,
    key: str,
    key_b: Optional[str] = None,
    prompt_token_ids: Iterable[int] = (),
    mixing_probability: float = 0.5,
    context_window: int = 4,
) -> WatermarkDetection:
    detector = WatermarkDetector(key, key_b=key_b, mixing_probability=mixing_probability, context_window=context_window)
    return detector.detect_tokens(token_ids, prompt_token_ids=prompt_token_ids)
