"""Grammar after reasoning (constrained/reasoning_gate.py) on a real xgrammar grammar: tokens
before the think-end marker are not masked and never reach the matcher, the marker's last token
opens the gate, then the grammar masks, refuses and terminates as from a first token; rollback
across the marker, the batched mask fill, fork, the grammar queue's choice of when to gate, and
chat's rule for which requests reason."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest
import torch

from fake_scheduler import build_test_tokenizer
from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject, GrammarKey
from sglang.srt.constrained.bitmask import bitmask_width, grammar_bitmask
from sglang.srt.constrained.grammar_backends import create_grammar_backend
from sglang.srt.constrained.grammar_queue import GrammarQueue
from sglang.srt.constrained.reasoning_gate import ReasoningGate
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.request_extras import check_extras, message_fields
from sglang.srt.sampling.sampling_params import SamplingParams

REGEX = "a[bc]{2}"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import PreTrainedTokenizerFast

    folder = str(tmp_path_factory.mktemp("gate-tokenizer"))
    build_test_tokenizer(folder)
    tok = PreTrainedTokenizerFast.from_pretrained(folder)
    tok.add_tokens(["<think>", "</think>"])
    return tok


@pytest.fixture(scope="module")
def backend(tokenizer):
    backend = create_grammar_backend("xgrammar", tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def compiled(backend):
    return backend.compile_async(GrammarKey("regex", REGEX)).result()


def token(tokenizer, text: str) -> int:
    (tid,) = tokenizer.encode(text, add_special_tokens=False)
    return tid


def allowed(grammar: BaseGrammarObject, vocab: int) -> set[int]:
    mask = torch.zeros(1, bitmask_width(vocab), dtype=torch.int32)  # [1, W]
    grammar.fill_vocab_mask(mask, 0)
    return {t for t in range(vocab) if (int(mask[0, t // 32]) >> (t % 32)) & 1}


def matcher(backend, compiled, tokenizer):
    return backend.new_matcher(compiled, [tokenizer.eos_token_id])


def test_free_until_think_end_then_the_grammar_applies(backend, compiled, tokenizer):
    vocab = len(tokenizer)
    end, z, a, b, c = (token(tokenizer, s) for s in ("</think>", "z", "a", "b", "c"))
    fresh = allowed(matcher(backend, compiled, tokenizer), vocab)
    assert a in fresh and z not in fresh and end not in fresh and len(fresh) < vocab // 4
    gate = ReasoningGate(matcher(backend, compiled, tokenizer), [end])
    for reasoning_token in (z, tokenizer.eos_token_id, z):  # tokens the grammar refuses
        assert allowed(gate, vocab) == set(range(vocab)) and not gate.is_terminated()
        assert gate.accept_token(reasoning_token)
    assert not gate.opened and gate.accept_token(end) and gate.opened
    assert allowed(gate, vocab) == fresh  # the inner matcher saw none of the reasoning
    assert not gate.accept_token(z) and not gate.accept_token(end)
    for t in (a, b, c):
        assert gate.accept_token(t) and not gate.is_terminated()
    assert allowed(gate, vocab) == {tokenizer.eos_token_id}
    assert gate.accept_token(tokenizer.eos_token_id) and gate.is_terminated()


def test_a_marker_of_several_tokens_and_rollback_across_it(backend, compiled, tokenizer):
    vocab = len(tokenizer)
    start, end, z, a = (token(tokenizer, s) for s in ("<think>", "</think>", "z", "a"))
    gate = ReasoningGate(matcher(backend, compiled, tokenizer), [start, end])
    for t in (start, z, end, z, start):
        assert gate.accept_token(t) and not gate.opened  # no complete marker yet
    assert gate.accept_token(end) and gate.opened
    fresh = allowed(gate, vocab)
    assert gate.accept_token(a) and allowed(gate, vocab) != fresh
    gate.rollback(1)  # the answer's token: the gate stays open, the matcher goes back
    assert gate.opened and allowed(gate, vocab) == fresh
    assert gate.accept_token(a)
    gate.rollback(2)  # the answer's token and the marker's last: closed again
    assert not gate.opened and allowed(gate, vocab) == set(range(vocab))
    assert gate.accept_token(z) and not gate.opened  # the marker is no longer complete
    gate.rollback(1)
    assert gate.accept_token(end) and gate.opened and allowed(gate, vocab) == fresh


def test_batched_fill_mixes_closed_open_and_plain_rows(backend, compiled, tokenizer):
    vocab = len(tokenizer)
    end, a = token(tokenizer, "</think>"), token(tokenizer, "a")
    closed = ReasoningGate(matcher(backend, compiled, tokenizer), [end])
    opened = ReasoningGate(matcher(backend, compiled, tokenizer), [end])
    opened.accept_token(end)
    opened.accept_token(a)
    plain = matcher(backend, compiled, tokenizer)
    reqs = [
        SimpleNamespace(grammar=g, output_ids=[], sampling_params=SimpleNamespace(min_new_tokens=0),
                        finished=lambda: False, stop_token_ids=lambda: {tokenizer.eos_token_id})
        for g in (opened, plain, closed)
    ]
    mask = grammar_bitmask(reqs, vocab, torch.device("cpu"))  # [3, W]
    rows = [{t for t in range(vocab) if (int(mask[r, t // 32]) >> (t % 32)) & 1} for r in range(3)]
    assert rows[0] == allowed(opened, vocab) and token(tokenizer, "b") in rows[0] and a not in rows[0]
    assert rows[1] == allowed(plain, vocab) and rows[1] != rows[0]  # the first position vs the second
    assert rows[2] == set(range(vocab))
    # The threaded fill (GPU hosts) of the same rows: xgrammar's batch call on the open inner matchers.
    fresh_open = ReasoningGate(matcher(backend, compiled, tokenizer), [end])
    fresh_open.accept_token(end)
    threaded = torch.zeros_like(mask)  # [3, W]
    ReasoningGate.fill_vocab_masks([opened, fresh_open, closed], threaded, [0, 1, 2], parallel=True)
    assert torch.equal(threaded, mask)  # the fresh open gate's row is the plain matcher's


class CountingGrammar(BaseGrammarObject):
    """Accepts everything and records it; fork copies the record."""

    def __init__(self, seen=None) -> None:
        self.seen = list(seen or [])

    def accept_token(self, token: int) -> bool:
        self.seen.append(token)
        return True

    def rollback(self, num_tokens: int) -> None:
        del self.seen[len(self.seen) - num_tokens :]

    def is_terminated(self) -> bool:
        return False

    def fill_vocab_mask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row].zero_()

    def fork(self) -> "CountingGrammar":
        return CountingGrammar(self.seen)


def test_fork_is_an_independent_copy():
    gate = ReasoningGate(CountingGrammar(), [9])
    for t in (1, 9, 2):
        gate.accept_token(t)
    twin = gate.fork()
    assert twin.inner is not gate.inner and twin.inner.seen == [2] and twin.opened
    gate.rollback(3)
    assert not gate.opened and gate.inner.seen == [] and gate.reasoning == []
    assert twin.opened and twin.reasoning == [1, 9] and twin.inner.seen == [2]
    twin.rollback(2)
    assert not twin.opened and twin.reasoning == [1] and twin.inner.seen == []
    closed = ReasoningGate(CountingGrammar(), [9]).fork()
    assert closed.accept_token(4) and not closed.opened and closed.inner.seen == []


class StubBackend:
    def __init__(self) -> None:
        self.future: Future = Future()
        self.future.set_result("compiled")

    def compile_async(self, key: GrammarKey) -> Future:
        return self.future

    def new_matcher(self, compiled, stop_token_ids):
        return CountingGrammar()


@pytest.mark.parametrize("think_end_ids, require_reasoning, gated", [
    ([7], True, True),
    ([7], False, False),  # not a reasoning request: the grammar applies from the first token
    (None, True, False),  # no --reasoning-parser: likewise
])
def test_grammar_queue_gates_reasoning_requests(think_end_ids, require_reasoning, gated):
    queue = GrammarQueue(StubBackend(), tp_group=None, think_end_ids=think_end_ids)
    req = SimpleNamespace(grammar=None, require_reasoning=require_reasoning, stop_token_ids=lambda: {2})
    queue.add(req, GrammarKey("regex", "x"))
    assert queue.pop_ready() == ([req], [])
    assert isinstance(req.grammar, ReasoningGate) == gated
    if gated:
        assert req.grammar.think_end_ids == (7,) and isinstance(req.grammar.inner, CountingGrammar)


def test_require_reasoning_is_checked_and_sent():
    server_args = SimpleNamespace(sampling_mask_max_tokens=64, enable_priority_scheduling=False)
    obj = GenerateReqInput(text="x", require_reasoning="yes")
    with pytest.raises(ValueError, match="require_reasoning must be a boolean"):
        check_extras(obj, SamplingParams(), server_args, has_tokenizer=True)
    obj.require_reasoning = True
    check_extras(obj, SamplingParams(), server_args, has_tokenizer=True)
    assert message_fields(obj, server_args)["require_reasoning"] is True


@pytest.mark.parametrize("parser, kwargs, prompt_opens, expected", [
    (None, {}, True, False),  # no parser: never gated
    ("deepseek-r1", {"enable_thinking": False}, False, True),  # always reasons
    ("qwen3", {}, False, True),  # the model opens <think> itself
    ("qwen3", {"enable_thinking": False}, False, False),
    ("qwen3", {"enable_thinking": False}, True, True),  # the prompt opened the section anyway
])
def test_chat_reasoning_rule(parser, kwargs, prompt_opens, expected):
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": kwargs}
    )
    req._prompt_opens_reasoning = prompt_opens
    handler = SimpleNamespace(server_args=SimpleNamespace(reasoning_parser=parser))
    assert OpenAIServingChat._reasoning_enabled(handler, req) is expected
