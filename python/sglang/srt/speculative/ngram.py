"""NGRAM drafting: the tokens that followed the best earlier match of the request's own suffix.

The request's prompt and output are one token sequence. Its last `w` tokens (w up to
--speculative-ngram-max-trie-depth) are looked up among its earlier tokens; the occurrence with
the longest match wins, the most recent one among equals, and the tokens that followed it are
the drafts (a single chain). A match shorter than `min_match` tokens
(--speculative-ngram-min-match-window-size) drafts nothing. A match p tokens back says the text
repeats with period p, so where its continuation reaches the end of the sequence the drafts go
on repeating it (a run of one token drafts that token again). No match: no drafts, and the
request decodes one token that step.
"""

from __future__ import annotations

import numpy as np


def ngram_drafts(tokens: list[int], max_drafts: int, max_window: int, min_match: int = 1) -> list[int]:
    """Up to `max_drafts` ids continuing `tokens` as its best earlier match continued."""
    n = len(tokens)
    if max_drafts <= 0 or n < 2:
        return []
    seq = np.asarray(tokens, dtype=np.int64)  # [n]
    # Candidate ends: earlier positions holding the last token, with at least one token after.
    ends = np.flatnonzero(seq[:-1] == seq[-1])  # [C]
    if ends.size == 0:
        return []
    window = min(max_window, n - 1)
    back = np.arange(window)  # [W]
    idx = ends[:, None] - back[None, :]  # [C, W] positions compared with the suffix
    valid = idx >= 0
    equal = (seq[np.clip(idx, 0, None)] == seq[n - 1 - back][None, :]) & valid  # [C, W]
    match_len = np.cumprod(equal, axis=1).sum(axis=1)  # [C]
    if match_len.max() < min_match:
        return []
    best = ends[match_len == match_len.max()].max()  # the most recent of the longest matches
    # The match repeats the text every `period` tokens; past the sequence's end it goes on so.
    period = n - 1 - best
    return seq[best + 1 + np.arange(max_drafts) % period].tolist()
