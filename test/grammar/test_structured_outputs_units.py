"""Structured outputs below the server: the packed bitmask and its kernels, the per-step mask
with min_new_tokens, the order of the logit transforms, both grammar backends on the embedded
tokenizer, the up-front validation, its JSON-schema keyword allowlist and its repetition bounds,
the grammar queue."""

from __future__ import annotations

import json
from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sampling_utils import make_info
from sglang.srt.constrained.base_grammar_backend import GrammarError, GrammarKey
from sglang.srt.constrained.grammar_backends import create_grammar_backend, validate_grammar
from sglang.srt.constrained.bitmask import (
    apply_token_bitmask,
    apply_token_bitmask_reference,
    bitmask_width,
    grammar_bitmask,
)
from sglang.srt.constrained.grammar_queue import GrammarQueue
from sglang.srt.constrained.json_schema_support import ENFORCED, FORMATS
from sglang.srt.sampling.sampling_params import SamplingParams

BACKENDS = ["xgrammar", "llguidance"]


def allowed_ids(bitmask_row: torch.Tensor, vocab: int) -> list[int]:
    return [t for t in range(vocab) if (int(bitmask_row[t // 32]) >> (t % 32)) & 1]


def allow(bitmask: torch.Tensor, row: int, token: int) -> None:
    """Set token's bit (through an unsigned view: bit 31 of an int32 word is its sign)."""
    bitmask.numpy().view(np.uint32)[row, token // 32] |= np.uint32(1 << (token % 32))


# ----------------------------------------------------------------------------- bitmask kernels


@pytest.mark.parametrize("vocab", [100, 128, 49152])
def test_apply_matches_reference(vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=gen)
    mask = torch.randint(-(2**31), 2**31 - 1, (5, bitmask_width(vocab)), dtype=torch.int32, generator=gen)
    mask[1] = -1  # an unconstrained row
    fast, ref = logits.clone(), logits.clone()
    apply_token_bitmask(fast, mask)
    apply_token_bitmask_reference(ref, mask)
    assert torch.equal(fast, ref)
    assert torch.equal(ref[1], logits[1])


def test_reference_semantics():
    logits = torch.zeros(1, 70)
    mask = torch.zeros(1, bitmask_width(64), dtype=torch.int32)  # covers 64 of the 70 columns
    for token in (3, 31, 32):
        allow(mask, 0, token)
    apply_token_bitmask_reference(logits, mask)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [3, 31, 32]


def test_cpu_kernel_matches_reference_on_strided_rows_and_short_masks():
    from sgl_kernel_ext.sampling.bitmask import apply_token_bitmask_cpu, apply_token_bitmask_cpu_applies

    gen = torch.Generator().manual_seed(7)
    wide = torch.randn(6, 300, generator=gen)
    logits = wide[:, :250]  # rows 300 apart: the kernel follows the row stride
    mask = torch.randint(-(2**31), 2**31 - 1, (6, 7), dtype=torch.int32, generator=gen)  # covers 224 of 250 columns
    mask[0], mask[1] = 0, -1
    if not apply_token_bitmask_cpu_applies(logits, mask):
        pytest.skip("no C compiler")
    ref, untouched = logits.clone(), wide[:, 250:].clone()
    apply_token_bitmask_reference(ref, mask)
    apply_token_bitmask_cpu(logits, mask)
    assert torch.equal(logits, ref) and torch.equal(wide[:, 250:], untouched)
    assert torch.isinf(logits[0]).all() and torch.isinf(logits[1, 224:]).all() and torch.isfinite(logits[1, :224]).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only")
def test_apply_matches_reference_cuda():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 151936, generator=gen).cuda()
    mask = torch.randint(-(2**31), 2**31 - 1, (64, bitmask_width(151936)), dtype=torch.int32, generator=gen).cuda()
    fast, ref = logits.clone(), logits.clone()
    apply_token_bitmask(fast, mask)
    apply_token_bitmask_reference(ref, mask)
    assert torch.equal(fast, ref)


# ----------------------------------------------------------------------------- per-step mask


class FakeGrammar:
    """Allows `allowed` next tokens; terminated once told so."""

    def __init__(self, allowed: list[int], terminated: bool = False) -> None:
        self.allowed, self.terminated = allowed, terminated

    def is_terminated(self) -> bool:
        return self.terminated

    def fill_vocab_mask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row] = 0
        for t in self.allowed:
            allow(bitmask, row, t)

    @classmethod
    def fill_vocab_masks(cls, grammars, bitmask, rows, parallel) -> None:
        for grammar, row in zip(grammars, rows):
            grammar.fill_vocab_mask(bitmask, row)


def fake_req(grammar=None, outputs=0, min_new=0, stops=(2,), finished=False):
    return SimpleNamespace(
        grammar=grammar,
        output_ids=[5] * outputs,
        sampling_params=SimpleNamespace(min_new_tokens=min_new),
        finished=lambda: finished,
        stop_token_ids=lambda: set(stops),
    )


def test_grammar_bitmask_rows():
    vocab = 64
    reqs = [
        fake_req(),  # no grammar: all allowed
        fake_req(FakeGrammar([1, 40])),
        fake_req(FakeGrammar([7], terminated=True)),  # terminated (overlap's extra step): unconstrained
        fake_req(FakeGrammar([7]), finished=True),
    ]
    mask = grammar_bitmask(reqs, vocab, torch.device("cpu"))
    assert mask.shape == (4, 2) and mask.dtype == torch.int32
    assert allowed_ids(mask[0], vocab) == list(range(vocab))
    assert allowed_ids(mask[1], vocab) == [1, 40]
    assert allowed_ids(mask[2], vocab) == list(range(vocab))
    assert allowed_ids(mask[3], vocab) == list(range(vocab))


def test_min_new_tokens_holds_stop_back_unless_only_stop_is_allowed():
    vocab = 64
    reqs = [
        fake_req(FakeGrammar([2, 9, 33]), outputs=1, min_new=3, stops=(2, 33)),  # must go on: 9 only
        fake_req(FakeGrammar([2]), outputs=1, min_new=3, stops=(2,)),  # the grammar may only end: it wins
        fake_req(FakeGrammar([2, 9]), outputs=3, min_new=3, stops=(2,)),  # min reached: stop allowed
    ]
    mask = grammar_bitmask(reqs, vocab, torch.device("cpu"))
    assert allowed_ids(mask[0], vocab) == [9]
    assert allowed_ids(mask[1], vocab) == [2]
    assert allowed_ids(mask[2], vocab) == [2, 9]


def test_bit_31_survives_hold_back():
    reqs = [fake_req(FakeGrammar([31, 63, 2]), outputs=0, min_new=1, stops=(2,))]
    mask = grammar_bitmask(reqs, 64, torch.device("cpu"))
    assert allowed_ids(mask[0], 64) == [31, 63]


def test_min_new_tokens_penalizer_leaves_grammar_rows_to_the_mask():
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    plain = Req("a", [1], SamplingParams(min_new_tokens=4), eos_token_ids={2})
    constrained = Req("b", [1], SamplingParams(min_new_tokens=4), eos_token_ids={2})
    constrained.grammar = FakeGrammar([2])
    info = SamplingBatchInfo.from_schedule_batch(ScheduleBatch([plain, constrained]), 8)
    logits = torch.zeros(2, 8)
    info.apply_logits_bias(logits)
    assert logits[0, 2] == float("-inf") and logits[1, 2] == 0.0
    assert info.grammars == [None, constrained.grammar]


def test_mask_after_penalties_and_bias_equals_sglang_order():
    """SGLang: penalties -> mask -> bias. Ours: penalties -> bias -> mask. Same logits bit for bit."""
    vocab = 70
    params = [
        SamplingParams(frequency_penalty=0.7, repetition_penalty=1.3, logit_bias={"3": 50.0, "4": -7.5}),
        SamplingParams(presence_penalty=-0.4, logit_bias={"65": 100.0}),
    ]
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, vocab, generator=gen)
    mask = torch.randint(-(2**31), 2**31 - 1, (2, bitmask_width(vocab)), dtype=torch.int32, generator=gen)
    mask[:, 0] &= ~(1 << 3)  # token 3 masked in both rows: a bias may not bring it back

    ours_info = make_info(params, vocab)
    ours_info.penalizer_orchestrator.cumulate_output_tokens(torch.tensor([4, 65]))
    ours = logits.clone()
    ours_info.vocab_mask = mask
    ours_info.apply_logits_bias(ours)

    theirs_info = make_info(params, vocab)
    theirs_info.penalizer_orchestrator.cumulate_output_tokens(torch.tensor([4, 65]))
    theirs = logits.clone()
    theirs_info.penalizer_orchestrator.apply(theirs)
    apply_token_bitmask_reference(theirs, mask)
    theirs.scatter_add_(1, theirs_info.logit_bias_ids, theirs_info.logit_bias_values)

    assert torch.equal(ours, theirs)
    assert ours[0, 3] == float("-inf") and ours[1, 3] == float("-inf")


@pytest.mark.parametrize("sampling_backend", ["pytorch", "ascend"])
def test_every_row_samples_inside_its_mask(sampling_backend):
    """The mask is applied before the sampling backend sees the logits: greedy rows take the argmax
    of the allowed tokens, sampled rows (seeded and not, with top-k / top-p / min-p) never leave them."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.layers.sampler import Sampler

    vocab = 300
    allowed = [[5, 17, 299], [0, 64, 65, 250], list(range(100, 140)), [7], [31, 32, 33]]
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, sampling_seed=3),
        SamplingParams(temperature=1.3, top_k=20, top_p=0.9),
        SamplingParams(temperature=0.8, min_p=0.2, sampling_seed=9),
        SamplingParams(temperature=0.0, logit_bias={"40": 100.0}),  # the bias cannot leave the mask
    ]
    mask = torch.zeros(len(allowed), bitmask_width(vocab), dtype=torch.int32)
    for row, tokens in enumerate(allowed):
        for token in tokens:
            allow(mask, row, token)
    sampler = Sampler(sampling_backend, device="cpu")
    gen = torch.Generator().manual_seed(0)
    for step in range(30):
        info = make_info(params, vocab)
        logits = torch.randn(len(params), vocab, generator=gen) * 4
        raw = logits.clone()
        info.vocab_mask = mask
        info.apply_logits_bias(logits)
        ids = sampler(LogitsProcessorOutput(next_token_logits=logits), info, positions=torch.full((len(params),), step)).tolist()
        for row, token in enumerate(ids):
            assert token in allowed[row], (step, row, token)
        assert ids[0] == max(allowed[0], key=lambda t: (raw[0, t], -t))
        assert ids[3] == 7 and ids[4] == max(allowed[4], key=lambda t: (raw[4, t], -t))


# ----------------------------------------------------------------------------- backends


@pytest.fixture(scope="module")
def tokenizer(gguf_path):
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    return get_tokenizer(gguf_path)


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request, tokenizer):
    backend = create_grammar_backend(request.param, tokenizer, 49152, [tokenizer.eos_token_id])
    yield backend
    backend.shutdown()


def fill_one(grammar, vocab=49152) -> list[int]:
    mask = torch.zeros(1, bitmask_width(vocab), dtype=torch.int32)
    grammar.fill_vocab_mask(mask, 0)
    return allowed_ids(mask[0], vocab)


def test_backend_regex_lifecycle(backend, tokenizer):
    eos = tokenizer.eos_token_id
    compiled = backend.compile_async(GrammarKey("regex", "(yes|no|maybe)")).result()
    grammar = backend.new_matcher(compiled, [eos])
    first = fill_one(grammar)
    assert first and eos not in first
    for t in first:
        text = tokenizer.decode([t])
        assert any(choice.startswith(text) for choice in ("yes", "no", "maybe")), text
    ids = tokenizer.encode("maybe", add_special_tokens=False)
    assert all(grammar.accept_token(t) for t in ids)
    assert fill_one(grammar) == [eos]  # complete: only the end is allowed
    assert not grammar.is_terminated()
    assert not grammar.accept_token(ids[0])  # refused, state unchanged
    assert grammar.accept_token(eos) and grammar.is_terminated()
    grammar.rollback(1)
    assert not grammar.is_terminated() and fill_one(grammar) == [eos]
    grammar.rollback(len(ids))
    assert fill_one(grammar) == first


def test_backend_matchers_are_independent(backend, tokenizer):
    """n > 1 children and equal schemas share the compiled grammar, never the state."""
    key = GrammarKey("json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}))
    future = backend.compile_async(key)
    assert backend.compile_async(GrammarKey(key.kind, key.text)) is future  # cached by (kind, text)
    one = backend.new_matcher(future.result(), [tokenizer.eos_token_id])
    two = backend.new_matcher(future.result(), [tokenizer.eos_token_id])
    start = fill_one(two)
    for t in tokenizer.encode('{"a": 1', add_special_tokens=False):
        assert one.accept_token(t)
    assert fill_one(two) == start != fill_one(one)


@pytest.mark.parametrize("parallel", [False, True])
def test_backend_batched_fill_equals_single(backend, tokenizer, parallel):
    key = GrammarKey("regex", r"[a-z]{2,5}\d")
    compiled = backend.compile_async(key).result()
    grammars = [backend.new_matcher(compiled, [tokenizer.eos_token_id]) for _ in range(3)]
    for t in tokenizer.encode("ab", add_special_tokens=False):
        assert grammars[1].accept_token(t)
    batched = torch.zeros(4, bitmask_width(49152), dtype=torch.int32)
    type(grammars[0]).fill_vocab_masks(grammars, batched, [0, 2, 3], parallel)
    for grammar, row in zip(grammars, [0, 2, 3]):
        single = torch.zeros(1, bitmask_width(49152), dtype=torch.int32)
        grammar.fill_vocab_mask(single, 0)
        assert torch.equal(batched[row], single[0])
    assert not batched[1].any()


def test_backend_compile_error_is_a_grammar_error(backend):
    with pytest.raises(GrammarError, match="^regex "):
        backend.compile_async(GrammarKey("regex", "(unclosed")).result()


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize(
    "kind, text, fragment",
    [
        ("json_schema", "{not json", "not valid JSON"),
        ("json_schema", "[1, 2]", "must be an object or a boolean"),
        ("json_schema", json.dumps({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}), "uniqueItems"),
        ("json_schema", json.dumps({"type": "array", "contains": {"const": 1}}), "contains"),
        ("json_schema", json.dumps({"properties": {"a": {"not": {"const": 1}}}}), "'not' at #/properties/a"),
        ("json_schema", json.dumps({"if": {"const": 1}, "then": {"const": 2}}), "'if'"),
        ("json_schema", json.dumps({"dependentRequired": {"a": ["b"]}}), "dependentRequired"),
        ("json_schema", json.dumps({"type": "string", "format": "made-up"}), "made-up"),
        ("json_schema", json.dumps({"allOf": [{"type": "string"}, {"maxLength": 2}]}), "allOf"),
        ("json_schema", json.dumps({"type": "string", "bogus": 1}), "bogus"),
        ("regex", "(unclosed", "regex"),
        ("ebnf", 'root ::= missing', "missing"),
        ("structural_tag", "{oops", "not valid JSON"),
        ("structural_tag", json.dumps({"structures": [{"begin": "<a>"}], "triggers": ["<a"]}), "structural_tag"),
        (
            "structural_tag",
            json.dumps({"structures": [{"begin": "<f>", "schema": {"type": "object", "not": {}}, "end": "</f>"}], "triggers": ["<f>"]}),
            "'not'",
        ),
        ("regex", "a{1,20000}", "the repetition bound 20000 in the regex exceeds 1024"),
        ("regex", "(ab|[a-z]){2000}", "the repetition bound 2000 in the regex exceeds 1024"),
        ("ebnf", 'root ::= "a" [b-c]{0,5000}', "the repetition bound 5000 in the ebnf exceeds 1024"),
        ("json_schema", json.dumps({"properties": {"s": {"type": "string", "maxLength": 20000}}}),
         "maxLength 20000 at #/properties/s exceeds 1024"),
        ("json_schema", json.dumps({"type": "array", "minItems": 2000}), "minItems 2000 at # exceeds 1024"),
        ("json_schema", json.dumps({"properties": {"s": {"type": "string", "pattern": "^x{3,9999}$"}}}),
         "the repetition bound 9999 in the pattern at #/properties/s exceeds 1024"),
        (
            "structural_tag",
            json.dumps({"structures": [{"begin": "<f>", "schema": {"type": "string", "maxLength": 4096}, "end": "</f>"}],
                        "triggers": ["<f>"]}),
            "maxLength 4096 at # exceeds 1024",
        ),
    ],
)
def test_validate_rejects_naming_the_field(name, kind, text, fragment):
    with pytest.raises(GrammarError) as info:
        validate_grammar(name, GrammarKey(kind, text))
    message = str(info.value)
    assert message.startswith(f"{kind} is not a valid grammar")
    assert fragment in message


@pytest.mark.parametrize("name", BACKENDS)
def test_validate_accepts_supported_grammars(name):
    schema = {
        "type": "object",
        "title": "person",
        "properties": {
            "name": {"type": "string", "maxLength": 20, "pattern": "^[A-Za-z ]+$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
            "when": {"type": "string", "format": "date"},
        },
        "required": ["name", "age"],
    }
    validate_grammar(name, GrammarKey("json_schema", json.dumps(schema)))
    validate_grammar(name, GrammarKey("regex", r"\d{4}-\d{2}-\d{2}"))
    validate_grammar(name, GrammarKey("ebnf", 'root ::= "yes" | "no"'))
    tag = {"type": "structural_tag", "structures": [{"begin": "<f=x>", "schema": {"type": "object"}, "end": "</f>"}], "triggers": ["<f="]}
    validate_grammar(name, GrammarKey("structural_tag", json.dumps(tag)))


_ENFORCEMENT = {  # keyword: (schema, an instance it must refuse, an instance it must accept)
    "type": ({"type": "integer"}, '"s"', "1"),
    "enum": ({"enum": ["x", "y"]}, '"z"', '"x"'),
    "const": ({"const": "x"}, '"y"', '"x"'),
    "properties": ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"a": "s"}', '{"a": 1}'),
    "required": ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, "{}", '{"a": 1}'),
    "additionalProperties": ({"type": "object", "properties": {"a": {}}, "additionalProperties": False}, '{"b": 1}', '{"a": 1}'),
    "items": ({"type": "array", "items": {"type": "integer"}}, '["a"]', "[1]"),
    "prefixItems": ({"type": "array", "prefixItems": [{"const": 1}], "items": False}, "[2]", "[1]"),
    "minItems": ({"type": "array", "items": {"type": "integer"}, "minItems": 2}, "[1]", "[1, 2]"),
    "maxItems": ({"type": "array", "items": {"type": "integer"}, "maxItems": 1}, "[1, 2]", "[1]"),
    "minLength": ({"type": "string", "minLength": 3}, '"ab"', '"abc"'),
    "maxLength": ({"type": "string", "maxLength": 2}, '"abc"', '"ab"'),
    "pattern": ({"type": "string", "pattern": "^[a-z]+$"}, '"A1"', '"ab"'),
    "format": ({"type": "string", "format": "date"}, '"hello"', '"2024-01-02"'),
    "minimum": ({"type": "integer", "minimum": 3}, "2", "3"),
    "maximum": ({"type": "integer", "maximum": 3}, "4", "3"),
    "exclusiveMinimum": ({"type": "integer", "exclusiveMinimum": 3}, "3", "4"),
    "exclusiveMaximum": ({"type": "integer", "exclusiveMaximum": 3}, "3", "2"),
    "multipleOf": ({"type": "integer", "multipleOf": 3}, "4", "6"),
    "minProperties": ({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1}, "{}", '{"a": 1}'),
    "maxProperties": ({"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 1}, '{"a": 1, "b": 2}', '{"a": 1}'),
    "patternProperties": ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False}, '{"x": "s"}', '{"x": 1}'),
    "propertyNames": ({"type": "object", "propertyNames": {"maxLength": 1}}, '{"ab": 1}', '{"a": 1}'),
    "anyOf": ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "true", "1"),
    "oneOf": ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, "true", "1"),
    "allOf": ({"allOf": [{"type": "string", "maxLength": 2}]}, '"abc"', '"ab"'),
    "$ref": ({"$defs": {"i": {"type": "integer"}}, "$ref": "#/$defs/i"}, '"s"', "1"),
}


def test_every_allowed_keyword_is_enforced_by_xgrammar():
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string as accepts

    structural = {"$defs", "definitions"}  # containers, checked through $ref
    assert set(_ENFORCEMENT) == ENFORCED - structural
    for keyword, (schema, bad, good) in _ENFORCEMENT.items():
        grammar = xgr.Grammar.from_json_schema(json.dumps(schema))
        assert not accepts(grammar, bad), keyword
        assert accepts(grammar, good), keyword
    for fmt in FORMATS:
        grammar = xgr.Grammar.from_json_schema(json.dumps({"type": "string", "format": fmt}))
        assert not accepts(grammar, '"!!! not a ' + fmt + '"'), fmt


# ----------------------------------------------------------------------------- grammar queue


class StubBackend:
    def __init__(self) -> None:
        self.futures: dict[str, Future] = {}

    def compile_async(self, key: GrammarKey) -> Future:
        return self.futures.setdefault(key.text, Future())

    def new_matcher(self, compiled, stop_token_ids):
        return ("matcher", compiled, tuple(stop_token_ids))


def queued_req(rid: str):
    return SimpleNamespace(rid=rid, grammar=None, stop_token_ids=lambda: {2, 7})


def test_grammar_queue_releases_in_order_of_completion():
    backend = StubBackend()
    queue = GrammarQueue(backend, tp_group=None)
    slow, fast, broken, gone = (queued_req(r) for r in "abcd")
    for req, text in [(slow, "slow"), (fast, "fast"), (broken, "broken"), (gone, "gone")]:
        queue.add(req, GrammarKey("regex", text))
    assert queue.remove(gone) and not queue.remove(gone)
    backend.futures["fast"].set_result("compiled-fast")
    backend.futures["broken"].set_exception(GrammarError(GrammarKey("regex", "broken"), "bad"))
    ready, failed = queue.pop_ready()
    assert ready == [fast] and fast.grammar == ("matcher", "compiled-fast", (2, 7))
    assert [(r, m) for r, m in failed] == [(broken, "regex is not a valid grammar for this server: bad")]
    assert len(queue) == 1 and slow.grammar is None
    backend.futures["slow"].set_result("compiled-slow")
    queue.wait(timeout=0)
    assert queue.pop_ready() == ([slow], []) and len(queue) == 0


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize(
    "kind, text",
    [
        ("regex", r"\{1,20000\}"),  # escaped braces are characters
        ("regex", "[{1,20000}]x{1,1024}"),  # braces in a class; the largest bound accepted
        ("ebnf", 'root ::= "{1,20000}" [a-z]{0,1024}'),  # braces in a literal
        ("json_schema", json.dumps({"type": "string", "minLength": 1024, "maxLength": 1024})),
    ],
)
def test_bounds_up_to_the_limit_and_braces_that_are_text_are_accepted(name, kind, text):
    validate_grammar(name, GrammarKey(kind, text))


def test_a_long_repetition_is_refused_before_it_compiles(backend):
    """The scheduler's compile checks too (as the tokenizer manager's validation does)."""
    with pytest.raises(GrammarError, match="repetition bound 20000 in the regex exceeds 1024"):
        backend.compile_async(GrammarKey("regex", "[a-z]{1,20000}")).result()
