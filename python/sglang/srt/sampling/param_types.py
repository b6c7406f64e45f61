"""Checks and conversions of sampling parameters' values: the predicates the validation uses, the
conversions of stop ids, string lists and bad words, and the per-field type gate of
SamplingParams.from_dict (an HTTP body's wrong JSON type is named with the field before any
value is looked at)."""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional

_SEED_MIN = -(2**63)
_SEED_MAX = 2**63 - 1
MAX_BAD_WORD_SEQUENCES = 128  # vLLM's VLLM_MAX_NUM_BAD_WORDS


def is_int(x: Any) -> bool:
    # bool is an int subclass, but `true` is never a meaningful count, id or seed.
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def is_finite_real(x: Any) -> bool:
    if not is_real(x):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float
        return False


def parse_token_id_key(key: Any) -> Optional[int]:
    """Token id from a logit_bias key (JSON object keys are strings), or None if it is not one."""
    if is_int(key):
        return int(key)
    if isinstance(key, str):
        try:
            return int(key)
        except ValueError:
            return None
    return None


def verify_seed(seed: Any) -> None:
    if seed is None:
        return
    if not is_int(seed):
        raise ValueError(f"sampling_seed must be an integer, got {type(seed).__name__}.")
    if not _SEED_MIN <= seed <= _SEED_MAX:
        raise ValueError(f"sampling_seed must be in [-2**63, 2**63 - 1], got {seed}.")


def to_token_id_set(ids: Any) -> Optional[set[int]]:
    if not ids:
        return None
    try:
        out = {int(t) for t in ids if t is not None}
    except (TypeError, ValueError):
        raise ValueError(f"stop_token_ids must be a list of integer token ids, got {ids!r}.") from None
    return out or None


def as_str_list(value: Any, name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value):
        return list(value)
    raise ValueError(f"{name} must be a string or a list of strings, got {value!r}.")


def tokenize_bad_words(words: Any, tokenizer: Any) -> Optional[list[list[int]]]:
    """Each word's token ids as written and after a leading space (the two differ in BPE
    vocabularies, and a word inside a sentence usually follows a space), without duplicates."""
    if words is None:
        return None
    words = as_str_list(words, "bad_words")
    if any(not w.strip() for w in words):
        raise ValueError("bad_words must not contain empty strings.")
    if tokenizer is None:
        raise ValueError("bad_words is unavailable when skip_tokenizer_init=True (the words must be tokenized).")
    sequences: list[list[int]] = []
    for word in words:
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = list(tokenizer.encode(text, add_special_tokens=False))
            if not ids:
                raise ValueError(f"bad_words: {word!r} tokenizes to no token.")
            if ids not in sequences:
                sequences.append(ids)
    if len(sequences) > MAX_BAD_WORD_SEQUENCES:
        raise ValueError(
            f"bad_words tokenize to {len(sequences)} token sequences (each word with and without a leading space); "
            f"at most {MAX_BAD_WORD_SEQUENCES} are allowed."
        )
    return sequences


# ---------------------------------------------------------------------- from_dict type gate

# bool before int: bool is an int subclass.
_JSON_TYPE_NAMES = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
}


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    for py_type, name in _JSON_TYPE_NAMES.items():
        if isinstance(value, py_type):
            return name
    return type(value).__name__


def _type_error(key: str, expected: str, value: Any) -> ValueError:
    return ValueError(f"invalid type for `{key}`: expected {expected}, got {json_type(value)}.")


def _check_int(key: str, value: Any) -> None:
    if not is_int(value):
        raise _type_error(key, "an integer", value)


def _check_float(key: str, value: Any) -> None:
    if not is_real(value):
        raise _type_error(key, "a number", value)


def _check_bool(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise _type_error(key, "a boolean", value)


def _check_str(key: str, value: Any) -> None:
    if not isinstance(value, str):
        raise _type_error(key, "a string", value)


def _check_str_or_str_list(key: str, value: Any) -> None:
    if isinstance(value, str):
        return
    if not (isinstance(value, list) and all(isinstance(s, str) for s in value)):
        raise _type_error(key, "a string or an array of strings", value)


def _check_int_list(key: str, value: Any) -> None:
    if not (isinstance(value, list) and all(is_int(t) for t in value)):
        raise _type_error(key, "an array of integers", value)


def _check_object(key: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise _type_error(key, "an object", value)


def _check_logit_bias(key: str, value: Any) -> None:
    if not (isinstance(value, dict) and all(is_real(v) for v in value.values())):
        raise _type_error(key, "an object mapping token id strings to numbers", value)


def _reject_choice(key: str, value: Any) -> None:
    raise ValueError(f"`{key}` is not supported by this server yet; it must be null or absent.")


FIELD_CHECKS = {
    "max_new_tokens": _check_int,
    "stop": _check_str_or_str_list,
    "stop_token_ids": _check_int_list,
    "stop_regex": _check_str_or_str_list,
    "temperature": _check_float,
    "top_p": _check_float,
    "top_k": _check_int,
    "min_p": _check_float,
    "frequency_penalty": _check_float,
    "presence_penalty": _check_float,
    "repetition_penalty": _check_float,
    "min_new_tokens": _check_int,
    "n": _check_int,
    "json_schema": _check_str,
    "regex": _check_str,
    "ebnf": _check_str,
    "structural_tag": _check_str,
    "ignore_eos": _check_bool,
    "skip_special_tokens": _check_bool,
    "spaces_between_special_tokens": _check_bool,
    "no_stop_trim": _check_bool,
    "stream_interval": _check_int,
    "logit_bias": _check_logit_bias,
    "sampling_seed": _check_int,
    "custom_params": _check_object,
    "beam_width": _check_int,
    "watermark": _check_object,
    "guidance": _check_object,
    "allowed_token_ids": _check_int_list,
    "bad_words": _check_str_or_str_list,
    "no_repeat_ngram_size": _check_int,
    "thinking_token_budget": _check_int,
    "length_penalty": _check_float,
    "choice": _reject_choice,
    "seed": _check_int,
}
