"""SamplingParams: construction defaults, normalize, verify and the from_dict contract gate."""

from __future__ import annotations

import math

import pytest

from sglang.srt.sampling.sampling_params import (
    LOGIT_BIAS_MAX,
    MAX_LEN,
    MAX_STOP_COUNT,
    MAX_STOP_REGEX_COUNT,
    MAX_STOP_REGEX_LEN,
    TOP_K_ALL,
    SamplingParams,
    get_max_seq_length,
)

VOCAB = 1000


class FakeTokenizer:
    """One token per whitespace-separated word."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert add_special_tokens is False
        return list(range(len(text.split())))


def _verified(**kwargs) -> SamplingParams:
    params = SamplingParams(**kwargs)
    params.normalize(FakeTokenizer())
    params.verify(VOCAB)
    return params


# ---------------------------------------------------------------------- construction


def test_defaults_and_field_order():
    p = SamplingParams()
    assert (p.max_new_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (128, 1.0, 1.0, TOP_K_ALL, 0.0)
    assert (p.n, p.min_new_tokens, p.repetition_penalty, p.skip_special_tokens) == (1, 0, 1.0, True)
    names = list(p.to_dict())
    assert names[:3] == ["max_new_tokens", "stop", "stop_token_ids"]
    assert names.index("custom_params") == names.index("sampling_seed") + 1
    # SGLang's fields end at watermark; the built-in batch processors' parameters follow, then
    # beam search's length_penalty (SGLang fixes it at 1.0).
    assert names[names.index("watermark") + 1 :] == [
        "allowed_token_ids", "bad_words", "no_repeat_ngram_size", "thinking_token_budget", "length_penalty"
    ]


def test_constructor_is_keyword_only():
    with pytest.raises(TypeError):
        SamplingParams(16)  # type: ignore[misc]


@pytest.mark.parametrize("temperature", [0, 0.0, 1e-7])
def test_greedy_rewrite(temperature):
    p = SamplingParams(temperature=temperature, top_k=50)
    assert (p.temperature, p.top_k, p.is_greedy) == (1.0, 1, True)


@pytest.mark.parametrize("temperature", [1e-6, 0.7, -0.5, math.nan])
def test_no_greedy_rewrite(temperature):
    p = SamplingParams(temperature=temperature)
    assert p.top_k == TOP_K_ALL and not p.is_greedy
    assert p.temperature == temperature or math.isnan(temperature)


@pytest.mark.parametrize("top_k", [None, -1])
def test_top_k_all(top_k):
    assert SamplingParams(top_k=top_k).top_k == TOP_K_ALL


_NONE_DEFAULTS = {
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
}


def test_none_means_default():
    p = SamplingParams(**{name: None for name in _NONE_DEFAULTS})
    assert {name: getattr(p, name) for name in _NONE_DEFAULTS} == _NONE_DEFAULTS


@pytest.mark.parametrize(
    "given, expected", [([3, None, 3, 7], {3, 7}), ([], None), ([None], None), (None, None), ({5}, {5})]
)
def test_stop_token_ids_normalised(given, expected):
    assert SamplingParams(stop_token_ids=given).stop_token_ids == expected


@pytest.mark.parametrize("name", ["json_schema", "regex", "ebnf", "structural_tag"])
def test_empty_grammar_is_none(name):
    assert getattr(SamplingParams(**{name: ""}), name) is None


def test_seed_alias():
    assert SamplingParams(seed=7).sampling_seed == 7
    assert SamplingParams(seed=7, sampling_seed=7).sampling_seed == 7
    assert SamplingParams(sampling_seed=9).seed == 9
    with pytest.raises(ValueError, match="seed.*sampling_seed"):
        SamplingParams(seed=7, sampling_seed=8)


# ---------------------------------------------------------------------- verify

_BAD = [
    ({"beam_width": 0}, "beam_width"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"),
    ({"temperature": 10**400}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"top_p": math.nan}, "top_p"),
    ({"min_p": -0.01}, "min_p"),
    ({"min_p": 1.01}, "min_p"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"frequency_penalty": 2.01}, "frequency_penalty"),
    ({"frequency_penalty": -2.01}, "frequency_penalty"),
    ({"presence_penalty": 2.01}, "presence_penalty"),
    ({"presence_penalty": -2.01}, "presence_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": 2.01}, "repetition_penalty"),
    ({"min_new_tokens": -1}, "min_new_tokens"),
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"min_new_tokens": 5, "max_new_tokens": 4}, "min_new_tokens"),
    ({"logit_bias": {"-1": 1.0}}, "logit_bias"),
    ({"logit_bias": {str(VOCAB): 1.0}}, "logit_bias"),
    ({"logit_bias": {"abc": 1.0}}, "logit_bias"),
    ({"logit_bias": {"5": 100.5}}, "logit_bias"),
    ({"logit_bias": {"5": -100.5}}, "logit_bias"),
    ({"logit_bias": {"5": math.nan}}, "logit_bias"),
    ({"logit_bias": {"5": math.inf}}, "logit_bias"),
    ({"logit_bias": {"5": True}}, "logit_bias"),
    ({"sampling_seed": 2**63}, "sampling_seed"),
    ({"sampling_seed": -(2**63) - 1}, "sampling_seed"),
    ({"sampling_seed": True}, "sampling_seed"),
    ({"sampling_seed": 1.5}, "sampling_seed"),
    ({"custom_params": {"__sglang_reasoning_end_token_ids": []}}, "reasoning end token IDs"),
    ({"custom_params": {"__sglang_reasoning_end_token_ids": [VOCAB]}}, "reasoning end token IDs"),
    ({"regex": "a", "ebnf": "b"}, "Only one of json_schema, regex, ebnf, or structural_tag"),
    ({"n": 0}, "n must be at least 1"),
    ({"n": True}, "n must be at least 1"),
    ({"stream_interval": 0}, "stream_interval"),
    ({"beam_width": 2, "n": 3}, "beam_width"),
    ({"beam_width": 2, "max_new_tokens": 0}, "beam_width"),
    ({"beam_width": 2, "guidance": {"method": "cfg", "input_ids": [1], "weight": 2.0}}, "beam_width"),
    ({"beam_width": 2, "watermark": {"enabled": True}}, "beam_width"),
    ({"length_penalty": 2.0}, "length_penalty"),
    ({"watermark": {"key": 1}}, "watermark"),
]


@pytest.mark.parametrize("kwargs, name", _BAD, ids=[str(k) for k, _ in _BAD])
def test_verify_rejects(kwargs, name):
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs).verify(VOCAB)
    assert name in str(info.value)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"logit_bias": {"abc": 1.0}}, f"[0, {VOCAB - 1}]"),
        ({"logit_bias": {"5": 101}}, "[-100, 100]"),
        ({"sampling_seed": 2**63}, "[-2**63, 2**63 - 1]"),
        ({"min_new_tokens": 5, "max_new_tokens": 4}, "[0, max_new_tokens(4)]"),
    ],
)
def test_verify_messages_name_the_range(kwargs, fragment):
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs).verify(VOCAB)
    assert fragment in str(info.value)


def test_out_of_vocabulary_stop_token_ids_are_ignored():
    """They can never be produced: dropped, as SGLang ignores them, instead of refused."""
    params = SamplingParams(stop_token_ids=[3, VOCAB, -1, VOCAB + 7])
    params.verify(VOCAB)
    assert params.stop_token_ids == {3}
    only_oov = SamplingParams(stop_token_ids=[VOCAB])
    only_oov.verify(VOCAB)
    assert only_oov.stop_token_ids is None


def test_logit_bias_value_message_names_key():
    with pytest.raises(ValueError, match=r"logit_bias.*\[-100, 100\].*7"):
        SamplingParams(logit_bias={"7": 250.0}).verify(VOCAB)


def test_sampling_seed_type_message():
    with pytest.raises(ValueError, match="sampling_seed must be an integer, got bool"):
        SamplingParams(sampling_seed=False).verify(VOCAB)


@pytest.mark.parametrize("name", ["json_schema", "regex", "ebnf", "structural_tag"])
def test_one_grammar_field_passes_verify(name):
    # The grammar itself is checked by the grammar backend (test_structured_outputs_units).
    SamplingParams(**{name: "{}"}).verify(VOCAB)


_GOOD = [
    {"temperature": 0},
    {"temperature": 1e-6},
    {"temperature": 100.0},
    {"top_p": 1},
    {"top_p": 1e-9},
    {"min_p": 0},
    {"min_p": 1},
    {"top_k": -1},
    {"top_k": 1},
    {"top_k": VOCAB * 10},
    {"frequency_penalty": 2, "presence_penalty": -2},
    {"frequency_penalty": -2, "presence_penalty": 2},
    {"repetition_penalty": 2},
    {"repetition_penalty": 1e-9},
    {"min_new_tokens": 16, "max_new_tokens": 16},
    {"max_new_tokens": 0},
    {"max_new_tokens": None, "min_new_tokens": 10**6},
    {"logit_bias": {"0": LOGIT_BIAS_MAX, str(VOCAB - 1): -LOGIT_BIAS_MAX}},
    {"logit_bias": {3: 0}},
    {"sampling_seed": 2**63 - 1},
    {"sampling_seed": -(2**63)},
    {"seed": 0},
    {"n": 1},
    {"n": 8},
    {"beam_width": 1},
    # Beams honour stop text, grammars and min_new_tokens (SGLang refuses them).
    {"beam_width": 2, "stop": "x", "stop_regex": r"\d+"},
    {"beam_width": 2, "regex": "a+"},
    {"beam_width": 2, "json_schema": '{"type": "object"}'},
    {"beam_width": 2, "min_new_tokens": 3},
    {"stop_token_ids": [0, VOCAB - 1]},
    {"stream_interval": 1},
    {"custom_params": {"__sglang_reasoning_end_token_ids": [0, VOCAB - 1]}},
]


@pytest.mark.parametrize("kwargs", _GOOD, ids=[str(k) for k in _GOOD])
def test_verify_accepts(kwargs):
    _verified(**kwargs)


# ---------------------------------------------------------------------- normalize


def test_normalize_with_tokenizer():
    p = SamplingParams(stop=["a b c", "d"], stop_regex=r"(foo|bar)\d{2}")
    p.normalize(FakeTokenizer())
    assert (p.stop, p.stop_regex) == (None, None)
    assert (p.stop_strs, p.stop_regex_strs) == (["a b c", "d"], [r"(foo|bar)\d{2}"])
    assert (p.stop_str_max_len, p.stop_regex_max_len, p.is_normalized) == (3, 5, True)


def test_normalize_wraps_single_string_and_defaults():
    p = SamplingParams(stop="x y")
    p.normalize(FakeTokenizer())
    assert p.stop_strs == ["x y"] and p.stop_str_max_len == 2
    q = SamplingParams()
    q.normalize(FakeTokenizer())
    assert (q.stop_strs, q.stop_regex_strs, q.stop_str_max_len, q.stop_regex_max_len) == ([], [], 0, 0)


def test_normalize_is_idempotent():
    p = SamplingParams(stop="a b")
    p.normalize(FakeTokenizer())
    p.normalize(None)  # a second call must not re-run the tokenizer-free checks
    assert p.stop_strs == ["a b"] and p.stop_str_max_len == 2


def test_normalize_without_tokenizer():
    p = SamplingParams()
    p.normalize(None)
    assert p.is_normalized and p.stop_strs == []


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"stop": ["a"]}, "stop=['a'] is unavailable when skip_tokenizer_init=True"),
        ({"stop_regex": "a+"}, "stop_regex=['a+'] is unavailable when skip_tokenizer_init=True"),
        ({"min_new_tokens": 1}, "min_new_tokens=1 is unavailable when skip_tokenizer_init=True"),
    ],
)
def test_normalize_without_tokenizer_rejects(kwargs, fragment):
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs).normalize(None)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"stop": ["s"] * 33}, "at most 32 stop strings are allowed, got 33"),
        ({"stop_regex": ["r"] * 33}, "at most 32 stop_regex patterns are allowed, got 33"),
        ({"stop_regex": "é" * 129}, "stop_regex is 258 bytes, over the 256-byte limit"),
        ({"stop_regex": "(unclosed"}, "stop_regex"),
        ({"stop": ["ok", 3]}, "stop"),
    ],
)
def test_normalize_limits(kwargs, fragment):
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs).normalize(FakeTokenizer())
    assert fragment in str(info.value)


def test_normalize_limits_allow_the_maximum():
    longest_regex = "r" * MAX_STOP_REGEX_LEN
    p = SamplingParams(stop=["s"] * MAX_STOP_COUNT, stop_regex=[longest_regex] * MAX_STOP_REGEX_COUNT)
    p.normalize(FakeTokenizer())
    assert p.stop_regex_max_len == MAX_STOP_REGEX_LEN


@pytest.mark.parametrize(
    "regex, expected",
    [
        ("abc", 3),
        ("[a-z]", 1),
        ("a{2,4}", 4),
        ("abc|de", 3),
        (r"(foo|bar)\d{2}", 5),
        ("a?", 1),
        ("", 0),
        ("a*", MAX_LEN),
        ("a+", MAX_LEN),
        ("a{3,}", MAX_LEN),
        (r"^a.b$", 3),
        (r"\bx\b", 1),
        ("(?=a)b", MAX_LEN + 1),
    ],
)
def test_get_max_seq_length(regex, expected):
    assert get_max_seq_length(regex) == expected


# ---------------------------------------------------------------------- from_dict / to_dict


def test_from_dict_roundtrip():
    d = {"max_new_tokens": 8, "stop": ["x"], "stop_token_ids": [2, 1], "temperature": 1, "top_k": -1,
         "logit_bias": {"3": 1.5}, "seed": 11, "custom_params": {"k": [1, 2]}, "ignore_eos": True}
    p = SamplingParams.from_dict(d)
    assert (p.sampling_seed, p.stop_token_ids, p.top_k, p.ignore_eos) == (11, {1, 2}, TOP_K_ALL, True)
    out = p.to_dict()
    assert out["stop_token_ids"] == [1, 2] and "seed" not in out
    assert SamplingParams(**out) == p


def test_to_dict_after_normalize_keeps_stop_conditions():
    p = SamplingParams(stop="a", stop_regex="b+")
    p.normalize(FakeTokenizer())
    q = SamplingParams(**p.to_dict())
    q.normalize(FakeTokenizer())
    assert (q.stop_strs, q.stop_regex_strs) == (["a"], ["b+"])


def test_to_message_round_trips_the_normalized_params_without_a_tokenizer():
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput, decoder, encode

    p = _verified(stop=["a b c", "d"], stop_regex="x+", stop_token_ids=[7, 3], bad_words=["no"], sampling_seed=5)
    wire = encode(TokenizedGenerateReqInput(rid="r", input_ids=[1], sampling_params=p.to_message()))
    q = SamplingParams.from_message(decoder(TokenizedGenerateReqInput).decode(wire).sampling_params)
    assert q.is_normalized and q.stop_token_ids == {3, 7}
    derived = ("stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len", "bad_words_token_ids")
    assert {name: getattr(q, name) for name in derived} == {name: getattr(p, name) for name in derived}
    assert q.to_dict() == p.to_dict()
    q.normalize(None)  # already normalized: no tokenizer is needed, and none is called
    assert q.stop_str_max_len == 3


def test_from_message_refuses_params_that_were_not_normalized():
    with pytest.raises(ValueError, match="to_message"):
        SamplingParams.from_message(SamplingParams(stop="a").to_dict())
    with pytest.raises(ValueError, match="normalize"):
        SamplingParams(stop="a").to_message()


def test_from_dict_null_means_default():
    d = {"temperature": None, "top_k": None, "n": None, "stop": None, "choice": None}
    p = SamplingParams.from_dict(d)
    assert (p.temperature, p.top_k, p.n, p.stop) == (1.0, TOP_K_ALL, 1, None)


def test_from_dict_unknown_field():
    with pytest.raises(ValueError) as info:
        SamplingParams.from_dict({"temperature": 0.5, "best_of": 2})
    msg = str(info.value)
    assert msg.startswith("unknown field `best_of`, expected one of `max_new_tokens`, `stop`, ")
    assert "`seed`" in msg


@pytest.mark.parametrize(
    "key, value",
    [
        ("max_new_tokens", 1.5),
        ("max_new_tokens", True),
        ("max_new_tokens", "16"),
        ("top_k", 5.0),
        ("n", False),
        ("temperature", "0.5"),
        ("temperature", True),
        ("top_p", [1]),
        ("ignore_eos", 1),
        ("skip_special_tokens", "true"),
        ("stop", 5),
        ("stop", ["a", 1]),
        ("stop_regex", {"a": 1}),
        ("stop_token_ids", 5),
        ("stop_token_ids", [1, "2"]),
        ("stop_token_ids", [1, True]),
        ("logit_bias", [1, 2]),
        ("logit_bias", {"1": "high"}),
        ("custom_params", "x"),
        ("sampling_seed", 1.0),
        ("seed", "1"),
        ("regex", 3),
    ],
)
def test_from_dict_type_errors(key, value):
    with pytest.raises(ValueError) as info:
        SamplingParams.from_dict({key: value})
    assert f"`{key}`" in str(info.value) and "expected" in str(info.value)


def test_from_dict_rejects_choice_and_non_objects():
    with pytest.raises(ValueError, match="choice"):
        SamplingParams.from_dict({"choice": ["a", "b"]})
    with pytest.raises(ValueError, match="sampling_params must be an object"):
        SamplingParams.from_dict([1, 2])  # type: ignore[arg-type]


def test_from_dict_accepts_ints_for_floats():
    p = SamplingParams.from_dict({"temperature": 2, "top_p": 1, "repetition_penalty": 1})
    p.verify(VOCAB)
    assert p.temperature == 2
