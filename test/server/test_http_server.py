"""The HTTP server, tokenizer manager and detokenizer, end to end, against a fake scheduler.

`python -m sglang.launch_server` runs in subprocesses with SGLANG_TEST_SCHEDULER_ENTRY naming
test/fake_scheduler.py, a model-free scheduler that echoes the prompt and logs what it
receives. The four servers start together (each start is mostly seconds of imports).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import time
from typing import Any, Callable

import pytest
import requests

from fake_scheduler import ENTRY, LOG_ENV, build_test_tokenizer
from sglang.srt.entrypoints.launch import SCHEDULER_ENTRY_ENV
from sglang.srt.managers.detokenizer_manager import DetokenizerManager
from sglang.srt.managers.io_struct import BatchTokenOut, TokenOut
from sglang.srt.managers.fan_out import derive_child_seed
from sglang.srt.sampling.custom_logit_processor import DISABLED_MESSAGE
from sglang.test.server_process import ServerProcess, free_port

pytestmark = pytest.mark.e2e

TEST_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # test/, which holds the helper modules
API_KEY = "test-secret"
TIMEOUT = 30


# ---------------------------------------------------------------------------------- helpers


def _wait_until(condition: Callable[[], Any], timeout: float = TIMEOUT, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _records(log_path: str, kind: str) -> list[dict[str, Any]]:
    if not os.path.exists(log_path):
        return []
    out = []
    with open(log_path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line the fake is still writing
                continue
            if record["kind"] == kind:
                out.append(record)
    return out


def _child_pids(pid: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _stat(int(entry)) and int(_stat(int(entry))[1]) == pid:
            children.append(int(entry))
    return children


def _stat(pid: int) -> list[str]:
    """[state, ppid, ...] of a process, [] when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _gone(pid: int) -> bool:
    stat = _stat(pid)
    return not stat or stat[0] in ("Z", "X")


def _sse_events(response: requests.Response) -> list[Any]:
    events = []
    for line in response.iter_lines():
        if line.startswith(b"data: "):
            payload = line[len(b"data: ") :]
            events.append(payload.decode() if payload == b"[DONE]" else json.loads(payload))
    return events


class Server:
    def __init__(self, process: ServerProcess, log_path: str) -> None:
        self.process = process
        self.log_path = log_path

    def post(self, body: Any, **kwargs: Any) -> requests.Response:
        headers = {**self.process.headers(), **kwargs.pop("headers", {})}
        return requests.post(self.process.url + "/generate", json=body, headers=headers, timeout=TIMEOUT, **kwargs)

    def generate(self, body: dict[str, Any]) -> Any:
        response = self.post(body)
        assert response.status_code == 200, response.text
        return response.json()

    def received(self, kind: str = "req") -> list[dict[str, Any]]:
        return _records(self.log_path, kind)

    def request_for(self, rid: str) -> dict[str, Any]:
        return _wait_until(lambda: next((r for r in self.received() if r["rid"] == rid), None), what=rid)


SERVER_FLAGS = {
    "main": ["--detokenizer-mode", "inline"],  # the CPU default, pinned for machines with a GPU
    "keyed": [
        "--detokenizer-mode", "process",
        "--api-key", API_KEY,
        "--enable-custom-logit-processor",
        "--preferred-sampling-params", '{"max_new_tokens": 3, "temperature": 0.5}',
    ],
    "term": ["--tp-size", "2", "--detokenizer-mode", "process"],
    "doomed": [],
}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = str(tmp_path_factory.mktemp("tokenizer"))
    build_test_tokenizer(folder)
    # launch_server checks --tp-size against the model's heads before it starts any rank.
    config = dict(architectures=["LlamaForCausalLM"], vocab_size=400, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return folder


@pytest.fixture(scope="module")
def servers(tokenizer_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Server]:
    logs = tmp_path_factory.mktemp("fake_scheduler_logs")
    started = {}
    for name, flags in SERVER_FLAGS.items():
        port = free_port()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [TEST_DIR, os.environ.get("PYTHONPATH")])),
            SCHEDULER_ENTRY_ENV: ENTRY,
            LOG_ENV: str(logs / f"{name}.jsonl"),
        }
        argv = ["--model-path", tokenizer_dir, "--port", str(port), "--log-level", "warning", *flags]
        process = ServerProcess(argv, port, env=env, api_key=API_KEY if "--api-key" in flags else None)
        started[name] = Server(process, env[LOG_ENV])
    try:
        for server in started.values():
            server.process.wait_healthy(timeout=120)
        yield started
    finally:
        for server in started.values():
            server.process.stop()


@pytest.fixture
def main(servers: dict[str, Server]) -> Server:
    return servers["main"]


@pytest.fixture(params=["main", "keyed"])
def text_server(request: pytest.FixtureRequest, servers: dict[str, Server]) -> Server:
    """Each place token ids become text: in the HTTP process (main, the CPU default
    --detokenizer-mode inline) and in the detokenizer process (keyed)."""
    return servers[request.param]


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: str) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)


# ---------------------------------------------------------------------------------- /generate


def test_generate_single_text(text_server: Server, tokenizer: Any) -> None:
    prompt_ids = tokenizer.encode("Hello world")
    out = text_server.generate({"text": "Hello world", "sampling_params": {"max_new_tokens": 4}, "rid": "single"})
    expected_ids = (prompt_ids * 4)[:4]
    assert out["output_ids"] == expected_ids
    assert out["text"] == tokenizer.decode(expected_ids)
    assert out["meta_info"] == {
        "id": "single",
        "finish_reason": {"type": "length", "length": 4},
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": 4,
        "cached_tokens": 0,
        "num_retractions": 0,
    }


def test_generate_input_ids(main: Server) -> None:
    out = main.generate({"input_ids": [10, 11, 12], "sampling_params": {"max_new_tokens": 2}})
    assert out["output_ids"] == [10, 11]
    assert out["meta_info"]["prompt_tokens"] == 3


def test_generate_batch(main: Server, tokenizer: Any) -> None:
    out = main.generate(
        {
            "text": ["Hello world", "The quick brown fox"],
            "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 3}],
            "rid": "batch",
        }
    )
    assert [o["meta_info"]["id"] for o in out] == ["batch_0", "batch_1"]
    assert [o["meta_info"]["completion_tokens"] for o in out] == [1, 3]
    assert out[1]["output_ids"] == tokenizer.encode("The quick brown fox")[:3]


def test_streaming_is_cumulative_then_done(text_server: Server) -> None:
    body = {
        "input_ids": [10, 11, 12, 13, 14],
        "sampling_params": {"max_new_tokens": 5, "custom_params": {"fake_delay": 0.05}},
        "stream": True,
    }
    response = text_server.post(body, stream=True)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = _sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) >= 2, "a 5-step request streamed as a single chunk"
    for before, after in zip(chunks, chunks[1:]):
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
        assert after["text"].startswith(before["text"])
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["output_ids"] == [10, 11, 12, 13, 14]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}


def test_streamed_batch_and_n_carry_indices(main: Server) -> None:
    body = {
        "input_ids": [[10, 11], [12, 13]],
        "sampling_params": [{"max_new_tokens": 2}, {"max_new_tokens": 2, "n": 2}],
        "stream": True,
    }
    events = _sse_events(main.post(body, stream=True))
    assert events[-1] == "[DONE]"
    finals = {c["index"]: c for c in events[:-1] if c["meta_info"]["finish_reason"] is not None}
    assert sorted(finals) == [0, 1, 2]
    assert [finals[i]["output_ids"] for i in range(3)] == [[10, 11], [12, 13], [12, 13]]


def test_logprob_triples(main: Server, tokenizer: Any) -> None:
    out = main.generate(
        {
            "input_ids": [10, 11, 12],
            "sampling_params": {"max_new_tokens": 2},
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": 2,
            "token_ids_logprob": [5, 7],
            "return_text_in_logprobs": True,
        }
    )
    meta = out["meta_info"]
    text = lambda t: tokenizer.decode([t])  # noqa: E731
    assert meta["input_token_logprobs"] == [[None, 10, text(10)], [-0.25, 11, text(11)], [-0.25, 12, text(12)]]
    assert meta["output_token_logprobs"] == [[-0.5, 10, text(10)], [-0.5, 11, text(11)]]
    assert meta["input_top_logprobs"][0] is None
    assert meta["input_top_logprobs"][1] == [[0.0, 11, text(11)], [-0.1, 12, text(12)]]
    assert meta["output_top_logprobs"] == [
        [[0.0, 10, text(10)], [-0.1, 11, text(11)]],
        [[0.0, 11, text(11)], [-0.1, 12, text(12)]],
    ]
    assert meta["input_token_ids_logprobs"][0] is None
    assert meta["output_token_ids_logprobs"] == [[[-1.0, 5, text(5)], [-1.0, 7, text(7)]]] * 2


def test_logprobs_without_text_and_only_what_was_asked(main: Server) -> None:
    body = {"input_ids": [10, 11], "sampling_params": {"max_new_tokens": 1}, "return_logprob": True}
    meta = main.generate(body)["meta_info"]
    assert meta["input_token_logprobs"] == []  # logprob_start_len -1: output logprobs only
    assert meta["output_token_logprobs"] == [[-0.5, 10, None]]
    assert not {"input_top_logprobs", "output_top_logprobs", "output_token_ids_logprobs"} & meta.keys()


def test_non_finite_logprob_is_null(main: Server) -> None:
    params = {"max_new_tokens": 1, "custom_params": {"fake_nan": True}}
    body = {"input_ids": [10], "sampling_params": params, "return_logprob": True}
    response = main.post(body)
    assert b"NaN" not in response.content
    assert response.json()["meta_info"]["output_token_logprobs"] == [[None, 10, None]]


def test_stop_string_is_trimmed(text_server: Server, tokenizer: Any) -> None:
    body = {"text": "Hello world. The quick brown fox", "sampling_params": {"stop": ["quick"], "max_new_tokens": 20}}
    out = text_server.generate(body)
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "quick"}
    assert out["text"] == "Hello world. The "
    body["sampling_params"]["no_stop_trim"] = True
    assert text_server.generate(body)["text"].endswith("The quick")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_spanning_tokens_is_trimmed_exactly(text_server: Server, stream: bool) -> None:
    body = {
        "text": "Hello world. The quick",
        "sampling_params": {"stop": ["lo wor"], "max_new_tokens": 20, "custom_params": {"fake_delay": 0.05}},
        "stream": stream,
    }
    response = text_server.post(body, stream=stream)
    chunks = _sse_events(response)[:-1] if stream else [response.json()]
    assert len(chunks) >= (2 if stream else 1)
    assert chunks[-1]["text"] == "Hel"
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": "lo wor"}
    # "Hello" was streamed before " world" completed the stop string: its "lo" was held back.
    assert all("Hel".startswith(c["text"]) for c in chunks)


def test_stop_token_kept_in_ids_not_in_text(text_server: Server, tokenizer: Any) -> None:
    out = text_server.generate({"input_ids": [20, 21, 22], "sampling_params": {"stop_token_ids": [21], "max_new_tokens": 9}})
    assert out["output_ids"] == [20, 21]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": 21}
    assert out["text"] == tokenizer.decode([20])


def test_streamed_text_never_splits_a_character(text_server: Server, tokenizer: Any) -> None:
    # The test tokenizer spells these characters as several single-byte tokens.
    prompt = "Robots 🤖 paint héllo wörld ✨"
    ids = tokenizer.encode(prompt)
    assert len(ids) > len(prompt.split()) + 4, "the characters are not split across tokens"
    params = {"max_new_tokens": len(ids), "custom_params": {"fake_delay": 0.02}}
    chunks = _sse_events(text_server.post({"input_ids": ids, "sampling_params": params, "stream": True}, stream=True))[:-1]
    assert len(chunks) >= 2
    assert all("\ufffd" not in c["text"] for c in chunks)
    assert chunks[-1]["text"] == prompt


def test_abort_finish_reason_passes_through(main: Server) -> None:
    out = main.generate({"input_ids": [10], "sampling_params": {"custom_params": {"fake_abort": "processor failed"}}})
    assert out["meta_info"]["finish_reason"] == {
        "type": "abort", "message": "processor failed", "status_code": 500, "err_type": "InternalServerError"
    }


def test_n_children_get_distinct_derived_seeds(main: Server) -> None:
    seeds = []
    for rid in ("seeded_a", "seeded_b"):
        params = {"n": 3, "sampling_seed": 1234, "max_new_tokens": 1}
        out = main.generate({"input_ids": [10, 11], "sampling_params": params, "rid": rid})
        assert [o["meta_info"]["id"] for o in out] == [f"{rid}_{i}" for i in range(3)]
        received = [main.request_for(f"{rid}_{i}")["sampling_params"] for i in range(3)]
        assert all(p["n"] == 1 for p in received)
        seeds.append([p["sampling_seed"] for p in received])
        assert [o["meta_info"]["sampling_seed"] for o in out] == seeds[-1]
    assert seeds[0] == seeds[1] == [derive_child_seed(1234, i) for i in range(3)]
    assert len(set(seeds[0])) == 3 and 1234 not in seeds[0]


def test_n_children_without_seed_stay_unseeded(main: Server) -> None:
    main.generate({"input_ids": [10], "sampling_params": {"n": 2, "max_new_tokens": 1}, "rid": "unseeded"})
    assert [main.request_for(f"unseeded_{i}")["sampling_params"]["sampling_seed"] for i in range(2)] == [None, None]


def test_client_disconnect_aborts_the_request(main: Server) -> None:
    body = {
        "input_ids": [10, 11],
        "sampling_params": {"max_new_tokens": 2000, "custom_params": {"fake_delay": 0.02}},
        "stream": True,
        "rid": "walks_away",
    }
    response = main.post(body, stream=True)
    next(line for line in response.iter_lines() if line.startswith(b"data: "))
    response.close()
    _wait_until(lambda: any(r["rid"] == "walks_away" for r in main.received("abort")), what="AbortReq")


def test_model_and_server_info(main: Server, tokenizer_dir: str) -> None:
    url = main.process.url
    info = requests.get(url + "/get_model_info", timeout=TIMEOUT).json()
    assert info == {
        "model_path": tokenizer_dir,
        "tokenizer_path": tokenizer_dir,
        "is_generation": True,
        "preferred_sampling_params": None,
    }
    server_info = requests.get(url + "/get_server_info", timeout=TIMEOUT).json()
    assert server_info["tp_size"] == 1
    assert server_info["scheduler_info"]["context_len"] == 4096
    # The fields SGLang's tools read at the top level, and the newer route names.
    assert server_info["max_total_num_tokens"] == server_info["scheduler_info"]["max_total_num_tokens"]
    assert isinstance(server_info["version"], str) and server_info["max_running_requests"] >= 1
    assert requests.get(url + "/server_info", timeout=TIMEOUT).json()["tp_size"] == 1
    assert requests.get(url + "/model_info", timeout=TIMEOUT).json() == info
    assert requests.get(url + "/health_generate", timeout=TIMEOUT).status_code == 200


@pytest.mark.parametrize("route", ["/tokenize", "/v1/tokenize"])
def test_tokenize(main: Server, tokenizer: Any, route: str) -> None:
    url = main.process.url + route
    one = requests.post(url, json={"prompt": "Hello world"}, timeout=TIMEOUT).json()
    want = tokenizer.encode("Hello world")
    assert one == {"tokens": want, "count": len(want), "max_model_len": 4096}
    many = requests.post(url, json={"prompt": ["Hello", "world"], "add_special_tokens": False, "model": "x"}, timeout=TIMEOUT)
    bare = [tokenizer.encode(t, add_special_tokens=False) for t in ("Hello", "world")]
    assert many.json() == {"tokens": bare, "count": [len(b) for b in bare], "max_model_len": 4096}


@pytest.mark.parametrize("route", ["/detokenize", "/v1/detokenize"])
def test_detokenize(main: Server, tokenizer: Any, route: str) -> None:
    url = main.process.url + route
    ids = tokenizer.encode("Hello world")
    assert requests.post(url, json={"tokens": ids}, timeout=TIMEOUT).json() == {"text": tokenizer.decode(ids, skip_special_tokens=True)}
    both = requests.post(url, json={"tokens": [ids, ids[:1]], "skip_special_tokens": False}, timeout=TIMEOUT).json()
    assert both == {"text": [tokenizer.decode(ids), tokenizer.decode(ids[:1])]}


@pytest.mark.parametrize(
    "route,body,names",
    [
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {}, "prompt is required"),
        ("/tokenize", {"prompt": "a", "add_special": True}, "add_special"),
        ("/tokenize", {"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
        ("/detokenize", {"tokens": [1, 10**6]}, "tokens must be in [0, "),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
        ("/detokenize", {"tokens": [[1], [-1]]}, "got -1"),
    ],
)
def test_tokenize_bad_input_is_a_400_naming_it(main: Server, route: str, body: dict, names: str) -> None:
    response = requests.post(main.process.url + route, json=body, timeout=TIMEOUT)
    assert response.status_code == 400 and names in response.json()["error"]["message"]


# ---------------------------------------------------------------------------------- errors


INVALID = [
    ({"text": "hi", "sampling_params": {"bogus_knob": 1}}, "bogus_knob"),
    ({"text": "hi", "sampling_params": {"temperature": -1}}, "temperature"),
    ({"text": "hi", "sampling_params": {"n": 0}}, "n must be at least 1"),
    ({"text": "hi", "sampling_params": {"sampling_seed": 2**63}}, "sampling_seed"),
    ({"text": "hi", "return_logprob": True, "top_logprobs_num": 21}, "top_logprobs_num"),
    ({"text": "hi", "return_logprob": True, "token_ids_logprob": [[1]]},
     "token_ids_logprob must be a flat list of integers."),
    ({"text": "hi", "return_logprob": True, "token_ids_logprob": [100000]},
     "token_ids_logprob contains out-of-vocabulary token id 100000; valid range is [0, "),
    ({"text": "hi", "return_logprob": True, "logprob_start_len": 99}, "logprob_start_len"),
    ({"text": "hi", "return_logprob": True, "logprob_start_len": -2}, "logprob_start_len"),
    ({"text": "hi", "return_logprob": "yes"}, "return_logprob"),
    ({"text": "hi", "sampling_params": {"max_new_tokens": 5000}}, "context length"),
    ({"text": ""}, "empty"),
    ({"input_ids": []}, "empty"),
    ({"input_ids": [1, 999999]}, "input_ids contains out-of-vocabulary token id 999999"),
    ({"input_ids": [1, 999999]}, "Token ID 999999 is out of vocabulary"),  # SGLang's phrase
    ({}, "Exactly one of text or input_ids"),
    ({"text": "hi", "no_such_field": 1, "other_field": "x"},
     "Unknown or unsupported field(s) no_such_field, other_field in /generate"),
    # A field sglang-router writes into every request is accepted at its no-op value only.
    ({"text": "hi", "return_hidden_states": True}, "return_hidden_states=True is not supported by this server"),
    ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params has 1 entries"),
    ({"text": "hi", "custom_logit_processor": '{"name": "DisallowedTokensLogitsProcessor"}'}, DISABLED_MESSAGE),
]


@pytest.mark.parametrize("body, message", INVALID, ids=[m[:40] for _, m in INVALID])
def test_invalid_request_is_400_naming_the_parameter(main: Server, body: dict[str, Any], message: str) -> None:
    response = main.post(body)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]


def test_flush_cache_only_when_idle(main: Server) -> None:
    url = main.process.url + "/flush_cache"
    assert requests.post(url, timeout=TIMEOUT).text == "Cache flushed.\n"
    slow = {"max_new_tokens": 2000, "ignore_eos": True, "custom_params": {"fake_delay": 0.02}}
    with main.post({"input_ids": [10, 11], "stream": True, "sampling_params": slow}, stream=True) as running:
        lines = running.iter_lines()  # held: a dropped iterator closes the stream, which aborts the request
        next(line for line in lines if line.startswith(b"data: "))  # in flight
        busy = requests.get(url, timeout=TIMEOUT)
    assert busy.status_code == 400 and "requests are running" in busy.text


def test_null_unknown_field_is_the_same_as_absent(main: Server) -> None:
    assert main.generate({"input_ids": [10, 11], "lora_path": None, "sampling_params": {"max_new_tokens": 1}})["output_ids"] == [10]


def test_invalid_json_body_is_400(main: Server) -> None:
    response = requests.post(main.process.url + "/generate", data=b"{not json", timeout=TIMEOUT)
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]["message"]


@pytest.mark.parametrize("body", [
    {"text": "hi", "stream": True, "sampling_params": {"top_p": 2}},
    {"text": "hi", "stream": True, "return_routed_experts": True},
    {"text": ["a", "b"], "stream": True, "sampling_params": [{"top_p": 2}, {}]},
])
def test_streaming_validation_error_is_a_400_before_the_stream(main: Server, body: dict[str, Any]) -> None:
    response = main.post(body, stream=True)
    assert response.status_code == 400 and response.headers["content-type"].startswith("application/json")
    assert "error" in response.json()


def test_streaming_duplicate_rid_is_a_400_before_the_stream(main: Server) -> None:
    slow = {"max_new_tokens": 2000, "ignore_eos": True, "custom_params": {"fake_delay": 0.02}}
    with main.post({"input_ids": [10, 11], "rid": "dup-rid", "stream": True, "sampling_params": slow}, stream=True) as running:
        lines = running.iter_lines()
        next(line for line in lines if line.startswith(b"data: "))  # in flight
        again = main.post({"input_ids": [10, 11], "rid": "dup-rid", "stream": True}, stream=True)
        assert again.status_code == 400 and "Duplicate request ID" in again.json()["error"]["message"]


# SGLang 0.5.23's GenerateReqInput fields this server does not implement: accepted at the value that
# asks for nothing (what bench_serving and sglang-router send), a 400 naming the field otherwise.
SGLANG_DEFAULTS = {
    "lora_path": None, "lora_id": None, "return_routed_experts": False, "routed_experts_start_len": 0,
    "return_hidden_states": False, "return_bytes": False, "return_entropy": False, "log_metrics": True,
    "no_logs": False, "background": False, "session_params": None, "image_data": None, "priority": 0,
    "modalities": [], "bootstrap_room": None, "return_prompt_token_ids": False, "require_reasoning": False,
    "routing_key": "k", "conversation_id": "c", "custom_labels": {"a": "b"}, "received_time": 1.5,
    "external_trace_header": {"traceparent": "x"}, "return_flat_raw_top_logprobs": False,
}


def test_error_responses_carry_meta_info(main: Server) -> None:
    response = main.post({"input_ids": [1, 999999], "rid": "bad-one"})
    assert response.status_code == 400
    meta = response.json()["meta_info"]
    assert meta["id"] == "bad-one" and meta["finish_reason"]["type"] == "abort"
    assert "Token ID 999999 is out of vocabulary" in meta["finish_reason"]["message"]
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (0, 0)


def test_models_lists_the_model_path_as_given(main: Server, tokenizer_dir: str) -> None:
    models = requests.get(main.process.url + "/v1/models", timeout=TIMEOUT).json()["data"]
    assert [m["id"] for m in models] == [tokenizer_dir]


def test_sglang_fields_at_their_default_are_accepted(main: Server) -> None:
    body = {"input_ids": [10, 11], "sampling_params": {"max_new_tokens": 1}, **SGLANG_DEFAULTS}
    assert main.generate(body)["output_ids"] == [10]
    batch = {"input_ids": [[10, 11], [12]], "sampling_params": {"max_new_tokens": 1}, "lora_path": [None, None]}
    assert [out["output_ids"] for out in main.generate(batch)] == [[10], [12]]


@pytest.mark.parametrize("field,value", [
    ("lora_path", "my-adapter"), ("return_routed_experts", True), ("image_data", "http://x/y.png"),
    ("return_hidden_states", True), ("session_params", {"id": "s"}), ("return_bytes", True), ("routed_dp_rank", 1),
])
def test_sglang_fields_asking_for_more_are_a_400_naming_them(main: Server, field: str, value: Any) -> None:
    response = main.post({"input_ids": [10, 11], field: value})
    assert response.status_code == 400 and f"{field}=" in response.json()["error"]["message"]


def test_cache_salt_namespaces_the_prefix_cache_as_extra_key(main: Server) -> None:
    out = main.generate({"input_ids": [10, 11], "cache_salt": "s1", "sampling_params": {"max_new_tokens": 1}})
    assert out["output_ids"] == [10]
    assert main.post({"input_ids": [10, 11], "cache_salt": 5}).status_code == 400


class _WritesAFileWhenUnpickled:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


def test_custom_processor_payload_is_never_deserialised_when_disabled(main: Server, tmp_path: Any) -> None:
    marker = tmp_path / "pwned"
    payload = json.dumps({"callable": pickle.dumps(_WritesAFileWhenUnpickled(str(marker))).hex()})
    response = main.post({"text": "hi", "custom_logit_processor": payload, "rid": "evil"})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == DISABLED_MESSAGE
    assert not marker.exists()
    assert not any(r["rid"] == "evil" for r in main.received())


# ---------------------------------------------------------------------------------- flags


def test_api_key_guards_every_route(servers: dict[str, Server]) -> None:
    keyed = servers["keyed"]
    url = keyed.process.url
    good = {"Authorization": f"Bearer {API_KEY}"}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        assert requests.get(url + "/health", headers=headers, timeout=TIMEOUT).status_code == 401
        assert requests.get(url + "/get_model_info", headers=headers, timeout=TIMEOUT).status_code == 401
        response = requests.post(url + "/generate", json={"text": "hi"}, headers=headers, timeout=TIMEOUT)
        assert response.status_code == 401 and "error" in response.json()
    assert requests.get(url + "/health", headers=good, timeout=TIMEOUT).status_code == 200
    assert requests.post(url + "/generate", json={"text": "hi"}, headers=good, timeout=TIMEOUT).status_code == 200
    assert requests.get(url + "/get_server_info", headers=good, timeout=TIMEOUT).json()["api_key"] != API_KEY


def test_preferred_sampling_params_merge_under_the_request(servers: dict[str, Server]) -> None:
    keyed = servers["keyed"]
    assert keyed.generate({"input_ids": [10], "rid": "pref_default"})["meta_info"]["completion_tokens"] == 3
    keyed.generate({"input_ids": [10], "rid": "pref_override", "sampling_params": {"max_new_tokens": 1}})
    assert keyed.request_for("pref_default")["sampling_params"]["temperature"] == 0.5
    assert keyed.request_for("pref_override")["sampling_params"]["max_new_tokens"] == 1


def test_custom_processor_when_enabled(servers: dict[str, Server]) -> None:
    keyed = servers["keyed"]
    named = '{"name": "DisallowedTokensLogitsProcessor"}'
    keyed.generate({"input_ids": [10], "custom_logit_processor": named, "rid": "with_processor"})
    assert keyed.request_for("with_processor")["custom_logit_processor"] == named
    response = keyed.post({"input_ids": [10], "custom_logit_processor": '{"name": "NoSuchProcessor"}'})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("custom_logit_processor:")


# ---------------------------------------------------------------------------------- lifecycle


def test_sigterm_stops_every_child(servers: dict[str, Server]) -> None:
    server = servers["term"]
    proc = server.process.proc
    children = _child_pids(proc.pid)
    assert len(children) >= 3, "two scheduler ranks and the detokenizer"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(TIMEOUT) == 0
    _wait_until(lambda: all(_gone(pid) for pid in children), what="the children to exit")


def test_killed_scheduler_makes_the_server_exit_nonzero(servers: dict[str, Server]) -> None:
    server = servers["doomed"]
    (rank0,) = [r["pid"] for r in server.received("start") if r["rank"] == 0]
    params = {"max_new_tokens": 2000, "custom_params": {"fake_delay": 0.02}}
    body = {"input_ids": [10], "sampling_params": params, "stream": True}
    lines = server.post(body, stream=True).iter_lines()
    next(line for line in lines if line.startswith(b"data: "))
    os.kill(rank0, signal.SIGKILL)
    last = [json.loads(line[6:]) for line in lines if line.startswith(b"data: {")][-1]
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert "scheduler rank 0 exited with code -9" in last["meta_info"]["finish_reason"]["message"]
    code = server.process.proc.wait(TIMEOUT)
    server.process.stop()  # collects the output
    assert code != 0, server.process.output
    assert "scheduler rank 0 exited with code -9" in server.process.output


# ---------------------------------------------------------------------------------- units


def _token_out(rid: str, ids: list[int], finished: Any = None, **kw: Any) -> TokenOut:
    return TokenOut(
        rid=rid, new_output_ids=ids, finished_reason=finished, prompt_tokens=1, completion_tokens=len(ids), **kw
    )


def _detokenize(manager: DetokenizerManager, outs: list[TokenOut]) -> list[str]:
    return [manager.handle(BatchTokenOut(outs=[o])).outs[0].new_text for o in outs]


def test_detokenizer_holds_back_split_characters(tokenizer: Any) -> None:
    ids = tokenizer.encode("ok 🎉 é!")
    manager = DetokenizerManager(tokenizer)
    steps = [_token_out("r", [t]) for t in ids[:-1]] + [_token_out("r", ids[-1:], {"type": "length", "length": 9})]
    pieces = _detokenize(manager, steps)
    assert "".join(pieces) == "ok 🎉 é!"
    assert all("\ufffd" not in p for p in pieces)
    assert manager._states == {}  # dropped on finish


def test_detokenizer_trims_at_the_last_matched_text(tokenizer: Any) -> None:
    ids = tokenizer.encode("The fox. The fox. The end")
    manager = DetokenizerManager(tokenizer)
    first = _token_out("r", ids[:3])
    last = _token_out("r", ids[3:], {"type": "stop", "matched": "The"}, matched_text="The")
    assert "".join(_detokenize(manager, [first, last])) == "The fox. The fox. "
    no_trim = _token_out("s", ids, {"type": "stop", "matched": "The"}, matched_text="The", no_stop_trim=True)
    assert _detokenize(manager, [no_trim]) == ["The fox. The fox. The end"]


def test_detokenizer_holds_back_a_possible_stop_start_while_streaming(tokenizer: Any) -> None:
    ids = tokenizer.encode("The fox. The end")
    manager = DetokenizerManager(tokenizer)
    steps = [_token_out("r", [t], stop_strs=["The end"] if i == 0 else None) for i, t in enumerate(ids[:-1])]
    steps.append(_token_out("r", ids[-1:], {"type": "stop", "matched": "The end"}, matched_text="The end"))
    pieces = _detokenize(manager, steps)
    assert "".join(pieces) == "The fox. "
    assert "".join(pieces[:-1]) == "The fox. "  # "The en" was held back: no chunk showed what the trim removes
    length = [_token_out("s", [t], stop_strs=["The end"] if i == 0 else None) for i, t in enumerate(ids[:-2])]
    length.append(_token_out("s", ids[-2:-1], {"type": "length", "length": len(ids) - 1}))
    assert "".join(_detokenize(manager, length)) == tokenizer.decode(ids[:-1])  # the held tail comes on finish


def test_detokenizer_replaces_sent_text_that_the_trim_cuts(tokenizer: Any) -> None:
    ids = tokenizer.encode("The fox. The end")
    manager = DetokenizerManager(tokenizer)
    sent = _detokenize(manager, [_token_out("r", ids[:-1])])  # a stop_regex match is not held back
    final = manager.handle(BatchTokenOut(outs=[
        _token_out("r", ids[-1:], {"type": "stop", "matched": "f.x"}, matched_text="fox. The end")
    ])).outs[0]
    assert sent == [tokenizer.decode(ids[:-1])] and (final.new_text, final.text) == ("", "The ")


def test_detokenizer_special_tokens(tokenizer: Any) -> None:
    ids = [1] + tokenizer.encode("Hello") + [2]
    manager = DetokenizerManager(tokenizer)
    finished = {"type": "length", "length": 3}
    assert _detokenize(manager, [_token_out("a", ids, finished)]) == ["Hello"]
    shown = _token_out("b", ids, finished, skip_special_tokens=False)
    assert _detokenize(manager, [shown]) == ["<|im_start|> Hello <|im_end|>"]
    glued = _token_out("c", ids, finished, skip_special_tokens=False, spaces_between_special_tokens=False)
    assert _detokenize(manager, [glued]) == ["<|im_start|>Hello<|im_end|>"]
    eos = _token_out("d", ids, {"type": "stop", "matched": 2}, skip_special_tokens=False)
    assert _detokenize(manager, [eos]) == ["<|im_start|> Hello"]


def test_derived_seeds_are_signed_64_bit_and_distinct() -> None:
    for seed in (0, -1, 2**63 - 1, -(2**63), 42):
        children = [derive_child_seed(seed, i) for i in range(64)]
        assert len(set(children)) == 64
        assert all(-(2**63) <= s < 2**63 for s in children)
    assert derive_child_seed(7, 3) == derive_child_seed(7, 3)
