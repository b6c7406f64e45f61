import os
import pickle
import pickletools

import dill
import orjson
import pytest
import torch

from sglang.srt.sampling.custom_logit_processor import (
    DISABLED_MESSAGE,
    CustomLogitProcessor,
    CustomLogitProcessorError,
    DeepSeekR1ThinkingBudgetLogitProcessor,
    DeepseekOCRNoRepeatNGramLogitProcessor,
    DisallowedTokensLogitsProcessor,
    Glm4MoeThinkingBudgetLogitProcessor,
    Qwen3ThinkingBudgetLogitProcessor,
    ThinkingBudgetLogitProcessor,
    load_custom_logit_processor,
    qualified_name,
    register_custom_logit_processor,
)

NEG_INF = float("-inf")
BUILTIN_DISALLOWED = "sglang.srt.sampling.custom_logit_processor.DisallowedTokensLogitsProcessor"


class FakeReq:
    def __init__(self, origin_input_ids, output_ids):
        self.origin_input_ids = list(origin_input_ids)
        self.output_ids = list(output_ids)


class AddOneProcessor(CustomLogitProcessor):
    """Importable from this test module, so dill pickles it by reference."""

    def __call__(self, logits, custom_param_list=None):
        return logits + 1


def _hex_callable(payload: bytes) -> str:
    return orjson.dumps({"callable": payload.hex()}).decode()


# --------------------------------------------------------------------------- serialization


def test_to_str_is_json_with_hex_dill_of_the_class():
    s = DisallowedTokensLogitsProcessor.to_str()
    data = orjson.loads(s)
    assert list(data) == ["callable"]
    assert dill.loads(bytes.fromhex(data["callable"])) is DisallowedTokensLogitsProcessor


def test_round_trip_builtin():
    proc = CustomLogitProcessor.from_str(Qwen3ThinkingBudgetLogitProcessor.to_str())
    assert type(proc) is Qwen3ThinkingBudgetLogitProcessor


def test_round_trip_by_value_class():
    def make():
        class Local(CustomLogitProcessor):
            def __call__(self, logits, custom_param_list=None):
                return logits * 2

        return Local

    proc = CustomLogitProcessor.from_str(make().to_str())
    assert torch.equal(proc(torch.ones(1, 3)), torch.full((1, 3), 2.0))


def test_cache_identity():
    def make():
        class Local(CustomLogitProcessor):
            def __call__(self, logits, custom_param_list=None):
                return logits

        return Local

    s = make().to_str()  # by value: without the cache each load would build a new class
    a, b = CustomLogitProcessor.from_str(s), CustomLogitProcessor.from_str(s)
    assert type(a) is type(b)
    assert a is not b


def test_by_reference_pickle_for_importable_classes():
    for cls in (DisallowedTokensLogitsProcessor, AddOneProcessor):
        ops = [op.name for op, _, _ in pickletools.genops(dill.dumps(cls))]
        assert "REDUCE" not in ops and "BUILD" not in ops
        assert ops.count("STACK_GLOBAL") == 1


# --------------------------------------------------------------------------- loader


def test_registry_reference_form():
    proc = load_custom_logit_processor('{"name": "DeepseekOCRNoRepeatNGramLogitProcessor"}')
    assert type(proc) is DeepseekOCRNoRepeatNGramLogitProcessor


def test_registry_unknown_name_lists_registered():
    with pytest.raises(CustomLogitProcessorError) as e:
        load_custom_logit_processor('{"name": "Nope"}')
    msg = str(e.value)
    assert msg.startswith("custom_logit_processor") and "Nope" in msg
    assert "Qwen3ThinkingBudgetLogitProcessor" in msg


def test_register_user_processor_and_allowlist_check_on_name():
    register_custom_logit_processor("add_one", AddOneProcessor)
    register_custom_logit_processor("add_one", AddOneProcessor)  # idempotent
    assert type(load_custom_logit_processor('{"name": "add_one"}')) is AddOneProcessor
    allowed = frozenset({qualified_name(AddOneProcessor)})
    proc = load_custom_logit_processor('{"name": "add_one"}', allowlist=allowed)
    assert type(proc) is AddOneProcessor
    with pytest.raises(CustomLogitProcessorError, match="allowlist"):
        load_custom_logit_processor('{"name": "add_one"}', allowlist=frozenset({BUILTIN_DISALLOWED}))


def test_register_refuses_conflicts_and_non_processors():
    with pytest.raises(CustomLogitProcessorError):
        register_custom_logit_processor("DisallowedTokensLogitsProcessor", AddOneProcessor)
    with pytest.raises(CustomLogitProcessorError):
        register_custom_logit_processor("dict", dict)
    with pytest.raises(CustomLogitProcessorError, match="abstract"):
        register_custom_logit_processor("abstract", ThinkingBudgetLogitProcessor)


def test_allowlist_accepts_builtin():
    s = DisallowedTokensLogitsProcessor.to_str()
    proc = load_custom_logit_processor(s, allowlist=frozenset({BUILTIN_DISALLOWED}))
    assert type(proc) is DisallowedTokensLogitsProcessor


def test_allowlist_accepts_protocol_0_global():
    s = _hex_callable(pickle.dumps(DisallowedTokensLogitsProcessor, protocol=0))
    proc = load_custom_logit_processor(s, allowlist=frozenset({BUILTIN_DISALLOWED}))
    assert type(proc) is DisallowedTokensLogitsProcessor


def test_allowlist_refuses_class_not_listed():
    with pytest.raises(CustomLogitProcessorError) as e:
        load_custom_logit_processor(AddOneProcessor.to_str(), allowlist=frozenset({BUILTIN_DISALLOWED}))
    assert str(e.value) == (
        f"custom_logit_processor: class '{qualified_name(AddOneProcessor)}' is not in the "
        "server's allowlist (--custom-logit-processor-allowlist)"
    )


def test_allowlist_refuses_by_value_class():
    def make():
        class Local(CustomLogitProcessor):
            def __call__(self, logits, custom_param_list=None):
                return logits

        return Local

    with pytest.raises(CustomLogitProcessorError, match="by-reference"):
        load_custom_logit_processor(make().to_str(), allowlist=frozenset({BUILTIN_DISALLOWED}))


def test_allowlist_refuses_allowlisted_non_processor():
    s = _hex_callable(pickle.dumps(dict))
    with pytest.raises(CustomLogitProcessorError, match="subclass"):
        load_custom_logit_processor(s, allowlist=frozenset({"builtins.dict"}))


def test_allowlist_refuses_trailing_bytes():
    s = _hex_callable(dill.dumps(DisallowedTokensLogitsProcessor) + b"junk")
    with pytest.raises(CustomLogitProcessorError):
        load_custom_logit_processor(s, allowlist=frozenset({BUILTIN_DISALLOWED}))


class _OpenFile:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


class _Touch:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("payload_cls", [_OpenFile, _Touch])
@pytest.mark.parametrize(
    "allowlist",
    [frozenset({BUILTIN_DISALLOWED}), frozenset({"builtins.open", "posix.system", "os.system"})],
)
def test_malicious_payload_is_refused_without_running(tmp_path, payload_cls, allowlist):
    target = tmp_path / "pwned"
    for dumps in (pickle.dumps, dill.dumps):
        s = _hex_callable(dumps(payload_cls(str(target))))
        with pytest.raises(CustomLogitProcessorError) as e:
            load_custom_logit_processor(s, allowlist=allowlist)
        assert str(e.value).startswith("custom_logit_processor")
        assert not target.exists()


@pytest.mark.parametrize(
    "s",
    [
        "not json",
        "[1, 2]",
        "{}",
        '{"callable": "00", "name": "x"}',
        '{"other": "x"}',
        '{"name": 3}',
        '{"callable": "zz"}',
        '{"callable": "8004"}',  # truncated pickle
    ],
)
def test_malformed_strings(s):
    for allowlist in (None, frozenset({BUILTIN_DISALLOWED})):
        with pytest.raises(CustomLogitProcessorError, match="^custom_logit_processor: "):
            load_custom_logit_processor(s, allowlist=allowlist)


def test_unrestricted_loader_refuses_non_processor():
    with pytest.raises(CustomLogitProcessorError, match="subclass"):
        load_custom_logit_processor(_hex_callable(dill.dumps(dict)))


def test_error_is_value_error_and_disabled_message():
    assert issubclass(CustomLogitProcessorError, ValueError)
    assert DISABLED_MESSAGE == (
        "The server is not configured to enable custom logit processor. "
        "Please set `--enable-custom-logit-processor` to enable this feature."
    )


# --------------------------------------------------------------------------- DisallowedTokens


def test_disallowed_tokens_per_row_lists_and_untouched_rows():
    logits = torch.zeros(5, 8)
    params = [
        {"token_ids": [1, 3]},
        None,
        {"token_ids": [0, 7, 7]},
        {"other": 1},
        {"token_ids": []},
    ]
    out = DisallowedTokensLogitsProcessor()(logits, params)
    expected = torch.zeros(5, 8)
    expected[0, [1, 3]] = NEG_INF
    expected[2, [0, 7]] = NEG_INF
    assert torch.equal(out, expected)


def test_disallowed_tokens_ignores_out_of_vocab_ids():
    out = DisallowedTokensLogitsProcessor()(torch.zeros(1, 4), [{"token_ids": [2, 4, -1]}])
    assert out.tolist() == [[0.0, 0.0, NEG_INF, 0.0]]


def test_disallowed_tokens_no_params():
    logits = torch.randn(2, 4)
    assert torch.equal(DisallowedTokensLogitsProcessor()(logits.clone(), None), logits)
    assert torch.equal(DisallowedTokensLogitsProcessor()(logits.clone(), [None, None]), logits)


# --------------------------------------------------------------------------- thinking budget

Q = Qwen3ThinkingBudgetLogitProcessor
START, END, NL = Q.THINKING_START_TOKEN_ID, Q.THINKING_END_TOKEN_ID, Q.NEW_LINE_TOKEN_ID
V = END + 10


def _budget_row(origin, output, budget):
    logits = torch.zeros(1, V)
    params = [{"thinking_budget": budget, "__req__": FakeReq(origin, output)}]
    return Q()(logits, params)[0]


def _only(token):
    row = torch.full((V,), NEG_INF)
    row[token] = 0.0
    return row


def test_subclass_token_ids():
    assert (Glm4MoeThinkingBudgetLogitProcessor.THINKING_START_TOKEN_ID,
            Glm4MoeThinkingBudgetLogitProcessor.THINKING_END_TOKEN_ID,
            Glm4MoeThinkingBudgetLogitProcessor.NEW_LINE_TOKEN_ID) == (151350, 151351, 198)
    assert (START, END, NL) == (151667, 151668, 198)
    assert (DeepSeekR1ThinkingBudgetLogitProcessor.THINKING_START_TOKEN_ID,
            DeepSeekR1ThinkingBudgetLogitProcessor.THINKING_END_TOKEN_ID,
            DeepSeekR1ThinkingBudgetLogitProcessor.NEW_LINE_TOKEN_ID) == (128798, 128799, 201)
    with pytest.raises(TypeError):
        ThinkingBudgetLogitProcessor()


def test_budget_not_reached():
    # 3 tokens after START, budget 4
    assert torch.equal(_budget_row([5, START], [10, 11, 12], 4), torch.zeros(V))


def test_budget_reached_without_newline_forces_newline():
    assert torch.equal(_budget_row([5, START], [10, 11, 12], 3), _only(NL))


def test_budget_reached_with_empty_output_forces_newline():
    assert torch.equal(_budget_row([5, START, 9], [], 1), _only(NL))


def test_budget_reached_after_newline_forces_end():
    assert torch.equal(_budget_row([5, START], [10, 11, NL], 3), _only(END))


def test_closed_block_untouched():
    assert torch.equal(_budget_row([5, START], [10, END, 11, 12], 0), torch.zeros(V))


def test_no_block_untouched():
    assert torch.equal(_budget_row([5, 6], [10, 11], 0), torch.zeros(V))


def test_end_from_earlier_turn_does_not_close_new_block():
    # An earlier turn's END sits before the latest START.
    assert torch.equal(_budget_row([START, 1, END, 2, START], [10, 11], 2), _only(NL))


@pytest.mark.parametrize("budget", [None, -1, "5", 2.0, True])
def test_invalid_budget_skips(budget):
    assert torch.equal(_budget_row([START], [1, 2, 3, 4], budget), torch.zeros(V))


def test_thinking_budget_batch_mixes_rows():
    logits = torch.zeros(4, V)
    params = [
        {"thinking_budget": 1, "__req__": FakeReq([START], [1, 2])},
        None,
        {"thinking_budget": 1, "__req__": FakeReq([START], [1, NL])},
        {"thinking_budget": 100, "__req__": FakeReq([START], [1, NL])},
    ]
    out = Q()(logits, params)
    assert torch.equal(out[0], _only(NL))
    assert torch.equal(out[1], torch.zeros(V))
    assert torch.equal(out[2], _only(END))
    assert torch.equal(out[3], torch.zeros(V))


def test_thinking_budget_no_params():
    assert torch.equal(Q()(torch.zeros(2, V), None), torch.zeros(2, V))
    assert torch.equal(Q()(torch.zeros(2, V), []), torch.zeros(2, V))


# --------------------------------------------------------------------------- no-repeat n-gram


def _banned(origin, output, **params):
    logits = torch.zeros(1, 10)
    out = DeepseekOCRNoRepeatNGramLogitProcessor()(
        logits, [{"__req__": FakeReq(origin, output), **params}]
    )
    return sorted(torch.nonzero(out[0] == NEG_INF).flatten().tolist())


def test_ngram_reference_examples():
    assert _banned([1, 2], [3, 1, 2], ngram_size=2, window_size=100) == [3]
    assert _banned([1, 2, 1, 2], [], ngram_size=2, window_size=100) == [1]


def test_ngram_size_one_bans_whole_window():
    assert _banned([9, 9, 1, 2], [3], ngram_size=1, window_size=3) == [1, 2, 3]


def test_ngram_window_limits_search():
    # seq [1,2,3,4,5,1,2]; n=2, prefix (2,). Window 7 sees (2,3) -> ban 3.
    assert _banned([1, 2, 3, 4, 5, 1, 2], [], ngram_size=2, window_size=7) == [3]
    # Window 5 starts at index 2: n-grams (3,4),(4,5),(5,1),(1,2) -> no prefix match.
    assert _banned([1, 2, 3, 4, 5, 1, 2], [], ngram_size=2, window_size=5) == []


def test_ngram_trigram():
    # prefix (1,2): n-grams (1,2,3) and (1,2,4) start in the window -> ban 3 and 4
    assert _banned([1, 2, 3, 1, 2, 4, 1], [2], ngram_size=3, window_size=100) == [3, 4]


def test_ngram_whitelist():
    assert _banned([1, 2, 3, 1, 2], [], ngram_size=2, window_size=100, whitelist_token_ids=[3]) == []
    assert _banned([1, 2, 3, 1, 2], [], ngram_size=2, window_size=100, whitelist_token_ids=["3"]) == []
    # an invalid whitelist means no whitelist
    assert _banned([1, 2, 3, 1, 2], [], ngram_size=2, window_size=100, whitelist_token_ids=["x"]) == [3]


@pytest.mark.parametrize(
    "params",
    [
        {"ngram_size": 0, "window_size": 10},
        {"ngram_size": 2, "window_size": 0},
        {"ngram_size": "x", "window_size": 10},
        {"window_size": 10},
        {"ngram_size": 2, "window_size": 1},  # window shorter than an n-gram
        {"ngram_size": 6, "window_size": 10},  # sequence shorter than n
    ],
)
def test_ngram_skips(params):
    assert _banned([1, 2, 3, 1, 2], [], **params) == []


def test_ngram_string_params_are_converted():
    assert _banned([1, 2, 3, 1, 2], [], ngram_size="2", window_size="100") == [3]


def test_ngram_rows_without_req_untouched():
    logits = torch.zeros(3, 10)
    params = [None, {"ngram_size": 2, "window_size": 10}, {}]
    assert torch.equal(DeepseekOCRNoRepeatNGramLogitProcessor()(logits, params), torch.zeros(3, 10))
