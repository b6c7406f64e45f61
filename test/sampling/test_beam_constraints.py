"""Beam search with grammars, stop text and min_new_tokens, without a server: matcher forks are
independent on both backends; a selection's forks copy each parent matcher before any advances;
stop strings and stop_regex finish candidates as stop tokens do (held back by min_new_tokens);
the detokenizer cuts each returned beam's text at its own match."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang.srt.beam_search.grammar_rows import GrammarRefused, fork_grammars, grammar_stop_ids
from sglang.srt.beam_search.group import BeamGroup, FinishedBeam
from sglang.srt.beam_search.selection import Ranked, joint_select, rank_candidates, row_candidates, walk_candidates
from sglang.srt.beam_search.stop_text import StopMatch, candidate_stops, match_stop_text, ranked_text_stops
from sglang.srt.beam_search.types import BeamSequence
from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject, GrammarKey
from sglang.srt.constrained.bitmask import bitmask_width
from sglang.srt.constrained.grammar_backends import create_grammar_backend
from sglang.srt.managers.detokenizer_manager import DetokenizerManager
from sglang.srt.managers.io_struct import BatchTokenOut, TokenOut
from sglang.srt.sampling.sampling_params import SamplingParams

VOCAB = 49152

# ----------------------------------------------------------------------------- fork


@pytest.fixture(scope="module")
def tokenizer(gguf_path):
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    return get_tokenizer(gguf_path)


@pytest.fixture(scope="module", params=["xgrammar", "llguidance"])
def backend(request, tokenizer):
    backend = create_grammar_backend(request.param, tokenizer, VOCAB, [tokenizer.eos_token_id])
    yield backend
    backend.shutdown()


def allowed(grammar) -> list[int]:
    mask = torch.zeros(1, bitmask_width(VOCAB), dtype=torch.int32)
    grammar.fill_vocab_mask(mask, 0)
    bits = (mask[0].unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1  # [W, 32]
    return torch.nonzero(bits.flatten()[:VOCAB]).flatten().tolist()


def char_ids(tokenizer, text: str) -> list[int]:
    """One token per character (so a prefix can be accepted a piece at a time)."""
    out = [tokenizer.encode(ch, add_special_tokens=False) for ch in text]
    assert all(len(t) == 1 for t in out)
    return [t[0] for t in out]


def test_fork_is_independent_of_the_original(backend, tokenizer):
    eos = tokenizer.eos_token_id
    compiled = backend.compile_async(GrammarKey("regex", "(cat|car|dog)s?")).result()
    original = backend.new_matcher(compiled, [eos])
    c, a, t, s, r = char_ids(tokenizer, "catsr")
    assert original.accept_token(c) and original.accept_token(a)
    after_ca = allowed(original)
    fork = original.fork()
    assert type(fork) is type(original) and allowed(fork) == after_ca  # the same state

    assert fork.accept_token(t) and fork.accept_token(s)
    assert allowed(fork) == [eos]  # "cats" is complete
    assert allowed(original) == after_ca  # advancing the fork does not move the original

    assert original.accept_token(r)
    assert s in allowed(original) and allowed(original) != after_ca
    assert allowed(fork) == [eos]  # the fork did not see "car"
    assert fork.accept_token(eos) and fork.is_terminated() and not original.is_terminated()


def test_fork_of_a_terminated_matcher_stays_terminated(backend, tokenizer):
    eos = tokenizer.eos_token_id
    grammar = backend.new_matcher(backend.compile_async(GrammarKey("regex", "yes")).result(), [eos])
    assert all(grammar.accept_token(t) for t in char_ids(tokenizer, "yes"))
    assert grammar.accept_token(eos)
    assert grammar.fork().is_terminated()


class NoFork(BaseGrammarObject):
    def accept_token(self, token: int) -> bool:
        return True

    def rollback(self, num_tokens: int) -> None:
        pass

    def is_terminated(self) -> bool:
        return False

    def fill_vocab_mask(self, bitmask: torch.Tensor, row: int) -> None:
        pass


def test_base_fork_names_the_class_and_is_not_abstract():
    with pytest.raises(NotImplementedError, match="NoFork"):
        NoFork().fork()


# ----------------------------------------------------------------------------- grammar rows


class Recorder:
    """A matcher that is its accepted tokens; refuses the ids in `refuse`."""

    def __init__(self, tokens: list[int], refuse: frozenset[int] = frozenset()) -> None:
        self.tokens, self.refuse = list(tokens), refuse

    def fork(self) -> "Recorder":
        return Recorder(self.tokens, self.refuse)

    def accept_token(self, token: int) -> bool:
        if token in self.refuse:
            return False
        self.tokens.append(token)
        return True


def test_fork_grammars_copies_each_parent_before_any_advances():
    old = [Recorder([10]), Recorder([11]), Recorder([12])]
    # Row 0 continues beam 1, row 1 its own beam 1, row 2 beam 0 (row 0's old state).
    new = fork_grammars(old, [1, 1, 0], [5, 6, 7])
    assert [g.tokens for g in new] == [[11, 5], [11, 6], [10, 7]]
    assert new[1] is old[1]  # a row that continues its own beam keeps its matcher
    assert new[0] is not old[1] and new[2] is not old[0]
    assert old[0].tokens == [10] and old[2].tokens == [12]  # forks never moved their parents


def test_fork_grammars_at_the_spawn_forks_the_leader():
    leader = Recorder([])
    new = fork_grammars([leader], [0, 0, 0], [3, 4, 5])
    assert new[0] is leader and [g.tokens for g in new] == [[3], [4], [5]]


def test_fork_grammars_without_grammars_and_refusal():
    assert fork_grammars([None, None], [1, 1], [1, 2]) == [None, None]
    with pytest.raises(GrammarRefused, match="beam 1 rejected the selected token 9"):
        fork_grammars([Recorder([], frozenset({9}))], [0, 0], [1, 9])


def test_grammar_stop_ids_are_the_matcher_ends_even_with_ignore_eos():
    eos = {2}
    req = SimpleNamespace(sampling_params=SamplingParams(regex="a+", ignore_eos=True, stop_token_ids=[7]),
                          stop_token_ids=lambda: {7} | eos)
    assert grammar_stop_ids(req) == {2, 7}
    req.sampling_params = SamplingParams(ignore_eos=True)
    assert grammar_stop_ids(req) == set()


# ----------------------------------------------------------------------------- stop text


class CharTokenizer:
    """Token t is the character chr(t)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def params(**kw) -> SamplingParams:
    p = SamplingParams(**kw)
    p.normalize(CharTokenizer())
    return p


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_match_stop_text_strings_then_regex():
    tok = CharTokenizer()
    p = params(stop=["END"], stop_regex=[r"\d{3}"])
    assert match_stop_text(tok, p, ids("abc EN")) is None
    assert match_stop_text(tok, p, ids("abc END")) == StopMatch("END", "END")
    assert match_stop_text(tok, p, ids("x 4217")) == StopMatch(r"\d{3}", "421")
    assert match_stop_text(None, p, ids("END")) is None
    assert match_stop_text(tok, params(), ids("END")) is None


def test_candidate_stops_extend_each_parent_and_respect_min_new_tokens():
    tok = CharTokenizer()
    histories = [ids("xE"), ids("yN")]
    parents, tokens, valid = [0, 1, 1, 0], ids("NDDN"), [True, True, True, False]
    p = params(stop=["EN", "ND"])
    got = candidate_stops(histories, parents, tokens, valid, p, tok)
    # "xEN" hits EN; "yND" hits ND (twice); the invalid candidate is never decoded.
    assert got == [StopMatch("EN", "EN"), StopMatch("ND", "ND"), StopMatch("ND", "ND"), None]
    held = params(stop=["EN", "ND"], min_new_tokens=4)
    assert candidate_stops(histories, parents, tokens, valid, held, tok) == [None] * 4
    assert candidate_stops(histories, parents, tokens, valid, params(stop=["EN"], min_new_tokens=3), tok)[0] is not None


def test_text_stops_finish_candidates_as_stop_tokens_do():
    """A text-stop mask over ranked candidates walks exactly as if those candidates' tokens were
    stop ids."""
    g = torch.Generator().manual_seed(1)
    width, groups = 3, 4
    cand = row_candidates(torch.randn(groups * width, 40, generator=g), 2 * width)
    lp, tk = cand.logprobs.view(groups, width, -1), cand.token_ids.view(groups, width, -1)
    cum = torch.randn(groups, width, generator=g)
    final = torch.tensor([False, False, True, False])
    ranked = rank_candidates(cum, lp, tk)
    # Stop "by text" on the ranked tokens at positions 0 and 2 of each request: use those tokens
    # as stop ids for the comparison (tokens are distinct within a parent; pick unique ones).
    text = torch.zeros(groups, 2 * width, dtype=torch.bool)
    stops = torch.full((groups, 2), -1)
    for gi in range(groups):
        toks = ranked.token_ids[gi].tolist()
        picks = [j for j in (0, 2) if toks.count(toks[j]) == 1]
        for n, j in enumerate(picks):
            text[gi, j] = True
            stops[gi, n] = toks[j]
    by_text = walk_candidates(ranked, torch.full((groups, 1), -1), width, final, text)
    by_token = joint_select(cum, lp, tk, stops, width, final)
    assert torch.equal(by_text.survives, by_token.survives)
    assert torch.equal(by_text.finishes, by_token.finishes)
    assert by_text.finishes[0, 0] and not by_text.survives[0, 0]


def test_ranked_text_stops_only_for_requests_with_stop_text():
    tok = CharTokenizer()
    with_stop = SimpleNamespace(tokenizer=tok, sampling_params=params(stop=["ab"]), output_ids=ids("a"))
    plain = SimpleNamespace(tokenizer=tok, sampling_params=params(), output_ids=ids("a"))
    groups = [SimpleNamespace(leader=with_stop, rows=[with_stop]), SimpleNamespace(leader=plain, rows=[plain])]
    ranked = Ranked(torch.tensor([ids("bc"), ids("bc")]), torch.zeros(2, 2, dtype=torch.int64),
                    torch.tensor([[-1.0, float("-inf")], [-1.0, -2.0]]))
    mask, matches = ranked_text_stops(groups, ranked.parents, ranked.token_ids, ranked.scores)
    assert mask.tolist() == [[True, False], [False, False]]
    assert matches == [[StopMatch("ab", "ab"), None], [None, None]]
    assert ranked_text_stops(groups[1:], ranked.parents[1:], ranked.token_ids[1:], ranked.scores[1:])[0] is None


def test_a_stop_text_beam_keeps_its_match_in_the_result():
    group = BeamGroup(width=2, num_return=2, length_penalty=1.0, max_new_tokens=8, stop_ids=[])
    group.finished = [FinishedBeam([1, 2, 3], -1.0, "END", "END"), FinishedBeam([4, 5], -4.0, None)]
    best, other = group.results()
    assert best.finish_reason == {"type": "stop", "matched": "END"} and best.matched_text == "END"
    assert other.finish_reason == {"type": "length", "length": 2} and other.matched_text is None


# ----------------------------------------------------------------------------- detokenizer


def test_detokenizer_cuts_each_beam_at_its_own_match(tokenizer):
    text_ids = tokenizer.encode("The fox. The end", add_special_tokens=False)
    eos = tokenizer.eos_token_id

    def out(no_stop_trim: bool) -> TokenOut:
        beams = [
            BeamSequence(list(text_ids), {"type": "stop", "matched": "fox"}, -1.0, matched_text="fox"),
            BeamSequence(list(text_ids), {"type": "stop", "matched": r"T\w+ e"}, -2.0, matched_text="The e"),
            BeamSequence(list(text_ids) + [eos], {"type": "stop", "matched": eos}, -3.0),
            BeamSequence(list(text_ids), {"type": "length", "length": len(text_ids)}, -4.0),
        ]
        return TokenOut(rid="r", new_output_ids=list(text_ids), finished_reason=beams[0].finish_reason,
                        prompt_tokens=1, completion_tokens=len(text_ids), no_stop_trim=no_stop_trim,
                        matched_text="fox", beam_results=beams)

    got = DetokenizerManager(tokenizer).handle(BatchTokenOut(outs=[out(False)])).outs[0]
    assert [b.text for b in got.token.beam_results] == ["The ", "The fox. ", "The fox. The end", "The fox. The end"]
    assert got.new_text == "The "  # the answer is cut as its (best) beam
    kept = DetokenizerManager(tokenizer).handle(BatchTokenOut(outs=[out(True)])).outs[0]
    assert all(b.text.startswith("The fox. The end") for b in kept.token.beam_results)


def test_masked_out_candidates_keep_the_survivors_going():
    """Fewer than k survivors ends a request when stops took the candidates (SGLang's rule), but
    not when masks left fewer than 2k finite candidates; no survivor at all always ends it."""
    inf = float("-inf")
    width = 2
    ranked = Ranked(
        torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8]]),
        torch.zeros(4, 4, dtype=torch.int64),
        torch.tensor([[-1.0, inf, inf, inf],  # one finite candidate: goes on with one live beam
                      [-1.0, -2.0, -3.0, -4.0],  # three stops among four: ends
                      [-1.0, -2.0, inf, inf],  # a stop and a survivor, masks: goes on
                      [-1.0, inf, inf, inf]]),  # its only candidate stops: ends
    )
    stops = torch.tensor([[-1, -1, -1], [6, 7, 8], [5, -1, -1], [5, -1, -1]])
    sel = walk_candidates(ranked, stops, width, torch.zeros(4, dtype=torch.bool))
    assert sel.survives.sum(dim=1).tolist() == [1, 1, 1, 0]
    assert sel.ends.tolist() == [False, True, False, True]
    assert sel.finishes[2].tolist() == [True, False, False, False]
