"""End to end on the embedded SmolLM2: every sampling parameter changes tokens as documented."""

from __future__ import annotations

import concurrent.futures

import openai
import pytest

from engine_utils import generate, generate_ok, greedy, processor_shipped_by_value, running_server, stream_chunks
from sglang.srt.managers.fan_out import derive_child_seed

pytestmark = pytest.mark.e2e

PROMPT = "The capital of France is"
REPETITIVE = "one two three one two three one two three one two three one two three"
CHAT_SHORT = "<|im_start|>user\nSay only the word yes.<|im_end|>\n<|im_start|>assistant\n"
EOS = 2  # <|im_end|>


@pytest.fixture(scope="module")
def server():
    with running_server("--enable-custom-logit-processor") as srv:
        yield srv


def _greedy_ids(server, text, **params):
    return generate_ok(server, text, sampling_params=greedy(**params))["output_ids"]


def test_greedy_is_reproducible_and_equals_top_k_1(server):
    first = _greedy_ids(server, PROMPT)
    assert first == _greedy_ids(server, PROMPT)
    top_k_1 = generate_ok(server, PROMPT, sampling_params={"top_k": 1, "temperature": 0.7, "max_new_tokens": 16})
    assert top_k_1["output_ids"] == first


def test_logit_bias_forces_and_bans(server):
    baseline = _greedy_ids(server, PROMPT)
    banned = _greedy_ids(server, PROMPT, logit_bias={str(baseline[0]): -100})
    assert banned[0] != baseline[0]
    forced = _greedy_ids(server, PROMPT, max_new_tokens=5, logit_bias={"1234": 100}, ignore_eos=True)
    assert forced == [1234] * 5


@pytest.mark.parametrize("penalty", [{"frequency_penalty": 1.5}, {"presence_penalty": 1.5}, {"repetition_penalty": 1.6}])
def test_each_penalty_changes_a_repetitive_continuation(server, penalty):
    baseline = _greedy_ids(server, REPETITIVE, max_new_tokens=24)
    penalised = _greedy_ids(server, REPETITIVE, max_new_tokens=24, **penalty)
    assert penalised != baseline


def test_min_new_tokens_holds_back_eos(server):
    baseline = generate_ok(server, CHAT_SHORT, sampling_params=greedy(32))
    assert baseline["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
    n = baseline["meta_info"]["completion_tokens"]
    held = generate_ok(server, CHAT_SHORT, sampling_params=greedy(64, min_new_tokens=n + 6))
    assert held["meta_info"]["completion_tokens"] >= n + 6
    assert EOS not in held["output_ids"][: n + 5]


def test_stop_string_ends_and_is_trimmed(server):
    baseline = generate_ok(server, PROMPT, sampling_params=greedy(16))
    stop = baseline["text"].split()[1]
    stopped = generate_ok(server, PROMPT, sampling_params=greedy(16, stop=[stop]))
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert stop not in stopped["text"] and baseline["text"].startswith(stopped["text"])
    kept = generate_ok(server, PROMPT, sampling_params=greedy(16, stop=[stop], no_stop_trim=True))
    assert kept["text"].endswith(stop) or stop in kept["text"]


def test_stop_regex(server):
    baseline = generate_ok(server, PROMPT, sampling_params=greedy(16))
    word = baseline["text"].split()[0].strip(".,")
    stopped = generate_ok(server, PROMPT, sampling_params=greedy(16, stop_regex=[f"{word}[.,]?"]))
    assert stopped["meta_info"]["finish_reason"]["type"] == "stop"
    assert word not in stopped["text"]


def test_stop_token_ids_stop_even_with_ignore_eos(server):
    baseline = _greedy_ids(server, PROMPT)
    stop_id = baseline[3]
    out = generate_ok(server, PROMPT, sampling_params=greedy(16, stop_token_ids=[stop_id], ignore_eos=True))
    assert out["output_ids"] == baseline[: baseline.index(stop_id) + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}


def test_ignore_eos_runs_past_eos(server):
    out = generate_ok(server, CHAT_SHORT, sampling_params=greedy(20, ignore_eos=True))
    assert out["meta_info"]["completion_tokens"] == 20
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 20}


def test_skip_special_tokens(server):
    params = greedy(24, ignore_eos=True)
    skipped = generate_ok(server, CHAT_SHORT, sampling_params=params)
    kept = generate_ok(server, CHAT_SHORT, sampling_params={**params, "skip_special_tokens": False})
    assert skipped["output_ids"] == kept["output_ids"] and EOS in kept["output_ids"]
    assert "<|im_end|>" in kept["text"] and "<|im_end|>" not in skipped["text"]


def test_seeds_reproduce_and_differ(server):
    def run(seed):
        params = {"temperature": 1.0, "max_new_tokens": 24, "sampling_seed": seed, "ignore_eos": True}
        return generate_ok(server, PROMPT, sampling_params=params)["output_ids"]

    assert run(1) == run(1)
    assert run(1) != run(2)


@pytest.mark.parametrize("params", [{"top_k": 5}, {"top_p": 0.5}, {"min_p": 0.3}, {"temperature": 0.3}])
def test_truncation_changes_seeded_sampling(server, params):
    def run(extra):
        base = {"temperature": 1.5, "max_new_tokens": 24, "sampling_seed": 11, "ignore_eos": True}
        return generate_ok(server, PROMPT, sampling_params={**base, **extra})["output_ids"]

    assert run(params) != run({})


def test_n_with_seed_gives_distinct_reproducible_samples(server):
    def run():
        out = generate_ok(server, PROMPT, sampling_params={"n": 3, "temperature": 1.0, "max_new_tokens": 12, "sampling_seed": 5})
        return [o["output_ids"] for o in out]

    first = run()
    assert len({tuple(x) for x in first}) == 3
    assert run() == first


def test_n_children_share_the_prompt_kv(server):
    prompt = "Once upon a time in a small village by the sea, there lived"
    params = {"n": 4, "temperature": 1.0, "max_new_tokens": 12, "sampling_seed": 9}
    shared = generate_ok(server, prompt, sampling_params=params)
    prompt_tokens = shared[0]["meta_info"]["prompt_tokens"]
    assert sorted(o["meta_info"]["cached_tokens"] for o in shared) == [0] + [prompt_tokens - 1] * 3
    alone = [
        generate_ok(server, prompt, sampling_params={**params, "n": 1, "sampling_seed": derive_child_seed(9, i)})
        for i in range(4)
    ]
    assert [o["output_ids"] for o in shared] == [o["output_ids"] for o in alone]
    # The prompt stayed in the prefix cache after the children finished.
    assert all(o["meta_info"]["cached_tokens"] == prompt_tokens - 1 for o in alone)
    greedy_children = generate_ok(server, prompt, sampling_params=greedy(12, n=3))
    assert len({tuple(o["output_ids"]) for o in greedy_children}) == 1
    assert greedy_children[0]["output_ids"] == _greedy_ids(server, prompt, max_new_tokens=12)


def test_logprobs(server):
    out = generate_ok(
        server,
        PROMPT,
        sampling_params=greedy(6),
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=3,
        token_ids_logprob=[5, 7],
        return_text_in_logprobs=True,
    )
    meta = out["meta_info"]
    assert meta["input_token_logprobs"][0][0] is None
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"]
    assert len(meta["output_token_logprobs"]) == len(out["output_ids"]) == 6
    for (logprob, token, text), top, by_id in zip(meta["output_token_logprobs"], meta["output_top_logprobs"], meta["output_token_ids_logprobs"]):
        assert top[0][1] == token and top[0][0] == pytest.approx(logprob)  # greedy = top-1
        assert isinstance(text, str)
        assert [entry[1] for entry in by_id] == [5, 7]


def test_streaming_is_cumulative_and_matches_non_stream(server):
    payload = {"text": PROMPT, "sampling_params": greedy(12)}
    chunks = stream_chunks(server, payload)
    assert len(chunks) > 1
    assert chunks[-1]["output_ids"] == generate_ok(server, PROMPT, sampling_params=greedy(12))["output_ids"]
    assert all(a["text"] == b["text"][: len(a["text"])] for a, b in zip(chunks, chunks[1:]))


def test_builtin_processor_by_name_and_raising_processor_fails_alone(server):
    baseline = _greedy_ids(server, PROMPT)
    by_name = generate_ok(
        server,
        PROMPT,
        sampling_params=greedy(16, custom_params={"token_ids": [baseline[0]]}),
        custom_logit_processor='{"name": "DisallowedTokensLogitsProcessor"}',
    )
    assert by_name["output_ids"][0] != baseline[0]

    Boom = processor_shipped_by_value("raise RuntimeError('boom from a processor')")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        bad = pool.submit(generate, server, PROMPT, sampling_params=greedy(16, custom_params={}), custom_logit_processor=Boom.to_str())
        good = [pool.submit(generate_ok, server, PROMPT, sampling_params=greedy(16)) for _ in range(2)]
        bad_result = bad.result()
        good_results = [g.result() for g in good]
    finish = bad_result.json()["meta_info"]["finish_reason"]
    assert finish["type"] == "abort" and "boom from a processor" in finish["message"]
    assert all(r["output_ids"] == baseline for r in good_results)


# ----------------------------------------------------------------------------------------- OpenAI client


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


def _model(client):
    return client.models.list().data[0].id


def test_openai_chat_completion(client):
    reply = client.chat.completions.create(
        model=_model(client), messages=[{"role": "user", "content": "What is 2 + 2?"}], max_tokens=16, temperature=0
    )
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.usage.completion_tokens > 0


def test_openai_streaming_matches_non_stream(client):
    kwargs = dict(model=_model(client), messages=[{"role": "user", "content": "Name a color."}], max_tokens=12, temperature=0)
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs) if c.choices]
    assert "".join(pieces) == full


def test_openai_n_with_seed(client):
    kwargs = dict(model=_model(client), messages=[{"role": "user", "content": "Tell me a word."}], max_tokens=10, n=3, seed=42, temperature=1.0)
    first = [c.message.content for c in client.chat.completions.create(**kwargs).choices]
    second = [c.message.content for c in client.chat.completions.create(**kwargs).choices]
    assert len(set(first)) == 3 and first == second


def test_openai_logprobs(client):
    reply = client.chat.completions.create(
        model=_model(client), messages=[{"role": "user", "content": "Hi"}], max_tokens=5, temperature=0, logprobs=True, top_logprobs=2
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob for t in content)
    assert content[0].top_logprobs[0].logprob == pytest.approx(content[0].logprob)


def test_openai_completions_extra_fields_reach_the_sampler(client, server):
    base = dict(model=_model(client), prompt=PROMPT, max_tokens=8)
    greedy_text = client.completions.create(**base, temperature=0).choices[0].text
    top_k_1 = client.completions.create(**base, temperature=1.0, extra_body={"top_k": 1}).choices[0].text
    assert top_k_1 == greedy_text
    forced = client.completions.create(**base, temperature=0, logit_bias={"1234": 100}, extra_body={"ignore_eos": True})
    native = generate_ok(server, PROMPT, sampling_params=greedy(8, logit_bias={"1234": 100}, ignore_eos=True))
    assert forced.choices[0].text == native["text"]
    penalised = client.completions.create(**base, temperature=0, extra_body={"repetition_penalty": 1.8}).choices[0].text
    native = generate_ok(server, PROMPT, sampling_params=greedy(8, repetition_penalty=1.8))
    assert penalised == native["text"]
