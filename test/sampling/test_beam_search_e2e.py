"""Beam search end to end on a tiny random Llama served in float32: the returned beams equal a
reference beam search (and, where the width covers every prefix, an exhaustive search) over
transformers' logits; beam_width=1 is greedy; beams mixed with sampled requests change
nobody's tokens; penalties, logit_bias, stop ids and regex grammars act per beam (a grammar
search equals a reference search over the grammar-masked logits); bad inputs are 400s; no KV
slot or request slot is left held."""

from __future__ import annotations

import concurrent.futures
import socket

import orjson
import pytest
import torch

import sglang as sgl

from beam_reference import beam_search, exhaustive, hf_step
from engine_utils import generate, generate_ok
from family_utils import FULL_VOCAB, prompts, save_tiny, serving
from reliability_utils import wait_for_load, wait_idle

pytestmark = pytest.mark.e2e

SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)
SCORE_ATOL = 1e-4


@pytest.fixture(scope="module")
def llama(tmp_path_factory, gguf_path: str):
    folder = str(tmp_path_factory.mktemp("llama"))
    model = save_tiny(folder, "LlamaConfig", "LlamaForCausalLM", **SHAPE)
    with serving(folder, gguf_path, "--chunked-prefill-size", "16") as server:
        server.checkpoint = (folder, gguf_path)
        yield server, model


def beam_request(server, prompt: list[int], **params) -> dict:
    return generate_ok(server, prompt, sampling_params=params)


def assert_beams(result: dict, expected: list[tuple[list[int], float, object]]) -> None:
    beams = result["meta_info"]["beam_results"]
    assert [b["output_ids"] for b in beams] == [ids for ids, _, _ in expected]
    scores = torch.tensor([b["meta_info"]["sequence_score"] for b in beams], dtype=torch.float64)
    torch.testing.assert_close(scores, torch.tensor([s for _, s, _ in expected], dtype=torch.float64),
                               atol=SCORE_ATOL, rtol=0)
    for beam, (ids, _, matched) in zip(beams, expected):
        reason = beam["meta_info"]["finish_reason"]
        if matched is None:
            assert reason == {"type": "length", "length": len(ids)}
        else:
            assert reason == {"type": "stop", "matched": matched}
    # The best beam is the request's own answer.
    assert result["output_ids"] == beams[0]["output_ids"]
    assert result["text"] == beams[0]["text"]
    assert result["meta_info"]["sequence_score"] == beams[0]["meta_info"]["sequence_score"]
    assert result["meta_info"]["completion_tokens"] == sum(len(b["output_ids"]) for b in beams)


def test_beams_equal_reference_beam_search(llama) -> None:
    server, model = llama
    for prompt in prompts(2):
        expected = beam_search(hf_step(model, prompt), width=3, max_new_tokens=6, stop_ids=set())
        result = beam_request(server, prompt, beam_width=3, n=3, max_new_tokens=6, ignore_eos=True)
        assert_beams(result, expected)


def test_full_width_equals_exhaustive_search(llama) -> None:
    """Four allowed tokens, width 4, two tokens: every prefix stays alive, so the beams are the
    four best of all 16 continuations."""
    server, model = llama
    prompt = prompts(1)[0]
    allowed = [300, 301, 302, 303]
    step = hf_step(model, prompt, allowed=allowed)
    best = exhaustive(step, allowed, length=2, count=4)
    result = beam_request(server, prompt, beam_width=4, n=4, max_new_tokens=2, ignore_eos=True,
                          allowed_token_ids=allowed)
    assert_beams(result, [(ids, total / 2, None) for ids, total in best])


def test_default_n_returns_the_best_beam(llama) -> None:
    server, model = llama
    prompt = prompts(2)[1]
    expected = beam_search(hf_step(model, prompt), width=3, max_new_tokens=4, stop_ids=set(), n=1)
    assert_beams(beam_request(server, prompt, beam_width=3, max_new_tokens=4, ignore_eos=True), expected)


def test_n_returns_the_best_n_and_length_penalty(llama) -> None:
    server, model = llama
    prompt = prompts(3)[2]
    step = hf_step(model, prompt)
    expected = beam_search(step, width=4, max_new_tokens=5, stop_ids=set(), length_penalty=0.5, n=2)
    result = beam_request(server, prompt, beam_width=4, n=2, max_new_tokens=5, ignore_eos=True, length_penalty=0.5)
    assert_beams(result, expected)


def test_stop_token_ids_finish_beams(llama) -> None:
    """Stop ids taken from the beams of a search without them, so beams end at different lengths."""
    server, model = llama
    prompt = prompts(2)[1]
    step = hf_step(model, prompt)
    free = beam_search(step, width=3, max_new_tokens=6, stop_ids=set())
    stops = {free[1][0][2], free[2][0][3]}
    # length_penalty 0 ranks by total log-probability, where the shorter stopped beams win.
    expected = beam_search(step, width=3, max_new_tokens=6, stop_ids=stops, length_penalty=0.0)
    assert any(matched is not None for _, _, matched in expected)
    result = beam_request(server, prompt, beam_width=3, n=3, max_new_tokens=6, ignore_eos=True,
                          stop_token_ids=sorted(stops), length_penalty=0.0)
    assert_beams(result, expected)


def _grammar_mask(gguf_path: str, regex: str):
    """allowed_after(history) of a regex: the ids the server's grammar backend allows next."""
    from sglang.srt.constrained.base_grammar_backend import GrammarKey
    from sglang.srt.constrained.bitmask import bitmask_width
    from sglang.srt.constrained.grammar_backends import create_grammar_backend
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    tokenizer = get_tokenizer(gguf_path)
    backend = create_grammar_backend("xgrammar", tokenizer, FULL_VOCAB, [tokenizer.eos_token_id])
    compiled = backend.compile_async(GrammarKey("regex", regex)).result()

    def allowed_after(history: list[int]) -> list[int]:
        matcher = backend.new_matcher(compiled, [tokenizer.eos_token_id])
        assert all(matcher.accept_token(t) for t in history)
        mask = torch.zeros(1, bitmask_width(FULL_VOCAB), dtype=torch.int32)
        matcher.fill_vocab_mask(mask, 0)
        bits = (mask[0].unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1  # [W, 32]
        return torch.nonzero(bits.flatten()[:FULL_VOCAB]).flatten().tolist()

    return allowed_after


@pytest.mark.parametrize("regex", [r"[01]{40,50}", r"(yes|no)[a-z]{40,60}"])
def test_grammar_beams_equal_a_masked_reference_search(llama, regex) -> None:
    """Every beam row masked by its own (forked) matcher. [01] allows two tokens: the first steps
    keep fewer than k beams going (the masks leave fewer than 2k candidates). No grammar can
    end within max_new_tokens, so no stop is involved."""
    server, model = llama
    prompt = prompts(2)[1]
    step = hf_step(model, prompt, allowed_after=_grammar_mask(server.checkpoint[1], regex))
    expected = beam_search(step, width=4, max_new_tokens=6, stop_ids=set())
    result = beam_request(server, prompt, beam_width=4, n=4, max_new_tokens=6, regex=regex)
    assert_beams(result, expected)


def test_penalties_and_logit_bias_act_per_beam(llama) -> None:
    server, model = llama
    prompt = prompts(1)[0]
    bias = {int(hf_step(model, prompt)([]).argmax()): -3.0, 500: 4.0}
    step = hf_step(model, prompt, frequency_penalty=1.5, logit_bias=bias)
    expected = beam_search(step, width=3, max_new_tokens=6, stop_ids=set())
    result = beam_request(server, prompt, beam_width=3, n=3, max_new_tokens=6, ignore_eos=True, frequency_penalty=1.5,
                          logit_bias={str(k): v for k, v in bias.items()})
    assert_beams(result, expected)


def test_beam_width_one_is_greedy(llama) -> None:
    server, _ = llama
    prompt = prompts(1)[0]
    plain = generate_ok(server, prompt, sampling_params={"temperature": 0, "max_new_tokens": 8, "ignore_eos": True})
    one = generate_ok(server, prompt, sampling_params={"temperature": 0, "max_new_tokens": 8, "ignore_eos": True,
                                                        "beam_width": 1})
    assert one["output_ids"] == plain["output_ids"]
    assert "beam_results" not in one["meta_info"]


def test_mixed_batch_equals_each_alone(llama) -> None:
    """Beam requests of two widths beside seeded sampled ones (n = 2 among them), all at once."""
    server, _ = llama
    ps = prompts(4)
    bodies = [
        {"input_ids": ps[0], "sampling_params": {"beam_width": 3, "max_new_tokens": 6, "ignore_eos": True}},
        {"input_ids": ps[1], "sampling_params": {"temperature": 1.0, "sampling_seed": 7, "max_new_tokens": 8,
                                                 "ignore_eos": True, "n": 2}},
        {"input_ids": ps[2], "sampling_params": {"beam_width": 2, "n": 2, "max_new_tokens": 5, "ignore_eos": True}},
        {"input_ids": ps[3], "sampling_params": {"temperature": 0.8, "sampling_seed": 3, "max_new_tokens": 8,
                                                 "frequency_penalty": 0.5, "ignore_eos": True}},
    ]

    def send(body):
        response = generate(server, body["input_ids"], sampling_params=body["sampling_params"])
        assert response.status_code == 200, response.text
        return response.json()

    alone = [send(body) for body in bodies]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(send, bodies))
    for a, t in zip(alone, together):
        assert _ids(a) == _ids(t)
        a_scores, t_scores = _scores(a), _scores(t)
        torch.testing.assert_close(t_scores, a_scores, atol=SCORE_ATOL, rtol=0)
    wait_idle(server)


def _ids(result) -> list:
    """Every returned sequence's ids: the answer's, each child's (n > 1) and each beam's."""
    if isinstance(result, list):
        return [_ids(r) for r in result]
    return [result["output_ids"]] + [b["output_ids"] for b in result["meta_info"].get("beam_results", [])]


def _scores(result) -> torch.Tensor:
    if isinstance(result, list):
        return torch.zeros(0, dtype=torch.float64)
    beams = result["meta_info"].get("beam_results", [])
    return torch.tensor([b["meta_info"]["sequence_score"] for b in beams], dtype=torch.float64)


def test_engine_returns_the_server_beams(llama) -> None:
    server, _ = llama
    folder, gguf_path = server.checkpoint
    prompt = prompts(2)[1]
    params = {"beam_width": 3, "n": 2, "max_new_tokens": 5, "ignore_eos": True}
    expected = beam_request(server, prompt, **params)
    with sgl.Engine(model_path=folder, tokenizer_path=gguf_path, dtype="float32", max_running_requests=16,
                    max_total_tokens=8192, log_level="warning") as llm:
        got = llm.generate(input_ids=prompt, sampling_params=params)
    assert [b["output_ids"] for b in got["meta_info"]["beam_results"]] == [
        b["output_ids"] for b in expected["meta_info"]["beam_results"]
    ]
    assert got["text"] == expected["text"]


def test_streamed_beam_request_sends_the_final_answer(llama) -> None:
    server, _ = llama
    prompt = prompts(1)[0]
    body = {"beam_width": 2, "max_new_tokens": 4, "ignore_eos": True}
    plain = beam_request(server, prompt, **body)
    response = generate(server, prompt, sampling_params=body, stream=True)
    assert response.status_code == 200
    chunks = [line for line in response.text.splitlines() if line.startswith("data: {")]
    assert len(chunks) == 1 and '"beam_results"' in chunks[0]
    assert plain["output_ids"] == __import__("json").loads(chunks[0][len("data: "):])["output_ids"]


@pytest.mark.parametrize(
    ("params", "extra", "field"),
    [
        ({"beam_width": 0}, {}, "beam_width"),
        ({"beam_width": 2, "n": 3}, {}, "beam_width"),
        ({"beam_width": 2, "max_new_tokens": 0}, {}, "beam_width"),
        ({"beam_width": 2}, {"return_logprob": True}, "beam_width"),
        ({"beam_width": 64}, {}, "beam_width"),
        ({"length_penalty": 0.5}, {}, "length_penalty"),
        ({"beam_width": 2, "length_penalty": "x"}, {}, "length_penalty"),
    ],
)
def test_bad_inputs_are_400s_naming_the_field(llama, params, extra, field) -> None:
    server, _ = llama
    response = generate(server, prompts(1)[0], sampling_params={"max_new_tokens": 4, **params}, **extra)
    assert response.status_code == 400, response.text
    assert field in response.text


def test_client_abort_frees_every_beam_row(llama) -> None:
    """A client that leaves mid-search: the leader is aborted, its members leave at the next step."""
    server, _ = llama
    body = {"input_ids": prompts(1)[0], "stream": True,
            "sampling_params": {"beam_width": 4, "max_new_tokens": 400, "ignore_eos": True}}
    host, port = server.url.removeprefix("http://").split(":")
    payload = orjson.dumps(body)
    head = f"POST /generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    with socket.create_connection((host, int(port))) as sock:  # the response is never read
        sock.sendall(head.encode() + payload)
        wait_for_load(server, lambda load: load["num_running_reqs"] >= 1)  # the search runs
    wait_idle(server)


def test_no_slot_left_held(llama) -> None:
    server, _ = llama
    prompt = prompts(1)[0]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda k: beam_request(server, prompt, beam_width=k, max_new_tokens=7, ignore_eos=True), [2, 3, 4, 4]))
    wait_idle(server)
