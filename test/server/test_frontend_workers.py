"""--tokenizer-worker-num and --detokenizer-worker-num on the real server (a tiny random Qwen3 with
SmolLM2's vocabulary), against the one-worker server's outputs.

"workers": two HTTP workers, results straight from the scheduler (--detokenizer-mode inline).
"process": two HTTP workers, two detokenizer processes and --dp-size 2 (every replica sends to the
detokenizers and they to the workers), with --enable-metrics. Many concurrent requests, streamed
and not, mixed with aborts, each get their own output, equal to the reference server's; both
workers serve; an abort, abort_all and /flush_cache reach the requests other workers hold;
/metrics sums the workers; SIGTERM drains and stops every process. The routing is also tested
without processes.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from engine_utils import generate_ok, iter_stream
from flag_helpers import wait_until
from scaling_utils import PROMPTS, model_flags, save_tiny_full_vocab
from sglang.srt.managers.io_struct import BatchTokenOut, TokenOut, decoder
from sglang.srt.managers.results_router import ResultsRouter, detokenizer_of, worker_endpoints
from sglang.srt.server_args import PortArgs, ServerArgs, prepare_server_args
from sglang.test.server_process import ServerProcess, free_port

TIMEOUT = 300
LONG = {"temperature": 0.0, "max_new_tokens": 1000, "ignore_eos": True}
SERVERS = {
    "reference": [],
    "workers": ["--tokenizer-worker-num", "2", "--log-requests"],
    "process": ["--tokenizer-worker-num", "2", "--detokenizer-mode", "process", "--detokenizer-worker-num", "2",
                "--dp-size", "2", "--enable-metrics"],
}
WORKER_SERVERS = ["workers", "process"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory, gguf_path: str) -> Iterator[dict[str, ServerProcess]]:
    tiny = str(tmp_path_factory.mktemp("tiny_full_vocab"))
    save_tiny_full_vocab(tiny)
    started: dict[str, ServerProcess] = {}
    try:
        for name, flags in SERVERS.items():
            port = free_port()
            flags = [*model_flags(tiny, gguf_path), *flags, "--max-running-requests", "64"]
            started[name] = ServerProcess(["--port", str(port), *flags], port, startup_timeout=600)
        for server in started.values():
            server.wait_healthy()
        yield started
    finally:
        for server in started.values():
            server.stop()


def _requests() -> list[tuple[str, dict]]:
    """Distinct greedy and seeded requests: a result routed to the wrong request shows."""
    greedy = [(f"{p} {i}", {"temperature": 0.0, "max_new_tokens": 8 + i}) for i, p in enumerate(PROMPTS * 3)]
    seeded = [(p, {"temperature": 1.0, "sampling_seed": 11 + i, "max_new_tokens": 6}) for i, p in enumerate(PROMPTS)]
    return greedy + seeded


@pytest.fixture(scope="module")
def expected(servers) -> list[list[int]]:
    reference = servers["reference"]
    return [generate_ok(reference, prompt, sampling_params=params)["output_ids"] for prompt, params in _requests()]


def _streamed_ids(server: ServerProcess, prompt: str, params: dict, rid: str) -> tuple[list[int], str]:
    chunks = list(iter_stream(server, {"text": prompt, "sampling_params": params, "rid": rid}))
    assert all(chunk["meta_info"]["id"] == rid for chunk in chunks)
    return chunks[-1]["output_ids"], chunks[-1]["meta_info"]["finish_reason"]["type"]


def _disconnect_after_first_chunk(server: ServerProcess, prompt: str) -> None:
    for _ in iter_stream(server, {"text": prompt, "sampling_params": LONG}):
        return


def _abort_by_rid(server: ServerProcess, prompt: str, rid: str) -> dict:
    """A long streamed request, aborted through /abort_request on fresh connections (either
    worker may take them) once it streams; its last chunk."""
    last = None
    for chunk in iter_stream(server, {"text": prompt, "sampling_params": LONG, "rid": rid}):
        if last is None:
            requests.post(server.url + "/abort_request", json={"rid": rid}, timeout=TIMEOUT)
            requests.post(server.url + "/abort_request", json={"rid": rid}, timeout=TIMEOUT)
        last = chunk
    return last


@pytest.mark.e2e
@pytest.mark.parametrize("name", WORKER_SERVERS)
def test_concurrent_requests_with_aborts_get_the_single_worker_outputs(servers, expected, name) -> None:
    server = servers[name]
    reqs = _requests()
    with concurrent.futures.ThreadPoolExecutor(48) as pool:
        plain = [pool.submit(generate_ok, server, p, sampling_params=s, rid=f"{name}-plain-{i}") for i, (p, s) in enumerate(reqs)]
        streamed = [pool.submit(_streamed_ids, server, p, s, f"{name}-stream-{i}") for i, (p, s) in enumerate(reqs)]
        dropped = [pool.submit(_disconnect_after_first_chunk, server, p) for p in PROMPTS]
        aborted = [pool.submit(_abort_by_rid, server, p, f"{name}-abort-{i}") for i, p in enumerate(PROMPTS)]
        for i, future in enumerate(plain):
            result = future.result()
            assert result["meta_info"]["id"] == f"{name}-plain-{i}"
            assert result["output_ids"] == expected[i]
        for i, future in enumerate(streamed):
            assert future.result() == (expected[i], "length")
        for future in dropped:
            future.result()
        for future in aborted:
            assert future.result()["meta_info"]["finish_reason"]["type"] == "abort"
    _wait_idle(server)  # the dropped streams' requests were aborted too: none runs on


def _wait_idle(server: ServerProcess, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        loads = requests.get(server.url + "/get_load", timeout=TIMEOUT).json()
        if sum(load["num_reqs"] for load in loads) == 0:
            return
        time.sleep(0.2)
    pytest.fail(f"requests still running {seconds:.0f} s after their clients left: {loads}")


@pytest.mark.e2e
def test_both_workers_serve_and_each_logs_only_its_own_requests(servers) -> None:
    server = servers["workers"]
    rids = [f"spread-{i}" for i in range(24)]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        list(pool.map(lambda rid: generate_ok(server, PROMPTS[0], sampling_params={"max_new_tokens": 1}, rid=rid), rids))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(f"rid='{rid}'" in server.output for rid in rids):
        time.sleep(0.1)
    owner: dict[str, set[str]] = {}
    for worker, rid in re.findall(r"\[http worker (\d)\].*Receive: obj=.*?rid='(spread-\d+)'", server.output):
        owner.setdefault(rid, set()).add(worker)
    assert set(owner) == set(rids)
    assert all(len(workers) == 1 for workers in owner.values())  # one worker received each
    assert {w for workers in owner.values() for w in workers} == {"0", "1"}


@pytest.mark.e2e
@pytest.mark.parametrize("name", WORKER_SERVERS)
def test_n_children_and_openai_routes_match(servers, name) -> None:
    server, reference = servers[name], servers["reference"]
    body = {"text": PROMPTS[1], "sampling_params": {"temperature": 1.0, "sampling_seed": 5, "max_new_tokens": 6, "n": 3}}
    ours = requests.post(server.url + "/generate", json=body, timeout=TIMEOUT).json()
    theirs = requests.post(reference.url + "/generate", json=body, timeout=TIMEOUT).json()
    assert [o["output_ids"] for o in ours] == [o["output_ids"] for o in theirs]
    chat = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0}
    for path, payload in [("/v1/completions", {"model": "x", "prompt": PROMPTS[2], "max_tokens": 6, "temperature": 0}),
                          ("/v1/chat/completions", chat)]:
        answers = [requests.post(s.url + path, json=payload, timeout=TIMEOUT).json()["choices"] for s in (server, reference)]
        assert answers[0] == answers[1]


def _long_streams(server: ServerProcess, count: int) -> tuple[list[threading.Thread], list[dict], threading.Barrier]:
    """`count` long streamed requests in threads; each appends its last chunk; the barrier opens
    once every one has streamed a chunk."""
    lasts: list[dict] = []
    started = threading.Barrier(count + 1)

    def run(i: int) -> None:
        last = None
        for chunk in iter_stream(server, {"text": PROMPTS[i % len(PROMPTS)], "sampling_params": LONG}):
            if last is None:
                started.wait()
            last = chunk
        lasts.append(last)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads, lasts, started


@pytest.mark.e2e
@pytest.mark.parametrize("name", WORKER_SERVERS)
def test_abort_all_and_flush_cache_are_server_wide(servers, name) -> None:
    server = servers[name]
    threads, lasts, started = _long_streams(server, 6)
    started.wait(TIMEOUT)
    for _ in range(4):  # whichever worker answers, the others' requests count
        flushed = requests.post(server.url + "/flush_cache", timeout=TIMEOUT)
        assert flushed.status_code == 400, flushed.text
    assert requests.post(server.url + "/abort_request", json={"abort_all": True}, timeout=TIMEOUT).status_code == 200
    for thread in threads:
        thread.join(TIMEOUT)
    assert [last["meta_info"]["finish_reason"]["type"] for last in lasts] == ["abort"] * 6
    assert all(len(last["output_ids"]) < LONG["max_new_tokens"] for last in lasts)
    # The clients hear of the abort from their tokenizer workers; the scheduler releases the
    # requests at its next step, after which a flush goes through.
    flush_ok = lambda: requests.post(server.url + "/flush_cache", timeout=TIMEOUT).status_code == 200  # noqa: E731
    wait_until(flush_ok, TIMEOUT, "a flush once the aborted requests are released")


def _metric(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M))


@pytest.mark.e2e
def test_metrics_sum_every_worker(servers) -> None:
    server = servers["process"]
    before = _metric(requests.get(server.url + "/metrics", timeout=TIMEOUT).text, "sglang:num_requests_total")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: generate_ok(server, PROMPTS[i % 4], sampling_params={"max_new_tokens": 2}), range(16)))
    for _ in range(4):  # fresh connections: either worker answers with the same sum
        text = requests.get(server.url + "/metrics", timeout=TIMEOUT).text
        assert _metric(text, "sglang:num_requests_total") - before >= 16
        assert _metric(text, "sglang:max_total_num_tokens") > 0
    info = requests.get(server.url + "/get_server_info", timeout=TIMEOUT).json()
    assert info["tokenizer_worker_num"] == 2 and len(info["replica_loads"]) == 2


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


@pytest.mark.e2e
@pytest.mark.parametrize("name", WORKER_SERVERS)
def test_sigterm_stops_every_process_with_exit_code_0(servers, name) -> None:
    server = servers[name]
    processes = _descendants(server.proc.pid)
    assert len(processes) >= 4  # schedulers, workers (and detokenizers, controller)
    assert server.stop() == 0
    deadline = time.monotonic() + 15  # multiprocessing's resource tracker leaves once it reads EOF
    while [pid for pid in processes if _running(pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in processes if _running(pid)]


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# --- without processes ----------------------------------------------------------------------------


class _Sink:
    def __init__(self) -> None:
        self.batches: list[BatchTokenOut] = []

    def send(self, data: bytes) -> None:
        self.batches.append(decoder(BatchTokenOut).decode(data))


def _router(detokenizer_mode: str, workers: int, detokenizers: int) -> tuple[ResultsRouter, list[_Sink], list[str]]:
    args = ServerArgs(tokenizer_worker_num=workers, detokenizer_worker_num=detokenizers, detokenizer_mode=detokenizer_mode)
    ports = PortArgs("ipc:///x/scheduler", "ipc:///x/detokenizer", "ipc:///x/tokenizer_manager", "/x/results", "", "")
    inline = detokenizer_mode == "inline"
    sinks = [_Sink() for _ in range(workers if inline else detokenizers)]
    endpoints = worker_endpoints(args, ports)
    return ResultsRouter(endpoints, sinks, inline), sinks, endpoints


def _out(rid: str, finished: bool = False) -> TokenOut:
    return TokenOut(rid=rid, new_output_ids=[1], finished_reason={"type": "length"} if finished else None,
                    prompt_tokens=1, completion_tokens=1)


def test_inline_results_go_to_the_worker_that_sent_each_request() -> None:
    router, sinks, endpoints = _router("inline", 2, 1)
    assert endpoints == ["/x/results_w0", "/x/results_w1"]
    router.register("a", endpoints[1])
    router.register("b", endpoints[0])
    router.send_outs([_out("a"), _out("b"), _out("a", finished=True)])
    assert [[o.rid for o in b.outs] for b in sinks[0].batches] == [["b"]]
    assert [[o.rid for o in b.outs] for b in sinks[1].batches] == [["a", "a"]]
    router.send_outs([_out("a")])  # after its last output a rid is forgotten: the first worker's
    assert [[o.rid for o in b.outs] for b in sinks[0].batches] == [["b"], ["a"]]


def test_detokenizer_workers_get_each_request_always_and_name_its_worker() -> None:
    router, sinks, endpoints = _router("process", 2, 2)
    assert endpoints == ["ipc:///x/tokenizer_manager_w0", "ipc:///x/tokenizer_manager_w1"]
    rids = [f"r{i}" for i in range(16)]
    for i, rid in enumerate(rids):
        router.register(rid, endpoints[i % 2])
    for _ in range(3):
        router.send_outs([_out(rid) for rid in rids])
    for d, sink in enumerate(sinks):
        for batch in sink.batches:
            assert {detokenizer_of(o.rid, 2) for o in batch.outs} == {d}
            assert {endpoints[int(o.rid[1:]) % 2] for o in batch.outs} == {batch.http_worker_ipc}
    assert all(sink.batches for sink in sinks)  # both detokenizers share the work
    assert [detokenizer_of(rid, 2) for rid in rids] == [detokenizer_of(rid, 2) for rid in rids]


def test_one_worker_and_one_detokenizer_keep_the_single_endpoints() -> None:
    router, sinks, endpoints = _router("process", 1, 1)
    assert endpoints == ["ipc:///x/tokenizer_manager"]
    router.register("a", None)
    router.send_outs([_out("a")])
    assert sinks[0].batches[0].http_worker_ipc is None


def test_worker_flags_parse_and_are_checked() -> None:
    args = prepare_server_args(["--tokenizer-worker-num", "3", "--detokenizer-worker-num", "2"])
    assert (args.tokenizer_worker_num, args.detokenizer_worker_num, args.ignored_flags) == (3, 2, [])
    with pytest.raises(ValueError, match="--tokenizer-worker-num"):
        prepare_server_args(["--tokenizer-worker-num", "0", "--device", "cpu"]).resolve()
    resolved = prepare_server_args(["--detokenizer-worker-num", "2", "--detokenizer-mode", "process", "--device", "cpu"]).resolve()
    assert resolved.startup_warnings == []
