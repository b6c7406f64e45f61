"""Req.check_finished: SGLang's stop order with our fixes (ignore_eos = EOS only, min_new_tokens holds back text stops)."""

from __future__ import annotations

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.sampling.sampling_params import SamplingParams


class _CharTokenizer:
    """Token id i <-> chr(ord('a') + i); 25 is the EOS."""

    eos_token_id = 25

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + i) for i in ids)

    def encode(self, text, add_special_tokens=False):
        return [ord(c) - ord("a") for c in text]


def _run(tokens, **params):
    sp = SamplingParams(**params)
    tok = _CharTokenizer()
    sp.normalize(tok)
    req = Req("r", [0], sp, eos_token_ids={24}, tokenizer=tok)
    for t in tokens:
        req.output_ids.append(t)
        req.check_finished()
        if req.finished():
            break
    return req


def test_length():
    req = _run([1, 2, 3, 4], max_new_tokens=3)
    assert req.output_ids == [1, 2, 3] and req.finished_reason == {"type": "length", "length": 3}


def test_eos_from_model_and_tokenizer():
    assert _run([1, 24, 3]).finished_reason == {"type": "stop", "matched": 24}
    assert _run([1, 25, 3]).finished_reason == {"type": "stop", "matched": 25}


def test_ignore_eos_ignores_eos_only():
    req = _run([1, 24, 25, 7, 8], ignore_eos=True, stop_token_ids=[7])
    assert req.output_ids == [1, 24, 25, 7] and req.finished_reason == {"type": "stop", "matched": 7}


def test_stop_string_and_matched_text():
    req = _run([0, 1, 2, 3, 4], stop="bcd")  # "abcde"
    assert req.output_ids == [0, 1, 2, 3]
    assert req.finished_reason == {"type": "stop", "matched": "bcd"} and req.matched_text == "bcd"


def test_stop_regex_reports_pattern_and_text():
    req = _run([0, 3, 3, 3, 1], stop_regex="d+b")
    assert req.finished_reason == {"type": "stop", "matched": "d+b"} and req.matched_text == "dddb"


def test_min_new_tokens_holds_back_every_stop():
    req = _run([1, 2, 24, 25, 1, 2, 9], min_new_tokens=5, stop="bc", stop_regex="zz")
    # "bc" appears at tokens 1-2 and EOS at 2-3, all before 5 tokens; the next "bc" ends it.
    assert req.output_ids == [1, 2, 24, 25, 1, 2]
    assert req.finished_reason == {"type": "stop", "matched": "bc"}


def test_stop_checked_before_length():
    req = _run([1, 24], max_new_tokens=2)
    assert req.finished_reason == {"type": "stop", "matched": 24}
