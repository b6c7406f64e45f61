"""Speculative decoding end to end (sglang.Engine, embedded SmolLM2, deterministic mode): NGRAM
and STANDALONE (a tiny random draft with SmolLM2's vocabulary) give the tokens that decoding
without speculation gives, for every sampling knob; logprobs agree within the float rounding of
the verify's extend kernels (docs/speculative.md)."""

from __future__ import annotations

import pytest

import sglang as sgl
from family_utils import save_tiny
from sglang.srt.server_args import prepare_server_args

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LOGPROB_ATOL = 1e-4
MAX_NEW = 16
# The answer repeats the prompt's text, so NGRAM drafts are found and mostly accepted.
COPY = ("Copy the list exactly.\nList: apples, pears, plums, figs, limes, dates, kiwis.\n"
        "Copy: apples, pears, plums, figs, limes, dates, kiwis.\nList: apples, pears, plums, figs, limes, dates, kiwis.\nCopy:")
FREE = "Write a short poem about the sea."
NGRAM_PROCESSOR = '{"name": "DeepseekOCRNoRepeatNGramLogitProcessor"}'
KNOBS = {
    "greedy": dict(temperature=0.0),
    "sampled": dict(temperature=0.9, top_k=40, top_p=0.9, min_p=0.02, sampling_seed=7),
    "penalties": dict(temperature=0.8, frequency_penalty=0.6, presence_penalty=0.3, repetition_penalty=1.2,
                      sampling_seed=3),
    "logit_bias": dict(temperature=0.0, logit_bias={"28": 4.0, "30": -5.0}),
    "min_new_tokens": dict(temperature=0.0, min_new_tokens=12, stop_token_ids=[28, 30]),
    "stop_token": dict(temperature=0.0, stop_token_ids=[28]),
    "stop_string": dict(temperature=0.0, stop=["figs"]),
    "regex": dict(temperature=0.7, regex=r"( [a-z]+,){3} [a-z]+\.", sampling_seed=5),
    "json": dict(temperature=0.0, json_schema='{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}'),
    # Batch-level processors: the copy answer repeats the prompt's trigrams, which this bans.
    "no_repeat_ngram": dict(temperature=0.0, no_repeat_ngram_size=3),
    "bad_words": dict(temperature=0.0, bad_words=["plums"]),
    # Forced tokens leave the copy, so drafts are rejected after them: the watermark state keeps
    # only the emitted positions' contexts (a short window makes contexts repeat).
    "watermark": dict(temperature=1.0, sampling_seed=11, watermark={"key": "0123456789abcdef", "context_window": 2}),
    "watermark_off": dict(temperature=1.0, sampling_seed=11),
}


def _engine(**kw):
    return sgl.Engine(log_level="warning", enable_deterministic_inference=True, max_running_requests=8,
                      enable_custom_logit_processor=True, enable_watermark=True, **kw)


@pytest.fixture(scope="module")
def draft_path(tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("draft"))
    save_tiny(folder, "LlamaConfig", "LlamaForCausalLM", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, std=0.05)
    return folder


@pytest.fixture(scope="module")
def engines(gguf_path: str, draft_path: str):
    """(spec off, NGRAM, STANDALONE) answers, computed once for every case."""
    answers = []
    for kw in ({}, {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 6},
               {"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": draft_path,
                "speculative_num_steps": 3}):
        with _engine(model_path=gguf_path, speculative_disable_batch_size=32, **kw) as llm:
            answers.append(_run_cases(llm))
            if kw:
                answers[-1]["refusals"] = _refusals(llm)
    return answers


REFUSED = {"beam_width": {"beam_width": 2}, "guidance": {"guidance": {"method": "cfg", "text": "Hello", "weight": 1.5}}}


def _refusals(llm) -> dict:
    """The error each feature that speculation refuses gets (None: accepted)."""
    errors = {}
    for name, extra in REFUSED.items():
        try:
            llm.generate(COPY, {"temperature": 0.0, "max_new_tokens": 2, **extra})
            errors[name] = None
        except ValueError as err:
            errors[name] = str(err)
    return errors


def _run_cases(llm) -> dict:
    """Every knob's request in one batch (deterministic mode: a row's tokens do not depend on its
    batch-mates), then n = 2, a stream and the free-text prompt alone."""
    params = [{"max_new_tokens": MAX_NEW, **p} for p in KNOBS.values()]
    params.append({"max_new_tokens": MAX_NEW, "temperature": 0.0, "custom_params": {"ngram_size": 2, "window_size": 40}})
    params.append({"max_new_tokens": MAX_NEW, "temperature": 0.0})
    outs = llm.generate([COPY] * (len(params) - 1) + [FREE], params, return_logprob=True, top_logprobs_num=2,
                        custom_logit_processor=NGRAM_PROCESSOR)
    answers = dict(zip(list(KNOBS) + ["custom_processor", "free_in_batch"], outs))
    greedy = {"temperature": 0.0, "max_new_tokens": MAX_NEW}
    answers["n2"] = llm.generate(COPY, {"temperature": 0.8, "n": 2, "sampling_seed": 1, "max_new_tokens": MAX_NEW})
    answers["stream"] = list(llm.generate(COPY, greedy, stream=True))[-1]
    answers["free_alone"] = llm.generate(FREE, greedy)
    return answers


def _same(want: dict, got: dict) -> None:
    assert got["output_ids"] == want["output_ids"]
    assert got["meta_info"]["finish_reason"] == want["meta_info"]["finish_reason"]
    if "text" in want:
        assert got["text"] == want["text"]
    w, g = want["meta_info"].get("output_token_logprobs"), got["meta_info"].get("output_token_logprobs")
    assert (w is None) == (g is None)
    for a, b in zip(w or (), g or ()):
        assert a[1] == b[1] and abs(a[0] - b[0]) < LOGPROB_ATOL
    for a, b in zip(want["meta_info"].get("output_top_logprobs") or (), got["meta_info"].get("output_top_logprobs") or ()):
        assert [t[1] for t in a] == [t[1] for t in b]


@pytest.mark.parametrize("algorithm", [1, 2], ids=["NGRAM", "STANDALONE"])
@pytest.mark.parametrize("case", sorted(KNOBS) + ["custom_processor", "n2", "free_in_batch", "stream"])
def test_speculation_changes_nothing_but_speed(engines, algorithm, case):
    want, got = engines[0][case], engines[algorithm][case]
    if isinstance(want, list):
        assert len(got) == len(want)
        for a, b in zip(want, got):
            _same(a, b)
    else:
        _same(want, got)


def test_a_mixed_batch_equals_each_row_alone(engines):
    """The free-text row beside copy-friendly rows (drafts found) equals it alone (no drafts)."""
    for answers in engines:
        assert answers["free_in_batch"]["output_ids"] == answers["free_alone"]["output_ids"]
    assert engines[1]["free_alone"]["output_ids"] == engines[0]["free_alone"]["output_ids"]


def test_spec_meta_info(engines):
    plain, ngram = engines[0]["greedy"]["meta_info"], engines[1]["greedy"]["meta_info"]
    assert "spec_verify_ct" not in plain
    assert ngram["spec_verify_ct"] >= 1 and ngram["spec_draft_token_num"] >= ngram["spec_accept_token_num"] > 0
    assert ngram["spec_accept_length"] == ngram["completion_tokens"] / ngram["spec_verify_ct"] > 1.0
    assert ngram["spec_verify_ct"] < ngram["completion_tokens"]


def test_the_watermark_forces_tokens_under_speculation(engines):
    for answers in engines:
        assert answers["watermark"]["output_ids"] != answers["watermark_off"]["output_ids"]
    assert engines[1]["watermark"]["meta_info"]["spec_verify_ct"] < MAX_NEW


def test_features_that_add_rows_are_refused_under_speculation(engines):
    for answers in engines[1:]:
        for name, error in answers["refusals"].items():
            assert error is not None and name in error and "speculative" in error


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3", "NEXTN"])
def test_draft_head_algorithms_are_refused_naming_the_flag(algorithm):
    args = prepare_server_args(["--speculative-algorithm", algorithm])
    with pytest.raises(ValueError, match=f"--speculative-algorithm {algorithm}"):
        args.resolve()


def test_only_one_draft_chain():
    args = prepare_server_args(["--speculative-algorithm", "NGRAM", "--speculative-eagle-topk", "4"])
    with pytest.raises(ValueError, match="--speculative-eagle-topk"):
        args.resolve()
