"""NGRAM draft lookup (speculative/ngram.py): the longest, then most recent, earlier match of the
request's suffix, and its continuation extended by the match's period past the sequence's end;
and when an NGRAM server's next step waits for the in-flight one (managers/spec_decode.py)."""

from __future__ import annotations

from types import SimpleNamespace

from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.ngram import ngram_drafts


def test_the_longest_match_wins_over_a_more_recent_shorter_one():
    # Suffix [7, 8, 9]: matched in full at 0..2 (then 4, 5), only [8, 9] at 7..8 and 11..12.
    tokens = [7, 8, 9, 4, 5, 0, 2, 8, 9, 6, 1, 8, 9, 0, 7, 8, 9]
    assert ngram_drafts(tokens, 2, 8) == [4, 5]


def test_a_match_near_the_end_repeats_its_period():
    assert ngram_drafts([5, 1, 2, 3, 1, 2], 5, 8) == [3, 1, 2, 3, 1]
    assert ngram_drafts([9, 9, 4, 4, 4], 4, 8) == [4, 4, 4, 4]


def test_a_match_shorter_than_the_minimum_drafts_nothing():
    tokens = [5, 1, 2, 3, 7, 2]  # suffix [2] matches at 2 only; [7, 2] nowhere
    assert ngram_drafts(tokens, 2, 8, min_match=1) == [3, 7]
    assert ngram_drafts(tokens, 2, 8, min_match=2) == []
    assert ngram_drafts([5, 1, 2, 3, 1, 2], 2, 8, min_match=2) == [3, 1]  # [1, 2] matches


def test_no_earlier_occurrence_of_the_last_token_gives_no_drafts():
    assert ngram_drafts([1, 2, 3], 4, 8) == []
    assert ngram_drafts([1, 1], 0, 8) == []


def _spec(disable_batch_size: int = 4):
    from sglang.srt.managers.spec_decode import SpecDecoding

    args = SimpleNamespace(speculative_algorithm="NGRAM", speculative_num_steps=3, speculative_ngram_max_trie_depth=8,
                           speculative_ngram_min_match_window_size=1,
                           speculative_disable_batch_size=disable_batch_size)
    return SpecDecoding(args, builder=None, tree_cache=None, context_len=4096)


def _req(tokens: list[int]) -> SimpleNamespace:
    return SimpleNamespace(fill_ids=tokens, origin_input_ids=tokens[:2], output_ids=tokens[2:], kv_len=len(tokens),
                           sampling_params=SimpleNamespace(max_new_tokens=100))


def test_ngram_steps_overlap_unless_the_next_one_may_verify():
    """Under the overlap schedule the scheduler reads the in-flight step first only after a
    verify, or when the history without the in-flight token already finds drafts."""
    spec = _spec()
    decode, verify = SimpleNamespace(spec=None), SimpleNamespace(spec=object())
    no_match = [_req([1, 2, 3]), _req([4, 5])]
    match = [_req([1, 2, 3]), _req([4, 5, 4])]
    assert spec.overlaps
    assert spec.must_settle(verify, no_match)
    assert not spec.must_settle(decode, no_match)
    assert spec.must_settle(decode, match)
    assert not spec.must_settle(decode, [])
    assert not _spec(disable_batch_size=1).must_settle(decode, match)  # decodes without speculation anyway


def test_no_verify_while_a_decode_step_of_the_batch_is_in_flight():
    """The requests' host histories lack the in-flight step's tokens: a verify built now would
    forward from a stale last token, so the step decodes (a prefill in flight does not matter)."""
    spec = _spec()
    spec.builder = SimpleNamespace(decode_step=lambda batch: "decode")
    spec._refresh_penalties = lambda batch: None
    spec._verify_step = lambda batch, drafts: "verify"
    batch = SimpleNamespace(reqs=[_req([1, 2, 3]), _req([4, 5, 4])])
    assert spec.next_step(batch, SimpleNamespace(mode=ForwardMode.DECODE)) == "decode"
    assert spec.next_step(batch, SimpleNamespace(mode=ForwardMode.EXTEND)) == "verify"
    assert spec.next_step(batch) == "verify"


def test_a_draftless_finding_is_reused_only_for_unchanged_histories():
    """must_settle's lookup that found no drafts stands for next_step while no request gained a
    token; a request that did is looked up again."""
    spec = _spec()
    decoded = []
    spec.builder = SimpleNamespace(decode_step=lambda batch: decoded.append(batch) or "decode")
    spec._refresh_penalties = lambda batch: None
    looked_up = []
    lookup = spec._drafts
    spec._drafts = lambda reqs: looked_up.append(len(reqs)) or lookup(reqs)
    batch = SimpleNamespace(reqs=[_req([1, 2, 3]), _req([4, 5])])
    assert not spec.must_settle(SimpleNamespace(spec=None), batch.reqs)
    assert spec.next_step(batch) == "decode" and looked_up == [2]
    batch.reqs[1].output_ids.append(9)  # its history changed: the finding no longer holds
    assert not spec.must_settle(SimpleNamespace(spec=None), batch.reqs)
    batch.reqs[0].output_ids.append(7)
    assert spec.next_step(batch) == "decode" and looked_up == [2, 2, 2]
