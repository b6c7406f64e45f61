"""OpenAI routes against a fake tokenizer manager: mapping to GenerateReqInput, response shapes,
streaming, fan-out seeds, sampling defaults and errors, driven by the official openai client."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import socket
import threading
import time
import zlib
from types import SimpleNamespace
from typing import Any, AsyncIterator, Callable, Optional

import openai
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from sglang.srt.entrypoints.openai import register_openai_routes, serving_chat
from sglang.srt.entrypoints.openai.protocol import MAX_N
from sglang.srt.entrypoints.openai.serving_chat import strip_duplicate_bos, tokenizer_adds_bos
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.fan_out import child_rids, child_sampling_params, derive_child_seed, merge_indexed
from sglang.srt.server_args import ServerArgs

MODEL = "fake-model"
EOS = 2
MAX_FAKE_TOKENS = 6  # the fake stops itself ("stop" on EOS) after this many tokens


class FakeTokenizer:
    """One id per character; a chat template that shows roles, contents and template variables."""

    bos_token = "<s>"
    bos_token_id = 1

    def __init__(self, adds_bos: bool = False) -> None:
        self.adds_bos = adds_bos

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [10 + ord(c) % 50 for c in text]
        return [self.bos_token_id] + ids if self.adds_bos and add_special_tokens else ids

    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)

    def apply_chat_template(
        self, messages: list[dict], tokenize: bool, add_generation_prompt: bool, **variables: Any
    ) -> str:
        assert tokenize is False
        text = "<s>" + "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        text += "".join(f"[{k}={v}]" for k, v in sorted(variables.items()))
        return text + ("<|assistant|>" if add_generation_prompt else "")


def token_text(token_id: int) -> str:
    return f" w{token_id}"


class FakeTokenizerManager:
    """Deterministic cumulative native items from a GenerateReqInput; records every input.

    generate_many fans each request out into its n children and merges their streams with the
    tokenizer manager's own functions; `received` holds the children. Output ids depend on
    (prompt, sampling_seed). Prompts containing RAISE are rejected before anything is yielded;
    FAIL_MIDWAY fails after the first streamed item; HANG never finishes after its first item.
    """

    def __init__(self, tokenizer: FakeTokenizer) -> None:
        self.tokenizer = tokenizer
        self.ready = SimpleNamespace(
            vocab_size=100, context_len=2048, eos_token_ids=[EOS], model_path="/models/fake"
        )
        self.received: list[GenerateReqInput] = []
        self.closed: list[str] = []  # rids whose generator was closed before finishing

    def generate_many(self, objs: list[GenerateReqInput], grammar_checked: bool = False) -> AsyncIterator[dict[str, Any]]:
        children = []
        for obj in objs:
            n = obj.sampling_params.get("n", 1)
            rids = child_rids(obj.rid, n)
            params = child_sampling_params(obj.sampling_params, n)
            children += [dataclasses.replace(obj, rid=r, sampling_params=p) for r, p in zip(rids, params)]
        return merge_indexed([self.generate_request(child) for child in children], [1] * len(children))

    async def generate_request(self, obj: GenerateReqInput) -> AsyncIterator[dict[str, Any]]:
        self.received.append(obj)
        prompt = obj.text if obj.text is not None else " ".join(map(str, obj.input_ids))
        if "RAISE" in prompt:
            raise ValueError("flagged input rejected by the engine")
        max_new = obj.sampling_params.get("max_new_tokens", 128)
        count = MAX_FAKE_TOKENS if max_new is None else min(max_new, MAX_FAKE_TOKENS)
        key = f"{prompt}|{obj.sampling_params.get('sampling_seed')}".encode()
        ids = [10 + zlib.crc32(key + bytes([k])) % 80 for k in range(count)]
        try:
            for step in range(1, count + 1):
                if "FAIL_MIDWAY" in prompt and step == 2:
                    raise RuntimeError("engine crashed")
                if "HANG" in prompt and step == 2:
                    await asyncio.Event().wait()
                if obj.stream or step == count:
                    yield self._item(
                        obj, prompt, ids[:step], finished=step == count, length_cap=count == max_new
                    )
        except (asyncio.CancelledError, GeneratorExit):
            self.closed.append(obj.rid)
            raise

    def _item(
        self, obj: GenerateReqInput, prompt: str, ids: list[int], finished: bool, length_cap: bool
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": obj.rid,
            "finish_reason": None,
            "prompt_tokens": len(self.tokenizer.encode(prompt)),
            "completion_tokens": len(ids),
            "cached_tokens": 0,
        }
        if finished:
            meta["finish_reason"] = (
                {"type": "length", "length": len(ids)} if length_cap else {"type": "stop", "matched": EOS}
            )
        if obj.return_logprob:
            meta.update(self._logprobs(obj, prompt, ids))
        return {"text": "".join(map(token_text, ids)), "output_ids": list(ids), "meta_info": meta}

    def _logprobs(self, obj: GenerateReqInput, prompt: str, ids: list[int]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "output_token_logprobs": [[-0.5 * (k + 1), t, token_text(t)] for k, t in enumerate(ids)]
        }
        if obj.top_logprobs_num:
            # The last candidate of every token is impossible: its logprob is -inf.
            out["output_top_logprobs"] = [
                [[-0.5 * (k + 1) - j, t + j, token_text(t + j)] for j in range(obj.top_logprobs_num - 1)]
                + [[-math.inf, t + 100, token_text(t + 100)]]
                for k, t in enumerate(ids)
            ]
        if obj.logprob_start_len == 0:
            # One token per prompt character (the fake tokenizer's rule).
            prompt_ids = self.tokenizer.encode(prompt)
            out["input_token_logprobs"] = [
                [None if k == 0 else -1.0, t, c] for k, (t, c) in enumerate(zip(prompt_ids, prompt))
            ]
            out["input_top_logprobs"] = [None] * len(prompt_ids)
        return out


def make_app(fake: FakeTokenizerManager, sampling_defaults: str = "openai") -> FastAPI:
    app = FastAPI()
    args = ServerArgs(model_path="/models/fake", served_model_name=MODEL, sampling_defaults=sampling_defaults)
    register_openai_routes(app, fake, args)
    return app


@pytest.fixture(scope="module")
def live() -> SimpleNamespace:
    """A real uvicorn server on a free loopback port, shared by the module's tests."""
    fake = FakeTokenizerManager(FakeTokenizer())
    app = make_app(fake)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    port = sock.getsockname()[1]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    yield SimpleNamespace(fake=fake, client=client, raw=TestClient(app), port=port)
    server.should_exit = True
    thread.join(timeout=30)
    sock.close()


@pytest.fixture
def fake(live: SimpleNamespace) -> FakeTokenizerManager:
    live.fake.received.clear()
    live.fake.closed.clear()
    return live.fake


@pytest.fixture
def client(live: SimpleNamespace, fake: FakeTokenizerManager) -> openai.OpenAI:
    return live.client


@pytest.fixture
def raw(live: SimpleNamespace, fake: FakeTokenizerManager) -> TestClient:
    return live.raw


def chat(client: openai.OpenAI, content: str = "hi", **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], **kwargs
    )


def sse_events(body: str) -> list[str]:
    assert body.endswith("data: [DONE]\n\n")
    events = body.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


# ----------------------------------------------------------------------------- models


def test_retrieve_model(client: openai.OpenAI, raw: TestClient) -> None:
    assert client.models.retrieve(MODEL).id == MODEL
    missing = raw.get("/v1/models/other-model")
    assert missing.status_code == 404
    assert missing.json()["param"] == "model" and "other-model" in missing.json()["message"]


def test_models_lists_the_served_model(client: openai.OpenAI, raw: TestClient) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    body = raw.get("/v1/models").json()
    assert body["object"] == "list"
    assert body["data"][0] | {"created": 0} == {
        "id": MODEL,
        "object": "model",
        "created": 0,
        "owned_by": "sglang",
        "root": "/models/fake",
        "max_model_len": 2048,
    }


# ----------------------------------------------------------------------------- chat


def test_chat_applies_the_template_and_maps_defaults(
    client: openai.OpenAI, fake: FakeTokenizerManager
) -> None:
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ],
        max_tokens=4,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    (obj,) = fake.received
    # BOS stays: this tokenizer does not add one when the text is encoded.
    assert obj.text == "<s><|system|>be brief\n<|user|>a\nb\n[enable_thinking=False]<|assistant|>"
    assert obj.input_ids is None and obj.stream is False and obj.return_logprob is False
    assert obj.sampling_params == {
        "max_new_tokens": 4,
        "min_new_tokens": 0,
        "n": 1,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "ignore_eos": False,
        "no_stop_trim": False,
        "skip_special_tokens": True,
        "spaces_between_special_tokens": True,
    }
    assert resp.id.startswith("chatcmpl-") and resp.object == "chat.completion" and resp.model == MODEL
    (choice,) = resp.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.message.content.startswith(" w") and choice.message.content.count(" w") == 4
    assert choice.finish_reason == "length" and choice.model_extra["matched_stop"] is None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.total_tokens) == (
        len(obj.text),
        4,
        len(obj.text) + 4,
    )


def test_chat_without_max_tokens_runs_to_the_end(client: openai.OpenAI, fake: FakeTokenizerManager) -> None:
    resp = chat(client)
    assert fake.received[0].sampling_params["max_new_tokens"] is None
    assert resp.choices[0].finish_reason == "stop" and resp.choices[0].model_extra["matched_stop"] == EOS
    assert chat(client, max_completion_tokens=3, max_tokens=5).usage.completion_tokens == 3


def test_template_bos_is_not_doubled() -> None:
    adding = FakeTokenizer(adds_bos=True)
    assert tokenizer_adds_bos(adding) and not tokenizer_adds_bos(FakeTokenizer())
    assert strip_duplicate_bos("<s>x", adding, adds_bos=True) == "x"
    assert strip_duplicate_bos("<s>x", adding, adds_bos=False) == "<s>x"
    fake = FakeTokenizerManager(adding)
    resp = TestClient(make_app(fake)).post(
        "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert resp.status_code == 200
    assert fake.received[0].text == "<|user|>hi\n<|assistant|>"


def test_chat_stream_deltas_reassemble(client: openai.OpenAI, fake: FakeTokenizerManager) -> None:
    full = chat(client, seed=5).choices[0].message.content
    chunks = list(chat(client, seed=5, stream=True, stream_options={"include_usage": True}))
    assert fake.received[1].stream is True
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert all(c.choices[0].delta.role is None for c in chunks[1:-1])
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == full
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 2) + ["stop"]
    assert len({c.id for c in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == MAX_FAKE_TOKENS


def test_chat_stream_wire_format(raw: TestClient) -> None:
    body = raw.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "stream": True, "n": 2}
    ).text
    events = sse_events(body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    # reasoning_content is in every delta (null without a reasoning parser), as SGLang sends it.
    assert [c["choices"][0]["delta"] for c in chunks[:2]] == [{"role": "assistant", "content": "", "reasoning_content": None}] * 2
    assert "usage" not in chunks[-1] or chunks[-1]["usage"] is None  # not asked for
    finished = {c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]}
    assert finished == {0, 1}


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def test_client_leaving_a_stream_closes_every_engine_stream(
    client: openai.OpenAI, fake: FakeTokenizerManager
) -> None:
    stream = chat(client, content="HANG", n=2, stream=True)
    first = next(iter(stream))
    assert first.choices[0].delta.role == "assistant"
    stream.close()
    wait_until(lambda: len(fake.closed) == 2, "the engine streams are closed")
    assert sorted(fake.closed) == sorted(o.rid for o in fake.received)


def test_client_leaving_a_non_stream_request_closes_every_engine_stream(
    live: SimpleNamespace, fake: FakeTokenizerManager
) -> None:
    body = json.dumps({"prompt": "HANG", "n": 2}).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", live.port)) as conn:
        conn.sendall(head.encode() + body)
        wait_until(lambda: len(fake.received) == 2, "both choices reach the engine")
    wait_until(lambda: len(fake.closed) == 2, "the engine streams are closed")


# ----------------------------------------------------------------------------- completions


def test_completion_maps_and_defaults_to_16_tokens(client: openai.OpenAI, fake: FakeTokenizerManager) -> None:
    resp = client.completions.create(model=MODEL, prompt="hello")
    (obj,) = fake.received
    assert obj.text == "hello" and obj.sampling_params["max_new_tokens"] == 16
    assert resp.id.startswith("cmpl-") and resp.object == "text_completion"
    assert resp.choices[0].text.count(" w") == MAX_FAKE_TOKENS and resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].logprobs is None


def test_completion_prompt_forms_and_usage(client: openai.OpenAI, fake: FakeTokenizerManager) -> None:
    resp = client.completions.create(model=MODEL, prompt=["ab", "cde"], n=2, max_tokens=2)
    assert [o.text for o in fake.received] == ["ab", "ab", "cde", "cde"]
    assert sorted(c.index for c in resp.choices) == [0, 1, 2, 3]
    # Each prompt is counted once, however many choices it has.
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (5, 8)
    fake.received.clear()
    client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=1)
    client.completions.create(model=MODEL, prompt=[[5], [6, 7]], max_tokens=1)
    assert [o.input_ids for o in fake.received] == [[5, 6, 7], [5], [6, 7]]
    assert all(o.text is None for o in fake.received)


def test_completion_stream_deltas_reassemble(client: openai.OpenAI, fake: FakeTokenizerManager) -> None:
    full = client.completions.create(model=MODEL, prompt="p", max_tokens=5).choices[0].text
    chunks = list(client.completions.create(model=MODEL, prompt="p", max_tokens=5, stream=True))
    assert len(chunks) == 5 and chunks[0].object == "text_completion"
    assert "".join(c.choices[0].text for c in chunks) == full
    assert [c.choices[0].finish_reason for c in chunks] == [None] * 4 + ["length"]


def test_completion_echo(client: openai.OpenAI, fake: FakeTokenizerManager) -> None:
    resp = client.completions.create(model=MODEL, prompt="say", max_tokens=2, echo=True)
    assert resp.choices[0].text.startswith("say w")
    assert fake.received[0].logprob_start_len == -1
    chunks = list(client.completions.create(model=MODEL, prompt="say", max_tokens=2, echo=True, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == resp.choices[0].text


# ----------------------------------------------------------------------------- seeds and n


def test_seed_maps_to_sampling_seed(client: openai.OpenAI, fake: FakeTokenizerManager) -> None:
    chat(client, seed=7)
    client.completions.create(model=MODEL, prompt="x", seed=-7)
    chat(client)
    assert [o.sampling_params.get("sampling_seed") for o in fake.received] == [7, -7, None]


def test_n_with_seed_gets_distinct_stable_derived_seeds(
    client: openai.OpenAI, fake: FakeTokenizerManager
) -> None:
    first = chat(client, n=3, seed=1234)
    seeds = [o.sampling_params["sampling_seed"] for o in fake.received]
    assert all(o.sampling_params["n"] == 1 for o in fake.received)
    assert len(set(seeds)) == 3 and all(-(2**63) <= s < 2**63 for s in seeds)
    assert seeds == [derive_child_seed(1234, i) for i in range(3)]
    assert len({o.rid for o in fake.received}) == 3
    fake.received.clear()
    second = chat(client, n=3, seed=1234)
    assert [o.sampling_params["sampling_seed"] for o in fake.received] == seeds
    texts = [c.message.content for c in sorted(first.choices, key=lambda c: c.index)]
    assert texts == [c.message.content for c in sorted(second.choices, key=lambda c: c.index)]
    assert len(set(texts)) == 3
    assert first.usage.completion_tokens == 3 * MAX_FAKE_TOKENS


def test_n_without_seed_leaves_seeds_to_the_engine(client: openai.OpenAI, fake: FakeTokenizerManager) -> None:
    chat(client, n=2)
    assert [o.sampling_params.get("sampling_seed") for o in fake.received] == [None, None]


def test_choices_of_any_allowed_n_never_share_a_seed() -> None:
    for seed in (0, -1, 2**63 - 1, -(2**63)):
        derived = [derive_child_seed(seed, i) for i in range(MAX_N)]
        assert len(set(derived)) == MAX_N
        assert all(-(2**63) <= s < 2**63 for s in derived)


# ----------------------------------------------------------------------------- logprobs


def test_chat_logprobs_shape(client: openai.OpenAI, fake: FakeTokenizerManager, raw: TestClient) -> None:
    resp = chat(client, logprobs=True, top_logprobs=2, max_tokens=3)
    obj = fake.received[0]
    assert (obj.return_logprob, obj.top_logprobs_num, obj.return_text_in_logprobs) == (True, 2, True)
    content = resp.choices[0].logprobs.content
    assert "".join(t.token for t in content) == resp.choices[0].message.content
    assert [t.logprob for t in content] == [-0.5, -1.0, -1.5]
    for entry in content:
        assert entry.bytes == list(entry.token.encode("utf-8"))
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[1].logprob is None  # -inf is not JSON: null
    body = raw.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "logprobs": True}
    ).json()
    assert [t["top_logprobs"] for t in body["choices"][0]["logprobs"]["content"]] == [[]] * MAX_FAKE_TOKENS


def test_chat_stream_logprobs(client: openai.OpenAI) -> None:
    chunks = list(chat(client, logprobs=True, top_logprobs=1, max_tokens=3, stream=True))
    per_chunk = [len(c.choices[0].logprobs.content) for c in chunks[1:]]
    assert per_chunk == [1, 1, 1]


def test_completion_logprobs_shape(client: openai.OpenAI, fake: FakeTokenizerManager) -> None:
    resp = client.completions.create(model=MODEL, prompt="q", max_tokens=3, logprobs=2)
    assert fake.received[0].top_logprobs_num == 2
    choice = resp.choices[0]
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text
    assert lp.token_logprobs == [-0.5, -1.0, -1.5]
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:k]) for k in range(3)]
    assert [list(d.values())[0] for d in lp.top_logprobs] == lp.token_logprobs
    assert all(len(d) == 2 and None in d.values() for d in lp.top_logprobs)


def test_completion_echo_logprobs_include_the_prompt(
    client: openai.OpenAI, fake: FakeTokenizerManager
) -> None:
    resp = client.completions.create(model=MODEL, prompt="ab", max_tokens=2, logprobs=0, echo=True)
    assert fake.received[0].logprob_start_len == 0
    lp = resp.choices[0].logprobs
    assert lp.token_logprobs[:2] == [None, -1.0] and len(lp.tokens) == 4
    assert lp.top_logprobs is None  # logprobs=0: the sampled tokens only
    assert lp.tokens[:2] == ["a", "b"] and lp.text_offset[:3] == [0, 1, 2]


# ----------------------------------------------------------------------------- parameter mapping


def test_extra_fields_are_mapped(client: openai.OpenAI, fake: FakeTokenizerManager) -> None:
    chat(
        client,
        stop=["\n", "end"],
        logit_bias={"5": -3.0},
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        temperature=0.7,
        top_p=0.9,
        user="someone",
        extra_body={
            "top_k": 5,
            "min_p": 0.1,
            "repetition_penalty": 1.2,
            "min_tokens": 2,
            "stop_token_ids": [3],
            "stop_regex": "x+",
            "ignore_eos": True,
            "no_stop_trim": True,
            "skip_special_tokens": False,
            "custom_logit_processor": '{"name": "ban"}',
            "custom_params": {"token_ids": [4]},
            "some_future_openai_key": {"nested": 1},
        },
    )
    obj = fake.received[0]
    sp = obj.sampling_params
    assert obj.custom_logit_processor == '{"name": "ban"}'
    expected = {
        "stop": ["\n", "end"],
        "logit_bias": {"5": -3.0},
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "min_p": 0.1,
        "repetition_penalty": 1.2,
        "min_new_tokens": 2,
        "stop_token_ids": [3],
        "stop_regex": "x+",
        "ignore_eos": True,
        "no_stop_trim": True,
        "skip_special_tokens": False,
        "custom_params": {"token_ids": [4]},
    }
    assert {k: sp[k] for k in expected} == expected


def test_completion_extra_fields_are_mapped(client: openai.OpenAI, fake: FakeTokenizerManager) -> None:
    client.completions.create(
        model=MODEL,
        prompt="x",
        stop="\n",
        extra_body={"top_k": 3, "custom_params": {"a": 1}, "json_schema": "{}"},
    )
    sp = fake.received[0].sampling_params
    assert (sp["stop"], sp["top_k"], sp["custom_params"], sp["json_schema"]) == ("\n", 3, {"a": 1}, "{}")


def test_null_means_default(raw: TestClient, fake: FakeTokenizerManager) -> None:
    resp = raw.post(
        "/v1/completions", json={"prompt": "x", "max_tokens": None, "n": None, "temperature": None}
    )
    assert resp.status_code == 200
    sp = fake.received[0].sampling_params
    assert (sp["max_new_tokens"], sp["n"], sp["temperature"]) == (16, 1, 1.0)


@pytest.fixture
def generation_defaults(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def fake_loader(model_path: str) -> dict[str, Any]:
        calls.append(model_path)
        return {"temperature": 0.3, "top_p": 0.8, "top_k": 20}

    monkeypatch.setattr(serving_chat, "load_generation_defaults", fake_loader)
    return calls


def _sampling_params(
    client: TestClient, fake: FakeTokenizerManager, path: str, body: dict[str, Any]
) -> dict[str, Any]:
    fake.received.clear()
    assert client.post(path, json=body).status_code == 200
    return fake.received[0].sampling_params


def test_sampling_defaults_model_fills_chat_only(generation_defaults: list[str]) -> None:
    fake = FakeTokenizerManager(FakeTokenizer())
    client = TestClient(make_app(fake, sampling_defaults="model"))
    messages = [{"role": "user", "content": "x"}]
    sp = _sampling_params(client, fake, "/v1/chat/completions", {"messages": messages, "top_p": 0.5})
    # user value > generation_config > OpenAI default
    assert (sp["temperature"], sp["top_p"], sp["top_k"], sp["min_p"], sp["repetition_penalty"]) == (
        0.3,
        0.5,
        20,
        0.0,
        1.0,
    )
    sp = _sampling_params(client, fake, "/v1/completions", {"prompt": "x"})
    assert (sp["temperature"], sp["top_p"], sp["top_k"]) == (1.0, 1.0, -1)
    _sampling_params(client, fake, "/v1/chat/completions", {"messages": messages})
    assert generation_defaults == ["/models/fake"]  # read once, lazily


def test_sampling_defaults_openai_ignores_generation_config(generation_defaults: list[str]) -> None:
    fake = FakeTokenizerManager(FakeTokenizer())
    client = TestClient(make_app(fake, sampling_defaults="openai"))
    sp = _sampling_params(
        client, fake, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}
    )
    assert (sp["temperature"], sp["top_p"], sp["top_k"]) == (1.0, 1.0, -1)
    assert generation_defaults == []


def test_missing_model_config_falls_back_to_openai_defaults() -> None:
    assert serving_chat.load_generation_defaults("/nonexistent/model") == {}


# ----------------------------------------------------------------------------- errors


OPENAI_400 = {"object": "error", "type": "BadRequestError", "param": None, "code": 400}


def test_engine_value_error_is_an_openai_400(client: openai.OpenAI, raw: TestClient) -> None:
    with pytest.raises(openai.BadRequestError, match="flagged input"):
        chat(client, content="RAISE")
    for stream in (False, True):
        resp = raw.post("/v1/completions", json={"prompt": "RAISE", "stream": stream, "n": 2})
        assert resp.status_code == 400
        assert resp.json() == {**OPENAI_400, "message": "flagged input rejected by the engine"}


def test_failure_inside_a_stream_is_an_error_event(client: openai.OpenAI, raw: TestClient) -> None:
    with pytest.raises(openai.APIError):
        list(client.completions.create(model=MODEL, prompt="FAIL_MIDWAY", stream=True))
    events = sse_events(
        raw.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "FAIL_MIDWAY"}], "stream": True},
        ).text
    )
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert (error["type"], error["code"]) == ("InternalServerError", 500)
    assert json.loads(events[-3])["choices"][0]["delta"]["content"].startswith(" w")


@pytest.mark.parametrize(
    "path, extra, param",
    [
        ("/v1/chat/completions", {"function_call": "auto"}, "function_call"),
        ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions"),
        ("/v1/chat/completions", {"modalities": ["text", "audio"]}, "modalities"),
        ("/v1/completions", {"suffix": "end"}, "suffix"),
        ("/v1/completions", {"best_of": 3}, "best_of"),
        # SGLang request fields without machinery here.
        ("/v1/chat/completions", {"session_params": {"id": "s"}}, "session_params"),
        ("/v1/chat/completions", {"session_id": "s"}, "session_id"),
        ("/v1/chat/completions", {"return_token_ids": True}, "return_token_ids"),
        ("/v1/chat/completions", {"reasoning": {"effort": "low"}}, "reasoning"),
        ("/v1/chat/completions", {"bootstrap_room": 1}, "bootstrap_room"),
        ("/v1/completions", {"return_hidden_states": True}, "return_hidden_states"),
    ],
)
def test_unsupported_fields_are_refused_by_name(
    raw: TestClient, fake: FakeTokenizerManager, path: str, extra: dict, param: str
) -> None:
    body = {"messages": [{"role": "user", "content": "x"}]} if "chat" in path else {"prompt": "x"}
    resp = raw.post(path, json={**body, **extra})
    assert resp.status_code == 400
    error = resp.json()
    assert error["param"] == param and f"'{param}'" in error["message"] and error["type"] == "BadRequestError"
    assert fake.received == []


_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
_TAG = {
    "type": "structural_tag",
    "structures": [{"begin": "<f>", "schema": _SCHEMA, "end": "</f>"}],
    "triggers": ["<f>"],
}


@pytest.mark.parametrize(
    "response_format, expected",
    [
        ({"type": "text"}, {}),
        ({"type": "json_object"}, {"json_schema": '{"type": "object"}'}),
        (
            {"type": "json_schema", "json_schema": {"name": "a", "schema": _SCHEMA, "strict": True}},
            {"json_schema": json.dumps(_SCHEMA)},
        ),
        ({"type": "json_schema", "json_schema": {"name": "a"}}, {"json_schema": '{"type": "object"}'}),
        (_TAG, {"structural_tag": json.dumps(_TAG)}),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_response_format_becomes_one_grammar_param(
    raw: TestClient, fake: FakeTokenizerManager, path: str, response_format: dict, expected: dict
) -> None:
    body = {"messages": [{"role": "user", "content": "x"}]} if "chat" in path else {"prompt": "x"}
    assert raw.post(path, json={**body, "response_format": response_format, "n": 2}).status_code == 200
    for obj in fake.received:
        grammar = {k: obj.sampling_params[k] for k in ("json_schema", "regex", "ebnf", "structural_tag")
                   if k in obj.sampling_params}
        assert grammar == expected


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "name"),
        ({"response_format": {"type": "json_schema"}}, "json_schema"),
        ({"response_format": {"type": "xml"}}, "'json_object', 'json_schema', 'structural_tag'"),
        ({"response_format": {"type": "json_object"}, "regex": "a+"}, "regex"),
        ({"response_format": {"type": "json_object"}, "ebnf": 'root ::= "a"'}, "ebnf"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "nope"}}}},
         "json_schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"not": {}}}}}, "'not'"),
        ({"response_format": {"type": "structural_tag", "structures": []}}, "triggers"),
    ],
)
def test_bad_response_formats_are_400s_naming_it(
    raw: TestClient, fake: FakeTokenizerManager, extra: dict, words: str
) -> None:
    resp = raw.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], **extra})
    assert resp.status_code == 400, resp.text
    error = resp.json()
    assert error["param"] == "response_format" and "response_format" in error["message"], error
    assert words in error["message"]
    assert fake.received == []


def test_completion_json_schema_and_response_format_conflict(raw: TestClient) -> None:
    body = {"prompt": "x", "json_schema": "{}", "response_format": {"type": "json_object"}}
    error = raw.post("/v1/completions", json=body).json()
    assert error["param"] == "response_format" and "json_schema" in error["message"]


def test_cache_salt_and_extra_key_name_the_prefix_cache_namespace(raw: TestClient, fake: FakeTokenizerManager) -> None:
    """SGLang joins them, salt first, into the engine request's extra_key."""
    chat = {"messages": [{"role": "user", "content": "x"}], "cache_salt": "salt-", "extra_key": "key"}
    assert raw.post("/v1/chat/completions", json=chat).status_code == 200
    assert raw.post("/v1/completions", json={"prompt": "x", "cache_salt": "only"}).status_code == 200
    assert raw.post("/v1/completions", json={"prompt": "x"}).status_code == 200
    assert [r.extra_key for r in fake.received] == ["salt-key", "only", None]


def test_priority_and_prompt_ids_reach_the_engine_request(raw: TestClient, fake: FakeTokenizerManager) -> None:
    chat = {"messages": [{"role": "user", "content": "x"}], "priority": 5, "return_prompt_token_ids": True}
    assert raw.post("/v1/chat/completions", json=chat).status_code == 200
    assert raw.post("/v1/completions", json={"prompt": "x", "priority": -2}).status_code == 200
    assert raw.post("/v1/completions", json={"prompt": "x"}).status_code == 200
    assert [r.priority for r in fake.received] == [5, -2, None]
    assert [r.return_prompt_token_ids for r in fake.received] == [True, False, False]
    bad = raw.post("/v1/chat/completions", json={**chat, "priority": True})
    assert bad.status_code == 400 and bad.json()["param"] == "priority"


def test_harmless_forms_of_unsupported_fields_pass(raw: TestClient) -> None:
    extra = {
        "tool_choice": "none",
        "tools": [],
        "response_format": {"type": "text"},
        "store": False,
        "parallel_tool_calls": True,
        "priority": 0,
        "separate_reasoning": False,  # no reasoning parser: the content is whole either way
        "stream_reasoning": False,
        "return_hidden_states": False,
    }
    resp = raw.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], **extra})
    assert resp.status_code == 200


@pytest.mark.parametrize(
    "body, param, words",
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]},
            "messages",
            "image_url",
        ),
        ({"messages": [{"role": "user", "content": "x", "colour": 1}]}, "messages", "colour"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages", "role"),
        ({"messages": []}, "messages", "messages"),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "stream": True,
                "stream_options": {"include_usage": True, "x": 1},
            },
            "stream_options",
            "stream_options.x",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}},
            "stream_options",
            "stream",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
            "temperature",
            "temperature",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "n": 0}, "n", "n"),
        ({"messages": [{"role": "user", "content": "x"}], "seed": 2**63}, "seed", "seed"),
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs", "logprobs"),
        (
            {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"tools": []}},
            "chat_template_kwargs",
            "tools",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"add_generation_prompt": False}},
            "chat_template_kwargs",
            "add_generation_prompt",
        ),
        (
            {"messages": [{"role": "assistant", "content": "x"}], "continue_final_message": True,
             "add_generation_prompt": True},
            "continue_final_message",
            "add_generation_prompt",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "continue_final_message": True},
            "continue_final_message",
            "assistant",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "separate_reasoning": "no"}, "separate_reasoning", "bool"),
        ({"messages": [{"role": "user", "content": "x"}], "rid": ["a"]}, "rid", "string"),
    ],
)
def test_invalid_chat_requests_name_the_field(
    raw: TestClient, body: dict, param: Optional[str], words: str
) -> None:
    resp = raw.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400
    error = resp.json()
    assert error["object"] == "error" and error["code"] == 400
    assert error["param"] == param and words in error["message"]


def test_invalid_bodies(raw: TestClient) -> None:
    assert raw.post("/v1/completions", content=b"{not json").status_code == 400
    assert raw.post("/v1/completions", json=[1]).status_code == 400
    resp = raw.post("/v1/completions", json={"prompt": []})
    assert resp.status_code == 400 and resp.json()["param"] == "prompt"
    resp = raw.post("/v1/completions", json={"prompt": "x", "max_tokens": -1})
    assert resp.status_code == 400 and resp.json()["param"] == "max_tokens"


# ----------------------------------------------------------------------------- continue_final_message, rid


def test_continue_final_message_leaves_the_assistant_message_open(
    client: openai.OpenAI, fake: FakeTokenizerManager
) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon"}]
    for extra in ({"continue_final_message": True}, {"continue_final_message": True, "add_generation_prompt": False}):
        client.chat.completions.create(model=MODEL, messages=messages, extra_body=extra)
    # The messages before it with the assistant header, then the text itself: no end of turn. The
    # text is encoded apart from the template's (SGLang's token boundary), so the ids are sent.
    expected = fake.tokenizer.encode("<s><|user|>hi\n<|assistant|>") + fake.tokenizer.encode("Once upon")
    assert [(obj.text, obj.input_ids) for obj in fake.received] == [(None, expected)] * 2


def test_add_generation_prompt_false_omits_the_assistant_header(
    client: openai.OpenAI, fake: FakeTokenizerManager
) -> None:
    chat(client, extra_body={"add_generation_prompt": False})
    chat(client, extra_body={"add_generation_prompt": True})
    assert [obj.text for obj in fake.received] == ["<s><|user|>hi\n", "<s><|user|>hi\n<|assistant|>"]


def test_rid_names_the_engine_request_and_the_response(raw: TestClient, fake: FakeTokenizerManager) -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "rid": "my-request"}
    assert raw.post("/v1/chat/completions", json=body).json()["id"] == "my-request"
    assert raw.post("/v1/chat/completions", json={**body, "n": 2}).json()["id"] == "my-request"
    assert [obj.rid for obj in fake.received] == ["my-request", "my-request_0", "my-request_1"]


# ----------------------------------------------------------------------------- end to end (embedded SmolLM2)

SMOLLM_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
FLOAT32_MIN = -3.4028234663852886e38  # what SGLang reports for a masked token's logprob (sampled rows)


def _post(server: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    import requests

    response = requests.post(server.url + path, json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.e2e
def test_continue_final_message_continues_the_text_end_to_end(smollm_server: Any) -> None:
    messages = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is"},
    ]
    greedy = {"temperature": 0.0, "max_tokens": 8}
    continued = _post(smollm_server, "/v1/chat/completions",
                      {"messages": messages, "continue_final_message": True, "add_generation_prompt": False, **greedy})
    open_prompt = SMOLLM_SYSTEM + "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n" \
        "<|im_start|>assistant\nThe capital of France is"
    expected = _post(smollm_server, "/generate",
                     {"text": open_prompt, "sampling_params": {"temperature": 0.0, "max_new_tokens": 8}})
    assert continued["choices"][0]["message"]["content"] == expected["text"]
    assert continued["usage"]["prompt_tokens"] == expected["meta_info"]["prompt_tokens"]
    # Without the flag the message is closed and a new assistant turn starts: another prompt.
    closed = _post(smollm_server, "/v1/chat/completions", {"messages": messages, **greedy})
    assert closed["usage"]["prompt_tokens"] > continued["usage"]["prompt_tokens"]


def _banned_everywhere_but(kept: list[int], vocab: int = 49152) -> dict[str, Any]:
    from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor

    banned = [t for t in range(vocab) if t not in kept]
    return {"processor": DisallowedTokensLogitsProcessor.to_str(), "params": {"token_ids": banned}}


@pytest.mark.e2e
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_masked_token_logprob_is_float32_min_on_every_route(smollm_server: Any, temperature: float) -> None:
    ban = _banned_everywhere_but([7042, 30])  # " Paris", "."
    params = {"temperature": temperature, "max_new_tokens": 1, "custom_params": ban["params"]}
    out = _post(smollm_server, "/generate", {
        "text": "The capital of France is", "sampling_params": params, "custom_logit_processor": ban["processor"],
        "return_logprob": True, "token_ids_logprob": [7042, 260], "top_logprobs_num": 3,
    })
    meta = out["meta_info"]
    assert out["output_ids"][0] in (7042, 30)
    assert meta["output_token_ids_logprobs"][0][1][:2] == [FLOAT32_MIN, 260]
    assert meta["output_top_logprobs"][0][2][0] == FLOAT32_MIN  # third best: every kept token is above
    chat_body = _post(smollm_server, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Capital of France?"}], "temperature": temperature,
        "max_tokens": 1, "logprobs": True, "top_logprobs": 3,
        "custom_logit_processor": ban["processor"], "custom_params": ban["params"],
    })
    tops = chat_body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert tops[2]["logprob"] == FLOAT32_MIN and tops[0]["logprob"] > FLOAT32_MIN
