"""Shared by the reliability suite and benchmark/soak.py: servers with an environment, the
scheduler's load and its idle state, server RSS, and the load driver (streaming clients with
mixed sampling parameters, some of which disconnect mid-stream) with its replay check."""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Optional

import psutil
import requests

from sglang.test.server_process import ServerProcess, free_port

LONG = os.environ.get("SGLANG_RELIABILITY_LONG") == "1"  # the long versions of the suite
API_KEY = "reliability-secret"
IDLE_WAIT_S = 300.0  # a deadline for the server to drain, not a timing assertion
PROMPTS = [
    "The history of the printing press",
    "Write a short poem about rain.",
    "List three uses of copper:",
    "Explain recursion to a child.",
    "Once upon a time, in a small village,",
    "The capital of France is",
    "def fibonacci(n):",
    "Q: What is 17 times 3?\nA:",
]


@contextlib.contextmanager
def server(*flags: str, env: Optional[dict[str, str]] = None, api_key: Optional[str] = None) -> Iterator[ServerProcess]:
    port = free_port()
    argv = ["--port", str(port), *flags] + (["--api-key", api_key] if api_key else [])
    proc = ServerProcess(argv, port, env={**os.environ, **(env or {})}, api_key=api_key, startup_timeout=900)
    with proc:
        yield proc


def load(srv: ServerProcess) -> dict[str, Any]:
    response = requests.get(srv.url + "/get_server_info", headers=srv.headers(), timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["load"]


def is_idle(state: dict[str, Any]) -> bool:
    """No request admitted or queued, every request slot free, no KV token held by a request:
    every slot is free or a cached prefix nobody uses."""
    return (
        state["num_running_reqs"] == 0
        and state["num_queue_reqs"] == 0
        and state["req_slots_free"] == state["req_slots_total"]
        and state["num_used_tokens"] == 0
        and state["num_free_tokens"] + state["num_evictable_tokens"] == state["max_total_num_tokens"]
    )


def wait_for_load(srv: ServerProcess, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The load once predicate(load) holds; AssertionError with the last load at the deadline."""
    deadline = time.monotonic() + IDLE_WAIT_S
    state = load(srv)
    while not predicate(state) and time.monotonic() < deadline:
        time.sleep(0.05)
        state = load(srv)
    assert predicate(state), state
    return state


def wait_idle(srv: ServerProcess) -> dict[str, Any]:
    return wait_for_load(srv, is_idle)


def server_rss_mib(srv: ServerProcess) -> float:
    """Resident memory of the server and its child processes (scheduler ranks, the detokenizer in process mode)."""
    proc = psutil.Process(srv.proc.pid)
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20


# ------------------------------------------------------------------ the load driver


def sampling_params(rng: random.Random, max_new_tokens: int) -> dict[str, Any]:
    """One of the mixes clients send; sampled ones are seeded, so every request replays."""
    seed = rng.randrange(2**31)
    kind = rng.choice(["greedy", "top", "penalties", "stop"])
    params: dict[str, Any] = {"max_new_tokens": max_new_tokens, "ignore_eos": rng.random() < 0.5}
    if kind == "greedy":
        params["temperature"] = 0
    elif kind == "top":
        params.update(temperature=0.8, top_p=0.9, top_k=50, sampling_seed=seed)
    elif kind == "penalties":
        params.update(temperature=0.7, min_p=0.05, frequency_penalty=0.3, presence_penalty=0.2,
                      repetition_penalty=1.1, sampling_seed=seed)
    else:
        params.update(temperature=0, stop=["\n\n", "."])
    return params


@dataclass
class Record:
    body: dict[str, Any]
    disconnect_at: Optional[int]  # stream chunks read before closing; None: reads to the end
    status: int = 0
    output_ids: list[int] = field(default_factory=list)
    finish_reason: Optional[dict[str, Any]] = None
    error: Optional[str] = None
    ttft_s: Optional[float] = None
    e2e_s: Optional[float] = None


def stream_request(srv: ServerProcess, record: Record) -> Record:
    """POST /generate streaming; with disconnect_at, close the connection after that many chunks."""
    start = time.perf_counter()
    try:
        with requests.post(srv.url + "/generate", json={**record.body, "stream": True}, headers=srv.headers(),
                           stream=True, timeout=900) as response:
            record.status = response.status_code
            if response.status_code != 200:
                record.error = response.text[:300]
                return record
            chunks = 0
            for line in response.iter_lines():
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    record.error = json.dumps(chunk["error"])[:300]
                    return record
                chunks += 1
                if chunks == 1:
                    record.ttft_s = time.perf_counter() - start
                record.output_ids = chunk["output_ids"]
                record.finish_reason = chunk["meta_info"]["finish_reason"]
                if record.disconnect_at is not None and chunks >= record.disconnect_at:
                    return record  # leaving the with-block closes the connection mid-stream
    except requests.RequestException as err:
        record.error = f"{type(err).__name__}: {err}"
    record.e2e_s = time.perf_counter() - start
    return record


def kill_streams(srv: ServerProcess, count: int, clients: int = 32, progress: Any = None) -> list[Record]:
    """`count` short streams (16 tokens, greedy or seeded), each closed after its first 1-3 chunks."""
    rng = random.Random(1)
    records = [
        Record({"text": rng.choice(PROMPTS) + f" #{i}", "sampling_params": {"max_new_tokens": 16, "ignore_eos": True,
                "temperature": rng.choice([0, 0.9]), "sampling_seed": i}}, disconnect_at=rng.randint(1, 3))
        for i in range(count)
    ]

    def kill(record: Record) -> Record:
        stream_request(srv, record)
        if progress is not None:
            progress(record)
        return record

    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(kill, records))


@dataclass
class LoadReport:
    records: list[Record]
    seconds: float

    def completed(self) -> list[Record]:
        return [r for r in self.records if r.disconnect_at is None]

    def errors(self) -> list[Record]:
        """Requests that did not disconnect and yet did not finish normally."""
        return [
            r for r in self.completed()
            if r.error is not None or r.status != 200 or (r.finish_reason or {}).get("type") not in ("length", "stop")
        ]


def run_load(srv: ServerProcess, seconds: float, clients: int = 64, disconnect_share: float = 0.1,
             max_new_tokens: tuple[int, int] = (8, 48), seed: int = 0, progress: Any = None) -> LoadReport:
    """`clients` threads stream requests back to back for `seconds`; `disconnect_share` of the
    requests close their connection at a random chunk."""
    deadline = time.monotonic() + seconds
    records: list[Record] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        while time.monotonic() < deadline:
            params = sampling_params(rng, rng.randint(*max_new_tokens))
            body = {"text": rng.choice(PROMPTS) + f" ({rng.randrange(1000)})", "sampling_params": params}
            disconnect_at = rng.randint(1, params["max_new_tokens"] - 1) if rng.random() < disconnect_share else None
            record = stream_request(srv, Record(body, disconnect_at))
            with lock:
                records.append(record)
            if progress is not None:
                progress(record)

    start = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    return LoadReport(records, time.monotonic() - start)


def replay_mismatches(srv: ServerProcess, records: list[Record], workers: int = 16) -> list[tuple[Record, Any]]:
    """Send each record's request again (not streamed); the ones whose tokens differ."""

    def again(record: Record) -> tuple[Record, Any]:
        response = requests.post(srv.url + "/generate", json=record.body, headers=srv.headers(), timeout=900)
        return record, response.json().get("output_ids") if response.status_code == 200 else response.text

    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(again, records))
    return [(record, ids) for record, ids in results if ids != record.output_ids]


def metric(srv: ServerProcess, sample: str, **labels: str) -> float:
    """One sample of /metrics, parsed with prometheus_client's text parser (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    response = requests.get(srv.url + "/metrics", headers=srv.headers(), timeout=120)
    assert response.status_code == 200, response.text
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0
