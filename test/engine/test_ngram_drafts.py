"""NGRAM draft lookup (speculative/ngram.py): the longest, then most recent, earlier match of the
request's suffix, and its continuation extended by the match's period past the sequence's end."""

from __future__ import annotations

from sglang.srt.speculative.ngram import ngram_drafts


def test_the_longest_match_wins_over_a_more_recent_shorter_one():
    # Suffix [7, 8, 9]: matched in full at 0..2 (then 4, 5), only [8, 9] at 7..8 and 11..12.
    tokens = [7, 8, 9, 4, 5, 0, 2, 8, 9, 6, 1, 8, 9, 0, 7, 8, 9]
    assert ngram_drafts(tokens, 2, 8) == [4, 5]


def test_a_match_near_the_end_repeats_its_period():
    assert ngram_drafts([5, 1, 2, 3, 1, 2], 5, 8) == [3, 1, 2, 3, 1]
    assert ngram_drafts([9, 9, 4, 4, 4], 4, 8) == [4, 4, 4, 4]


def test_no_earlier_occurrence_of_the_last_token_gives_no_drafts():
    assert ngram_drafts([1, 2, 3], 4, 8) == []
    assert ngram_drafts([1, 1], 0, 8) == []
