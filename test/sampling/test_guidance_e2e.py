"""End to end: sampling_params.guidance against a two-context reference, on a tiny random Qwen3
checkpoint (300-token vocabulary, prompts as ids; guidance_utils.py).

The reference runs both contexts separately through the server's own /generate: one request
per context whose prompt is the context plus the guided output, returning the prompt logprobs
of every vocabulary id at the output's positions (token_ids_logprob), so each output token's
main and guide distributions; the test mixes them by the issue's formulas."""

from __future__ import annotations

import concurrent.futures
import time

import numpy as np
import openai
import pytest
import requests

from engine_utils import generate, generate_ok, greedy, iter_stream, running_server, stream_chunks
from guidance_utils import VOCAB, save_guidance_tiny, tiny_flags

pytestmark = pytest.mark.e2e

MAIN = list(range(40, 60))
GUIDE = [7, 3, 250, 19, 88, 120, 5, 61]
N_TOKENS = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory, gguf_path):
    folder = save_guidance_tiny(str(tmp_path_factory.mktemp("guidance_tiny")))
    with running_server(*tiny_flags(folder, gguf_path)) as srv:
        yield srv


def _distributions(server, context: list[int], output: list[int]) -> np.ndarray:
    """[len(output), VOCAB] float64 log-probs of each output token's position given `context`
    and the output before it."""
    result = generate_ok(
        server, context + output, sampling_params={"max_new_tokens": 1, "temperature": 0},
        return_logprob=True, logprob_start_len=len(context), token_ids_logprob=list(range(VOCAB)),
    )
    rows = result["meta_info"]["input_token_ids_logprobs"]
    assert len(rows) == len(output)
    return np.array([[entry[0] for entry in row] for row in rows], dtype=np.float64)


def _mix(lc: np.ndarray, lg: np.ndarray, guidance: dict, alpha=None) -> np.ndarray:
    method = guidance["method"]
    if method == "cfg":
        return lg + guidance["weight"] * (lc - lg)
    if method == "mixture":
        a = guidance["alpha"] if alpha is None else np.asarray(alpha)[:, None]
        return a * lc + (1 - a) * lg
    keep = lc >= np.log(guidance.get("plausibility", 0.1)) + lc.max(axis=-1, keepdims=True)
    return np.where(keep, lc - guidance["weight"] * lg, -np.inf)


def _guided(server, guidance: dict, n: int = N_TOKENS, **params) -> dict:
    return generate_ok(server, MAIN, sampling_params=greedy(n, ignore_eos=True, guidance=guidance, **params))


METHODS = [
    {"method": "cfg", "input_ids": GUIDE, "weight": 3.0},
    {"method": "mixture", "input_ids": GUIDE, "alpha": 0.4},
    {"method": "mixture", "input_ids": GUIDE, "alpha": "kl_symmetry"},
    {"method": "contrastive", "input_ids": GUIDE, "weight": 0.5, "plausibility": 0.05},
]


@pytest.mark.parametrize("guidance", METHODS, ids=lambda g: f"{g['method']}-{g.get('alpha', g.get('weight'))}")
def test_greedy_tokens_equal_the_two_context_reference(server, guidance):
    result = _guided(server, guidance)
    output = result["output_ids"]
    lc = _distributions(server, MAIN, output)
    lg = _distributions(server, GUIDE, output)
    alpha = result["meta_info"].get("guidance_alpha")
    if guidance["method"] == "mixture":
        assert len(alpha) == len(output)
    else:
        assert alpha is None
    mixed = _mix(lc, lg, guidance, alpha if guidance.get("alpha") == "kl_symmetry" else None)
    assert list(mixed.argmax(axis=-1)) == output
    unguided = generate_ok(server, MAIN, sampling_params=greedy(N_TOKENS, ignore_eos=True))["output_ids"]
    assert output != unguided  # the guide context changed something


def test_kl_symmetry_alphas_make_the_two_kls_equal(server):
    result = _guided(server, METHODS[2])
    output, alphas = result["output_ids"], np.array(result["meta_info"]["guidance_alpha"])
    lc = _distributions(server, MAIN, output)
    lg = _distributions(server, GUIDE, output)
    for t, a in enumerate(alphas):
        logq = a * lc[t] + (1 - a) * lg[t]
        logq -= np.logaddexp.reduce(logq)
        q = np.exp(logq)
        kl_c, kl_g = (q * (logq - lc[t])).sum(), (q * (logq - lg[t])).sum()
        assert 0 <= a <= 1
        assert abs(kl_c - kl_g) < 2e-3 * max(kl_c, 1e-3), (t, a, kl_c, kl_g)


def test_cfg_weight_one_equals_the_unguided_request(server):
    seeded = dict(temperature=0.9, top_p=0.95, sampling_seed=11, max_new_tokens=12, ignore_eos=True, repetition_penalty=1.3)
    guidance = {"method": "cfg", "input_ids": GUIDE, "weight": 1.0}
    for params in (greedy(12, ignore_eos=True, frequency_penalty=0.7), seeded):
        plain = generate_ok(server, MAIN, sampling_params=params)["output_ids"]
        assert generate_ok(server, MAIN, sampling_params={**params, "guidance": guidance})["output_ids"] == plain


def _batch(server, items: list[dict]) -> list[list[int]]:
    with concurrent.futures.ThreadPoolExecutor(len(items)) as pool:
        futures = [pool.submit(generate_ok, server, MAIN, sampling_params=p) for p in items]
        return [f.result()["output_ids"] for f in futures]


def test_guided_and_unguided_rows_in_one_batch_equal_their_solo_runs(server):
    sampled = dict(temperature=0.8, top_k=40, max_new_tokens=10, ignore_eos=True)
    items = [
        {**sampled, "sampling_seed": 1, "guidance": METHODS[0]},
        greedy(10, ignore_eos=True),
        {**sampled, "sampling_seed": 2, "guidance": METHODS[2], "presence_penalty": 0.5},
        {**sampled, "sampling_seed": 3},
        greedy(10, ignore_eos=True, guidance=METHODS[3]),
        {**sampled, "sampling_seed": 4, "guidance": {"method": "cfg", "input_ids": [1, 2, 3], "weight": 2.0}},
    ]
    solo = [generate_ok(server, MAIN, sampling_params=p)["output_ids"] for p in items]
    assert _batch(server, items) == solo
    assert _batch(server, items[::-1]) == solo[::-1]


def test_n_and_streaming_carry_the_guidance(server):
    params = {"temperature": 0.8, "max_new_tokens": 6, "ignore_eos": True, "sampling_seed": 5, "n": 2, "guidance": METHODS[2]}
    results = generate_ok(server, MAIN, sampling_params=params)
    assert len(results) == 2 and all(len(r["meta_info"]["guidance_alpha"]) == 6 for r in results)
    chunks = stream_chunks(server, {"input_ids": MAIN, "sampling_params": greedy(6, ignore_eos=True, guidance=METHODS[2])})
    whole = _guided(server, METHODS[2], n=6)
    assert chunks[-1]["output_ids"] == whole["output_ids"]
    assert chunks[-1]["meta_info"]["guidance_alpha"] == whole["meta_info"]["guidance_alpha"]


def test_openai_routes_take_guidance_as_an_extra_body_field(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    guidance = {"method": "cfg", "input_ids": GUIDE, "weight": 3.0}
    completion = client.completions.create(
        model="default", prompt=MAIN, max_tokens=N_TOKENS, temperature=0, extra_body={"guidance": guidance, "ignore_eos": True}
    )
    assert completion.choices[0].text == _guided(server, guidance)["text"]
    assert completion.choices[0].text
    with pytest.raises(openai.BadRequestError, match="guidance.weight"):
        client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
            extra_body={"guidance": {"method": "cfg", "input_ids": GUIDE, "weight": -1}},
        )


@pytest.mark.parametrize(
    ("guidance", "field"),
    [
        ({"method": "beam", "input_ids": GUIDE}, "guidance.method"),
        ({"method": "cfg", "weight": 1.0}, "guidance.input_ids"),
        ({"method": "cfg", "input_ids": GUIDE, "weight": -2}, "guidance.weight"),
        ({"method": "mixture", "input_ids": GUIDE, "alpha": 1.2}, "guidance.alpha"),
        ({"method": "contrastive", "input_ids": GUIDE, "weight": 1, "plausibility": 0}, "guidance.plausibility"),
        ({"method": "cfg", "input_ids": [VOCAB + 5], "weight": 1.0}, "guidance.input_ids"),
        ({"method": "cfg", "input_ids": GUIDE, "weight": 1.0, "model": "guide"}, "guidance.model"),
    ],
)
def test_bad_guidance_is_a_400_naming_the_field_and_the_server_serves_on(server, guidance, field):
    response = generate(server, MAIN, sampling_params=greedy(4, guidance=guidance))
    assert response.status_code == 400, response.text
    assert field in response.json()["error"]["message"]
    assert len(generate_ok(server, MAIN, sampling_params=greedy(2))["output_ids"]) == 2


def test_a_guided_request_dropped_by_its_client_frees_both_contexts(server):
    payload = {"input_ids": MAIN, "sampling_params": {"max_new_tokens": 400, "ignore_eos": True, "guidance": METHODS[0]}}
    for _ in iter_stream(server, payload):
        break  # the client goes away: the pair is aborted and released
    deadline = time.monotonic() + 60
    while _reqs(requests.get(server.url + "/get_load", timeout=30).json()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _reqs(requests.get(server.url + "/get_load", timeout=30).json()) == 0
    assert len(generate_ok(server, MAIN, sampling_params=greedy(3, guidance=METHODS[0]))["output_ids"]) == 3


def _reqs(load) -> int:
    loads = load if isinstance(load, list) else [load]
    return sum(entry["num_reqs"] for entry in loads)
