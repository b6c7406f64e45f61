"""Prefix-cache benchmark: one shared 1,000-token system prompt, 64 short questions, 8 at a time.

The embedded model's server is launched twice in the same run, with the radix cache and with
--disable-radix-cache, on an otherwise idle machine (2 cores: never both at once). Each
server first answers one unrelated warm-up request and then has its cache flushed, so the
first question of the timed run pays the full prefill. Every request is the system prompt's
1,000 token ids followed by one question's ids, generating 32 tokens (`ignore_eos`), greedy.
8 client threads each send their next request as soon as their previous one is done.

Per request: TTFT (send -> first streamed chunk carrying a token). Output tokens/s = all
output tokens / wall time. Records {"benchmark": "prefix_cache", "radix_cache", "mean_ttft_ms",
"output_tok_s", ...} go to benchmark/results/prefix_cache_cpu.json, with a plot beside it.

Usage:
  python benchmark/bench_prefix_cache.py
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests
from tqdm import tqdm

from bench_serving import OutsideLoad, run_header, write_results  # this folder is on sys.path when run as a script
from sglang.test.server_process import free_port, percentile
from llama_server import sse_chunks

SYSTEM_TOKENS = 1000
NEW_TOKENS = 32
TARGET_RATIO = 5.0
GUIDE = (
    "You are the guide of the Harbour Museum, a former railway station converted in 1952. "
    "The ground floor holds the maritime collection: ship models, navigation instruments, a "
    "restored lighthouse lens and paintings of the harbour from the seventeenth century onwards. "
    "The first floor shows the history of the railway, with a signal box, timetables, uniforms "
    "and the original ticket hall. The museum opens at nine and closes at six, except on Mondays. "
    "Tickets cost twelve euros, children under twelve enter free, and the cafe on the terrace "
    "serves soup, sandwiches and cakes. Photography without flash is allowed everywhere except "
    "in the temporary exhibition, which this season presents maps drawn by sailors. Answer every "
    "visitor politely, in at most three sentences, and suggest one exhibit related to the question. "
)
QUESTION_STEMS = [
    "When does the museum open on {}?", "Is the {} room accessible by wheelchair?",
    "Where can I find the {} collection?", "How old is the {} exhibit?",
]
TOPICS = [
    "Saturday", "lighthouse", "signal box", "ship model", "map", "ticket hall", "uniform", "cafe",
    "terrace", "painting", "timetable", "compass", "sextant", "anchor", "Sunday", "Tuesday",
]


def tokenize(url: str, text: str) -> list[int]:
    response = requests.post(url + "/tokenize", json={"prompt": text}, timeout=60)
    response.raise_for_status()
    return response.json()["tokens"]


def workload(url: str) -> tuple[list[int], list[list[int]]]:
    """The system prompt's first SYSTEM_TOKENS ids and the 64 questions' ids."""
    system = tokenize(url, GUIDE * 8)[:SYSTEM_TOKENS]
    if len(system) < SYSTEM_TOKENS:
        raise RuntimeError(f"the system prompt has only {len(system)} tokens")
    questions = [f"\nVisitor: {stem.format(topic)}\nGuide:" for stem in QUESTION_STEMS for topic in TOPICS]
    return system, [tokenize(url, q) for q in questions]


def ttft_of(url: str, input_ids: list[int]) -> tuple[float, int]:
    """(TTFT seconds, output tokens) of one streamed greedy request."""
    payload = {
        "input_ids": input_ids,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True},
        "stream": True,
    }
    sent, ttft, tokens = time.perf_counter(), float("nan"), 0
    with requests.post(url + "/generate", json=payload, stream=True, timeout=600) as response:
        response.raise_for_status()
        for chunk in sse_chunks(response):
            done = chunk["meta_info"]["completion_tokens"]
            if done and tokens == 0:
                ttft = time.perf_counter() - sent
            tokens = done
    return ttft, tokens


def run(url: str, system: list[int], questions: list[list[int]], concurrency: int, radix_cache: bool) -> dict:
    lock = threading.Lock()
    with OutsideLoad() as outside, tqdm(total=len(questions), desc=f"radix_cache={radix_cache}", unit="req") as bar:
        def one(question: list[int]) -> tuple[float, int]:
            result = ttft_of(url, system + question)
            with lock:
                bar.update(1)
            return result

        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(one, questions))
        wall = time.perf_counter() - t0
    ttft = [t for t, _ in results]
    tokens = sum(n for _, n in results)
    if tokens != NEW_TOKENS * len(questions):
        raise RuntimeError(f"{tokens} output tokens instead of {NEW_TOKENS * len(questions)}")
    return {
        "benchmark": "prefix_cache",
        "radix_cache": radix_cache,
        "mean_ttft_ms": 1e3 * statistics.fmean(ttft),
        "median_ttft_ms": 1e3 * statistics.median(ttft),
        "p90_ttft_ms": 1e3 * percentile(ttft, 0.9),
        "output_tok_s": tokens / wall,
        "requests": len(questions),
        "concurrency": concurrency,
        "wall_s": wall,
        "outside_load_cores": outside.cpu_s / wall,
    }


def bench_server(radix_cache: bool, concurrency: int, flags: list[str]) -> dict:
    from sglang.test.server_process import ServerProcess

    port = free_port()
    extra = [] if radix_cache else ["--disable-radix-cache"]
    print(f"starting the server on port {port} {' '.join(extra + flags)} ...", flush=True)
    server = ServerProcess(["--port", str(port), "--log-level", "warning", *extra, *flags], port, startup_timeout=600)
    try:
        server.wait_healthy()
        system, questions = workload(server.url)
        ttft_of(server.url, tokenize(server.url, "Warm up: say hello.") * 20)
        requests.post(server.url + "/flush_cache", timeout=60).raise_for_status()
        return run(server.url, system, questions, concurrency, radix_cache)
    finally:
        server.stop()


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    labels = ["radix cache" if r["radix_cache"] else "--disable-radix-cache" for r in records]
    colours = ["tab:green" if r["radix_cache"] else "tab:grey" for r in records]
    for ax, key, title in ((axes[0], "mean_ttft_ms", "mean TTFT (ms, lower is better)"),
                           (axes[1], "output_tok_s", "output tokens/s (higher is better)")):
        values = [r[key] for r in records]
        ax.bar(labels, values, color=colours)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:.0f}", ha="center", va="bottom")
        ax.set_title(title, fontsize=10)
    fig.suptitle(f"1,000-token shared system prompt, {records[0]['requests']} questions, "
                 f"{records[0]['concurrency']} at a time (CPU, embedded SmolLM2-135M)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def markdown_table(records: list[dict]) -> str:
    rows = ["| radix cache | mean TTFT ms | median TTFT ms | p90 TTFT ms | output tok/s | wall s | outside load (cores) |",
            "|---|---|---|---|---|---|---|"]
    for r in records:
        rows.append(
            f"| {'on' if r['radix_cache'] else 'off (--disable-radix-cache)'} | {r['mean_ttft_ms']:.0f} | "
            f"{r['median_ttft_ms']:.0f} | {r['p90_ttft_ms']:.0f} | {r['output_tok_s']:.1f} | {r['wall_s']:.1f} | "
            f"{r['outside_load_cores']:.2f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tag", default="cpu", help="Results go to benchmark/results/prefix_cache_<tag>.json/.png.")
    parser.add_argument("--server-flags", default="", help="More launch flags for both servers, e.g. '--device cuda'.")
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    flags = shlex.split(args.server_flags)
    records = [bench_server(radix, args.concurrency, flags) for radix in (True, False)]
    ratio = records[1]["mean_ttft_ms"] / records[0]["mean_ttft_ms"]
    result: dict[str, Any] = {
        **run_header(started),
        "system_prompt_tokens": SYSTEM_TOKENS,
        "new_tokens": NEW_TOKENS,
        "ttft_ratio_uncached_over_cached": ratio,
        "target_ratio": TARGET_RATIO,
        "records": records,
    }
    out = write_results(result, f"prefix_cache_{args.tag}", plot)
    print(markdown_table(records))
    verdict = "meets" if ratio >= TARGET_RATIO else "MISSES"
    print(f"mean TTFT without / with the cache: {ratio:.1f}x ({verdict} the {TARGET_RATIO:.0f}x target); wrote {out}")


if __name__ == "__main__":
    main()
