"""Speculative flags' defaults (speculative/spec_args.py): NGRAM's verify width and minimum match
follow the device, an explicit width or step count wins, and the two must agree."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang.srt.speculative.spec_args import resolve_speculative_args


def _args(device: str, **kw) -> SimpleNamespace:
    fields = dict(speculative_algorithm="NGRAM", speculative_draft_model_path=None, speculative_eagle_topk=None,
                  speculative_num_steps=None, speculative_num_draft_tokens=None, speculative_ngram_max_trie_depth=18,
                  speculative_ngram_min_match_window_size=None, speculative_disable_batch_size=None, tp_size=1, device=device)
    return SimpleNamespace(**{**fields, **kw})


@pytest.mark.parametrize("device, width", [("cpu", 4), ("cuda", 12)])
def test_ngram_default_width_follows_the_device(device: str, width: int) -> None:
    args = _args(device)
    resolve_speculative_args(args)
    assert (args.speculative_num_draft_tokens, args.speculative_num_steps) == (width, width - 1)


def test_an_explicit_width_wins_and_must_match_the_steps() -> None:
    args = _args("cpu", speculative_num_draft_tokens=9)
    resolve_speculative_args(args)
    assert args.speculative_num_steps == 8
    with pytest.raises(ValueError, match="--speculative-num-draft-tokens 9 must be"):
        resolve_speculative_args(_args("cpu", speculative_num_draft_tokens=9, speculative_num_steps=3))


@pytest.mark.parametrize("device, min_match", [("cpu", 2), ("cuda", 1)])
def test_ngram_default_minimum_match_follows_the_device(device: str, min_match: int) -> None:
    args = _args(device)
    resolve_speculative_args(args)
    assert args.speculative_ngram_min_match_window_size == min_match
    explicit = _args(device, speculative_ngram_min_match_window_size=3)
    resolve_speculative_args(explicit)
    assert explicit.speculative_ngram_min_match_window_size == 3


@pytest.mark.parametrize("value", [0, 19])
def test_a_minimum_match_outside_one_to_the_window_is_refused(value: int) -> None:
    with pytest.raises(ValueError, match=f"--speculative-ngram-min-match-window-size {value} must be from 1 to "
                                         "--speculative-ngram-max-trie-depth 18"):
        resolve_speculative_args(_args("cpu", speculative_ngram_min_match_window_size=value))


def test_the_minimum_match_default_stays_within_a_short_window() -> None:
    args = _args("cpu", speculative_ngram_max_trie_depth=1)
    resolve_speculative_args(args)
    assert args.speculative_ngram_min_match_window_size == 1
