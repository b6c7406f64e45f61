"""Per-request sampling parameters: construction defaults, normalization and validation.

Lifecycle (tokenizer manager): `from_dict` (HTTP contract gate: unknown keys and wrong JSON
types) -> constructor (defaults, greedy rewrite) -> `normalize(tokenizer)` (stop strings and
regexes) -> `verify(vocab_size)` (value ranges). Every rejection is a ValueError whose message
names the parameter and what it accepts, so the HTTP layer can return it verbatim as a 400.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field, fields
from typing import Any, Optional, Union

from sglang.srt.beam_search.params import verify_beam_params
from sglang.srt.sampling.guidance_params import normalize_guidance, verify_guidance
from sglang.srt.sampling.param_types import (
    FIELD_CHECKS,
    as_str_list,
    is_finite_real,
    is_int,
    is_real,
    json_type,
    parse_token_id_key,
    to_token_id_set,
    tokenize_bad_words,
    verify_seed,
)
# Re-exported: the stop-regex bounds are part of this module's interface.
from sglang.srt.sampling.stop_regex_bound import (  # noqa: F401
    MAX_LEN,
    MAX_STOP_REGEX_COUNT,
    MAX_STOP_REGEX_LEN,
    get_max_seq_length,
    stop_regex_max_len,
)
from sglang.srt.sampling.watermarking.config import check_request as check_watermark_request

_SAMPLING_EPS = 1e-6
TOP_K_ALL = 1 << 30
MAX_STOP_COUNT = 32
LOGIT_BIAS_MAX = 100.0

_REASONING_END_IDS_KEY = "__sglang_reasoning_end_token_ids"
_MAX_REASONING_END_IDS = 32
_GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")


@dataclass(kw_only=True)
class SamplingParams:
    """Sampling parameters of one request (SGLang field names, order and defaults)."""

    max_new_tokens: Optional[int] = 128
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[set[int]] = None
    stop_regex: Optional[Union[str, list[str]]] = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    n: int = 1
    beam_width: Optional[int] = None
    json_schema: Optional[str] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    structural_tag: Optional[str] = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    stream_interval: Optional[int] = None
    logit_bias: Optional[dict[str, float]] = None
    sampling_seed: Optional[int] = None
    custom_params: Optional[dict[str, Any]] = None
    # Two-context guidance (sampling/guidance_params.py): cfg, mixture or contrastive with a guide prompt.
    guidance: Optional[dict[str, Any]] = None
    watermark: Optional[Any] = field(default=None, repr=False)  # may hold a key: never shown
    # Built-in batch-level logits processors (sglang.srt.sampling.logits_processor).
    allowed_token_ids: Optional[list[int]] = None
    bad_words: Optional[Union[str, list[str]]] = None
    no_repeat_ngram_size: int = 0
    thinking_token_budget: Optional[int] = None
    # Beam search: beams are ranked by cum_logprob / len ** length_penalty (SGLang fixes 1.0).
    length_penalty: float = 1.0
    # Internal state, filled by __post_init__ / normalize.
    stop_strs: Optional[list[str]] = None
    stop_regex_strs: Optional[list[str]] = None
    stop_str_max_len: int = 0
    stop_regex_max_len: int = 0
    is_normalized: bool = False
    bad_words_token_ids: Optional[list[list[int]]] = None  # each word with and without a leading space
    # OpenAI-style alias of sampling_seed; not stored as a field of its own.
    seed: InitVar[Optional[int]] = None

    def __post_init__(self, seed: Optional[int]) -> None:
        self._merge_seed_alias(seed)
        if self.is_normalized:  # rebuilt from a normalized copy: keep its derived state
            return
        self.stop_strs = self.stop
        self.stop_regex_strs = self.stop_regex
        self.stop_token_ids = to_token_id_set(self.stop_token_ids)
        self._fill_none_defaults()
        for name in _GRAMMAR_FIELDS:
            if getattr(self, name) == "":
                setattr(self, name, None)
        t = self.temperature
        if is_real(t) and 0 <= t < _SAMPLING_EPS:
            self.temperature = 1.0
            self.top_k = 1
        if self.top_k == -1:
            self.top_k = TOP_K_ALL
        if is_int(self.thinking_token_budget) and self.thinking_token_budget == -1:
            self.thinking_token_budget = None  # vLLM's "no limit"

    def _merge_seed_alias(self, seed: Optional[int]) -> None:
        if seed is None:
            return
        if self.sampling_seed is not None and self.sampling_seed != seed:
            raise ValueError(
                f"seed and sampling_seed are both set and differ ({seed} vs {self.sampling_seed}); "
                "set only one of them."
            )
        self.sampling_seed = seed

    def _fill_none_defaults(self) -> None:
        for name, default in _NONE_DEFAULTS.items():
            if getattr(self, name) is None:
                setattr(self, name, default)

    @property
    def is_greedy(self) -> bool:
        return self.top_k <= 1

    # ------------------------------------------------------------------ normalize

    def normalize(self, tokenizer: Any) -> None:
        """Resolve stop strings / regexes into lists and their token-length bounds.

        `tokenizer` needs `encode(text, add_special_tokens=False) -> list[int]`; None means the
        server runs with skip_tokenizer_init, where text stop conditions cannot be matched.
        """
        if self.is_normalized:
            return
        stop_strs = as_str_list(self.stop_strs, "stop")
        if len(stop_strs) > MAX_STOP_COUNT:
            raise ValueError(f"at most {MAX_STOP_COUNT} stop strings are allowed, got {len(stop_strs)}")
        stop_regex_strs = as_str_list(self.stop_regex_strs, "stop_regex")
        self.stop_regex_max_len = stop_regex_max_len(stop_regex_strs)
        if tokenizer is None:
            self._check_tokenizer_free(stop_strs, stop_regex_strs)
        # Without a tokenizer the check above guarantees stop_strs is empty.
        self.stop_str_max_len = max(
            (len(tokenizer.encode(s, add_special_tokens=False)) for s in stop_strs), default=0
        )
        self.stop_strs = stop_strs
        self.stop_regex_strs = stop_regex_strs
        self.stop = None
        self.stop_regex = None
        self.bad_words_token_ids = tokenize_bad_words(self.bad_words, tokenizer)
        self.guidance = normalize_guidance(self.guidance, tokenizer)
        self.is_normalized = True

    def _check_tokenizer_free(self, stop_strs: list[str], stop_regex_strs: list[str]) -> None:
        suffix = "is unavailable when skip_tokenizer_init=True"
        if stop_strs:
            raise ValueError(
                f"stop={stop_strs!r} {suffix} (requires tokenizer to decode tokens to text for matching)."
            )
        if stop_regex_strs:
            raise ValueError(
                f"stop_regex={stop_regex_strs!r} {suffix} "
                "(requires tokenizer to decode tokens to text for matching)."
            )
        if is_int(self.min_new_tokens) and self.min_new_tokens > 0:
            raise ValueError(
                f"min_new_tokens={self.min_new_tokens} {suffix} (requires tokenizer for eos_token_id)."
            )

    # ------------------------------------------------------------------ verify

    def verify(self, vocab_size: int) -> None:
        """Raise ValueError for the first invalid parameter (SGLang's order, then ours)."""
        self._verify_sglang_rules(vocab_size)
        self._verify_product_rules(vocab_size)

    def _verify_sglang_rules(self, vocab_size: int) -> None:
        bw = self.beam_width
        if bw is not None and not (is_int(bw) and bw >= 1):
            raise ValueError(f"beam_width must be at least 1, got {bw}.")
        t = self.temperature
        if not (is_finite_real(t) and t >= 0):
            raise ValueError(f"temperature must be a non-negative finite number, got {t}.")
        if not (is_real(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not (is_real(self.min_p) and 0 <= self.min_p <= 1):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        if not (is_int(self.top_k) and self.top_k >= 1):
            raise ValueError(f"top_k must be -1 (disable) or at least 1, got {self.top_k}.")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not (is_real(value) and -2 <= value <= 2):
                raise ValueError(f"{name} must be in [-2, 2], got {value}.")
        rp = self.repetition_penalty
        if not (is_real(rp) and 0 < rp <= 2):
            raise ValueError(f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {rp}.")
        self._verify_token_budget()
        self._verify_logit_bias(vocab_size)
        verify_seed(self.sampling_seed)
        self._verify_reasoning_end_ids(vocab_size)
        if sum(getattr(self, name) is not None for name in _GRAMMAR_FIELDS) > 1:
            raise ValueError("Only one of json_schema, regex, ebnf, or structural_tag can be set.")

    def _verify_token_budget(self) -> None:
        lo, hi = self.min_new_tokens, self.max_new_tokens
        if not (is_int(lo) and lo >= 0):
            raise ValueError(f"min_new_tokens must be in [0, max_new_tokens], got {lo}.")
        if hi is None:  # "rest of the context": the scheduler bounds it
            return
        if not (is_int(hi) and hi >= 0):
            raise ValueError(f"max_new_tokens must be at least 0, got {hi}.")
        if lo > hi:
            raise ValueError(f"min_new_tokens must be in [0, max_new_tokens({hi})], got {lo}.")

    def _verify_logit_bias(self, vocab_size: int) -> None:
        if self.logit_bias is None:
            return
        if not isinstance(self.logit_bias, dict):
            raise ValueError(
                f"logit_bias must be an object mapping token ids in [0, {vocab_size - 1}] to biases in "
                f"[-{LOGIT_BIAS_MAX:g}, {LOGIT_BIAS_MAX:g}], got {type(self.logit_bias).__name__}."
            )
        for key, value in self.logit_bias.items():
            token_id = parse_token_id_key(key)
            if token_id is None or not 0 <= token_id < vocab_size:
                raise ValueError(f"logit_bias must have keys in [0, {vocab_size - 1}], got {key}.")
            if not (is_finite_real(value) and -LOGIT_BIAS_MAX <= value <= LOGIT_BIAS_MAX):
                raise ValueError(
                    f"logit_bias must have values in [-{LOGIT_BIAS_MAX:g}, {LOGIT_BIAS_MAX:g}], "
                    f"got {value} for key {key}."
                )

    def _verify_reasoning_end_ids(self, vocab_size: int) -> None:
        if not isinstance(self.custom_params, dict) or _REASONING_END_IDS_KEY not in self.custom_params:
            return
        ids = self.custom_params[_REASONING_END_IDS_KEY]
        valid = (
            isinstance(ids, list)
            and 1 <= len(ids) <= _MAX_REASONING_END_IDS
            and all(is_int(t) and 0 <= t < vocab_size for t in ids)
        )
        if not valid:
            raise ValueError(
                "request reasoning end token IDs must be a non-empty, vocabulary-bounded "
                f"list of at most {_MAX_REASONING_END_IDS} integers"
            )

    def _verify_product_rules(self, vocab_size: int) -> None:
        if not (is_int(self.n) and self.n >= 1):
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if self.stop_token_ids:
            # An id outside the vocabulary can never be produced: it is dropped, as SGLang ignores it.
            self.stop_token_ids = {t for t in self.stop_token_ids if is_int(t) and 0 <= t < vocab_size} or None
        si = self.stream_interval
        if si is not None and not (is_int(si) and si >= 1):
            raise ValueError(f"stream_interval must be at least 1, got {si}.")
        lp = self.length_penalty
        if not is_finite_real(lp):
            raise ValueError(f"length_penalty must be a finite number, got {lp}.")
        if self.beam_width is not None and self.beam_width > 1:
            verify_beam_params(self, vocab_size)
        elif lp != 1.0:
            raise ValueError(f"length_penalty applies to beam search only (beam_width > 1), got {lp}.")
        if self.watermark is not None:
            check_watermark_request(self.watermark)  # its policy is the server's (RequestValidator)
        if self.guidance is not None:
            verify_guidance(self.guidance, vocab_size)
        self._verify_batch_processor_params(vocab_size)

    def _verify_batch_processor_params(self, vocab_size: int) -> None:
        allowed = self.allowed_token_ids
        if allowed is not None:
            if not isinstance(allowed, list) or not allowed:
                raise ValueError("allowed_token_ids must be a non-empty list of token ids (or null).")
            for token_id in allowed:
                if not (is_int(token_id) and 0 <= token_id < vocab_size):
                    raise ValueError(
                        f"allowed_token_ids contains out-of-vocab token id {token_id}; valid range is [0, {vocab_size})."
                    )
        for seq in self.bad_words_token_ids or ():
            for token_id in seq:
                if not 0 <= token_id < vocab_size:
                    raise ValueError(f"bad_words tokenize to token id {token_id}, outside the model's vocabulary [0, {vocab_size}).")
        size = self.no_repeat_ngram_size
        if not (is_int(size) and size >= 0):
            raise ValueError(f"no_repeat_ngram_size must be a non-negative integer (0 = off), got {size}.")
        budget = self.thinking_token_budget
        if budget is not None and not (is_int(budget) and budget >= 0):
            raise ValueError(f"thinking_token_budget must be a non-negative integer, or -1 for no limit, got {budget}.")

    # ------------------------------------------------------------------ wire format

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingParams:
        """Build from a JSON `sampling_params` object, rejecting unknown keys and wrong types.

        `null` means "use the default". Value ranges are left to `verify`.
        """
        if not isinstance(d, dict):
            raise ValueError(f"sampling_params must be an object, got {json_type(d)}.")
        for key, value in d.items():
            check = FIELD_CHECKS.get(key)
            if check is None:
                expected = ", ".join(f"`{k}`" for k in FIELD_CHECKS)
                raise ValueError(f"unknown field `{key}`, expected one of {expected}")
            if value is not None:
                check(key, value)
        return cls(**{k: v for k, v in d.items() if k != "choice"})

    def to_dict(self) -> dict[str, Any]:
        """Public fields as JSON-safe values; `SamplingParams(**p.to_dict())` is equivalent to p."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name in _PUBLIC_FIELDS}
        out["stop"] = _public_stop(self.stop, self.stop_strs)
        out["stop_regex"] = _public_stop(self.stop_regex, self.stop_regex_strs)
        if self.stop_token_ids is not None:
            out["stop_token_ids"] = sorted(self.stop_token_ids)
        for name in ("logit_bias", "custom_params"):
            if out[name] is not None:  # a copy, so the caller cannot mutate this request
                out[name] = dict(out[name])
        return out

    def to_message(self) -> dict[str, Any]:
        """to_dict() plus what normalize() derived (stop lists and their token-length bounds,
        bad_words token ids), JSON-safe: the scheduler rebuilds these normalized params with
        from_message, without a tokenizer."""
        if not self.is_normalized:
            raise ValueError("to_message needs normalized sampling params (call normalize first).")
        out = self.to_dict()
        out.update(
            stop_strs=list(self.stop_strs or []),
            stop_regex_strs=list(self.stop_regex_strs or []),
            stop_str_max_len=self.stop_str_max_len,
            stop_regex_max_len=self.stop_regex_max_len,
            is_normalized=True,
            bad_words_token_ids=self.bad_words_token_ids,
        )
        return out

    @classmethod
    def from_message(cls, d: dict[str, Any]) -> SamplingParams:
        """The normalized params that to_message() wrote (ValueError for any other dict)."""
        if d.get("is_normalized") is not True:
            raise ValueError("sampling_params must be SamplingParams.to_message() of normalized params.")
        params = cls(**d)
        params.stop_token_ids = to_token_id_set(params.stop_token_ids)
        return params


# A read-only mirror, so `params.seed` never reports a stale None (the InitVar is not stored).
SamplingParams.seed = property(lambda self: self.sampling_seed)  # type: ignore[assignment]

_NONE_DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "top_k": -1,
    "no_repeat_ngram_size": 0,
}

_INTERNAL_FIELDS = frozenset(
    {"stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len", "is_normalized", "bad_words_token_ids"}
)
_PUBLIC_FIELDS = frozenset(f.name for f in fields(SamplingParams)) - _INTERNAL_FIELDS


def _public_stop(raw: Any, normalized: Optional[list[str]]) -> Any:
    # After normalize the stop conditions live only in the internal list.
    value = raw if raw is not None else (normalized or None)
    return list(value) if isinstance(value, list) else value
