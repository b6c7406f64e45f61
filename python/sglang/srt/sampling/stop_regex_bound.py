"""Bounds of stop regexes: how many, how long, and how many characters a match can span (the
stop-regex matcher keeps that much decoded tail)."""

from __future__ import annotations

import logging
from typing import Any

try:
    import re._parser as _regex_parser
    import re._constants as _regex_constants
except ImportError:  # Python 3.10 keeps the parser under its old public names
    import sre_constants as _regex_constants
    import sre_parse as _regex_parser

logger = logging.getLogger(__name__)

MAX_STOP_REGEX_COUNT = 32
MAX_STOP_REGEX_LEN = 256
MAX_LEN = 2**30  # stands for an unbounded match


def stop_regex_max_len(patterns: list[str]) -> int:
    if len(patterns) > MAX_STOP_REGEX_COUNT:
        raise ValueError(
            f"at most {MAX_STOP_REGEX_COUNT} stop_regex patterns are allowed, got {len(patterns)}"
        )
    longest = 0
    for pattern in patterns:
        size = len(pattern.encode("utf-8"))
        if size > MAX_STOP_REGEX_LEN:
            raise ValueError(f"stop_regex is {size} bytes, over the {MAX_STOP_REGEX_LEN}-byte limit")
        try:
            longest = max(longest, get_max_seq_length(pattern))
        except _regex_constants.error as e:
            raise ValueError(f"stop_regex {pattern!r} is not a valid regular expression: {e}") from None
    return longest


_C = _regex_constants
_SINGLE_CHAR_OPS = {_C.LITERAL, _C.NOT_LITERAL, _C.IN, _C.ANY}
# Possessive repeats and atomic groups only exist from Python 3.11 on.
_REPEAT_OPS = {_C.MAX_REPEAT, _C.MIN_REPEAT, getattr(_C, "POSSESSIVE_REPEAT", _C.MAX_REPEAT)}


def get_max_seq_length(regex: str) -> int:
    """Upper bound on the characters a match of `regex` spans; MAX_LEN stands for unbounded.

    The stop-regex matcher uses it to decide how much decoded tail it must keep.
    """
    return _seq_max_len(_regex_parser.parse(regex))


def _seq_max_len(items: Any) -> int:
    return sum(_item_max_len(op, av) for op, av in items)


def _item_max_len(op: Any, av: Any) -> int:
    if op in _SINGLE_CHAR_OPS:
        return 1
    if op == _C.AT:
        return 0
    if op == _C.SUBPATTERN:
        return _seq_max_len(av[-1])
    if op == getattr(_C, "ATOMIC_GROUP", None):
        return _seq_max_len(av)
    if op == _C.BRANCH:
        return max((_seq_max_len(branch) for branch in av[1]), default=0)
    if op in _REPEAT_OPS:
        _, hi, inner = av
        if hi == _C.MAXREPEAT:
            return MAX_LEN
        return hi * _seq_max_len(inner)
    # Lookarounds, backreferences, conditionals: no cheap bound, so assume unbounded.
    logger.warning("stop_regex construct %s has no length bound; treating it as unbounded", op)
    return MAX_LEN


