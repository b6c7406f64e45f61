"""Serving benchmark: N concurrent streamed requests to our server against HF transformers `generate`.

Ours: N requests sent at once to POST /generate with `stream: true`, each generating exactly
64 tokens (`ignore_eos`), sampling parameters cycling through a fixed mixed list (the HF anchor's
T 0.7 / top_p 0.9 / top_k 50 / repetition 1.1, greedy, min_p with frequency/presence penalties,
seeded). Per request: TTFT (send -> first chunk carrying a token) and ITL (the gap between two
chunks that add tokens, divided by the tokens added, one sample per token). Output tokens/s =
all output tokens / wall time (first send -> last request done).

HF: the same model (GGUF dequantised to fp32) and prompts through `generate`, the N prompts
batched with left padding, the anchor's sampling settings, min_new_tokens = max_new_tokens = 64
so every row is as long as ours. Its TTFT is the time to the batch's first generated token.

The two never run at the same time (2 cores): HF runs first, then the server is started (or,
with --url, an already running one is used) and ours runs on an otherwise idle machine. Each
(system, N) gets one untimed warm-up run of the same workload, then --rounds timed runs whose
requests and wall times are pooled. Every record also says how busy the machine was outside
this benchmark meanwhile (`outside_load_cores`): on a shared 2-core machine that is what makes
a run untrustworthy.

Usage:
  python benchmark/bench_serving.py                        # --launch, N 1 and 16, 5 rounds
  python benchmark/bench_serving.py --url http://127.0.0.1:30000 --concurrency 16
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import requests
import torch
from tqdm import tqdm

from bench_sampler import machine_description  # this folder is on sys.path when run as a script
from llama_server import LlamaServerProcess, completion_payload, missing_binary, server_argv, stream_completion
from sglang.srt.utils.embedded_model import embedded_model_path
from sglang.test.server_process import ServerProcess, free_port, percentile

RESULTS_DIR = Path(__file__).resolve().parent / "results"
NEW_TOKENS = 64
TARGET_N, TARGET_RATIO = 16, 2.0
# The llama.cpp anchor's systems (both through /v1/completions) and targets: ours / llama.cpp
# output tokens/s per concurrency.
OPENAI_SYSTEM, LLAMA_SYSTEM = "ours-openai", "llama.cpp"
LLAMA_TARGETS = {1: 1.0, 16: 1.5}
DETERMINISTIC_FLAGS = ("--enable-deterministic-inference",)

# Short English prompts, 10-40 tokens each with SmolLM2's tokenizer (checked at HF load time).
PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in simple terms why the sky looks blue during the day and red at sunset.",
    "List five practical tips for someone who wants to start running in the morning.",
    "What are the main differences between a virus and a bacterium? Answer briefly.",
    "Describe the taste of a ripe mango to someone who has never eaten one.",
    "Give me a recipe for a quick vegetarian dinner that uses chickpeas and spinach.",
    "Why do cats purr, and what does it usually mean when they do it?",
    "Summarize the plot of a detective novel set in a small mountain village in winter.",
    "How does a bicycle stay upright when it is moving but fall over when it stops?",
    "Write a friendly email inviting my neighbours to a garden party next Saturday afternoon.",
    "What should I pack for a three-day hiking trip in the mountains in early autumn?",
    "Explain how a refrigerator keeps food cold, step by step, for a curious child.",
    "Compose a short poem about the first snow of the year falling on a quiet city.",
    "What are some good habits for keeping a small vegetable garden healthy all summer?",
    "Tell me about the history of the printing press and why it changed the world.",
    "Suggest three names for a cozy coffee shop and explain the idea behind each one.",
]

# Cycled over the requests of a run: request i gets SAMPLING[i % len(SAMPLING)].
ANCHOR = {"temperature": 0.7, "top_p": 0.9, "top_k": 50, "repetition_penalty": 1.1}
SAMPLING: list[dict[str, Any]] = [
    dict(ANCHOR),
    {"temperature": 0.0},
    {"temperature": 0.8, "min_p": 0.05, "frequency_penalty": 0.3, "presence_penalty": 0.2},
    {"temperature": 0.7, "top_p": 0.9, "top_k": 50, "sampling_seed": 1234},
]


# ------------------------------------------------------------------------------------ ours


@dataclass
class RequestTiming:
    ttft_s: float = float("nan")
    itl_s: list[float] = field(default_factory=list)  # one sample per token after the first chunk
    tokens: int = 0


def request_payload(i: int, max_new_tokens: int = NEW_TOKENS) -> dict[str, Any]:
    params = {**SAMPLING[i % len(SAMPLING)], "max_new_tokens": max_new_tokens, "ignore_eos": True}
    return {"text": PROMPTS[i % len(PROMPTS)], "sampling_params": params, "stream": True}


def stream_one(url: str, payload: dict[str, Any], start: threading.Barrier) -> RequestTiming:
    """One streamed request; the barrier makes all N leave together."""
    timing = RequestTiming()
    start.wait()
    sent = last = time.perf_counter()
    with requests.post(url + "/generate", json=payload, stream=True, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith(b"data: "):
                continue
            data = line[len(b"data: ") :]
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"server error: {chunk['error']}")
            finish = chunk["meta_info"].get("finish_reason") or {}
            if finish.get("type") == "abort":  # e.g. NaN logits: the stream ends early with a message
                raise RuntimeError(f"server aborted the request: {finish.get('message')}")
            now = time.perf_counter()
            added = chunk["meta_info"]["completion_tokens"] - timing.tokens
            if added <= 0:
                continue
            if timing.tokens == 0:
                timing.ttft_s = now - sent
            else:
                timing.itl_s += [(now - last) / added] * added
            timing.tokens += added
            last = now
    return timing


def completions_request(i: int, max_new_tokens: int = NEW_TOKENS) -> dict[str, Any]:
    return completion_payload(PROMPTS[i % len(PROMPTS)], max_new_tokens, embedded_model_path())


# API -> (payload of request i, the client of one streamed request): /generate with the mixed
# sampling list, or OpenAI /v1/completions, which llama-server speaks too.
CLIENTS = {"generate": (request_payload, stream_one), "completions": (completions_request, stream_completion)}


def run_ours_once(
    url: str, n: int, max_new_tokens: int, bar: Optional[tqdm], api: str = "generate"
) -> tuple[list[RequestTiming], float]:
    """N requests at once; (per-request timings, wall seconds from release to last done)."""
    payload, send = CLIENTS[api]
    return run_streams(url, [payload(i, max_new_tokens) for i in range(n)], bar, send)


def run_streams(url: str, payloads: list[dict], bar: Optional[tqdm], send=stream_one) -> tuple[list[RequestTiming], float]:
    """Streamed requests released together; (per-request timings, wall seconds from release to last done)."""
    n = len(payloads)
    start = threading.Barrier(n + 1)
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(send, url, payload, start) for payload in payloads]
        start.wait()
        t0 = time.perf_counter()
        timings = []
        for future in futures:
            timings.append(future.result())
            if bar is not None:
                bar.update(1)
        wall = time.perf_counter() - t0
    return timings, wall


def bench_ours(url: str, concurrencies: list[int], rounds: int, system: str = "ours", api: str = "generate") -> list[dict]:
    records = []
    for n in concurrencies:
        run_ours_once(url, n, NEW_TOKENS, None, api)  # warm-up: the first run at a size pays one-off costs
        timings, wall = [], 0.0
        with OutsideLoad() as outside, tqdm(total=n * rounds, desc=f"{system} N={n}", unit="req") as bar:
            for _ in range(rounds):
                round_timings, round_wall = run_ours_once(url, n, NEW_TOKENS, bar, api)
                timings += round_timings
                wall += round_wall
        short = [t.tokens for t in timings if t.tokens != NEW_TOKENS]
        if short:
            raise RuntimeError(f"requests generated {short} tokens instead of {NEW_TOKENS}")
        itl = [gap for t in timings for gap in t.itl_s]
        tokens = sum(t.tokens for t in timings)
        records.append(record(system, n, [t.ttft_s for t in timings], itl, tokens, wall, rounds, outside.cpu_s))
    return records


# -------------------------------------------------------------------------------------- HF


class FirstTokenClock:
    """A generate streamer that notes when the first generated token arrives (its first `put`
    is the prompt)."""

    def __init__(self) -> None:
        self.puts: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(time.perf_counter())

    def end(self) -> None:
        pass

    @property
    def first_token(self) -> float:
        return self.puts[1]


def load_hf() -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(embedded_model_path())
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    lengths = [len(tokenizer(p)["input_ids"]) for p in PROMPTS]
    if not all(10 <= n <= 40 for n in lengths):
        raise ValueError(f"prompt token lengths {lengths} leave 10-40")
    return tokenizer, model


def run_hf_once(tokenizer: Any, model: Any, n: int, max_new_tokens: int) -> tuple[float, float, int]:
    """One batched generate of N prompts; (TTFT s, wall s, output tokens)."""
    batch = tokenizer([PROMPTS[i % len(PROMPTS)] for i in range(n)], return_tensors="pt", padding=True)
    clock = FirstTokenClock()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            **batch,
            do_sample=True,
            **ANCHOR,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            streamer=clock,
        )
    wall = time.perf_counter() - t0
    return clock.first_token - t0, wall, (out.shape[1] - batch["input_ids"].shape[1]) * n


def bench_hf(concurrencies: list[int], rounds: int) -> list[dict]:
    print("loading HF transformers model (GGUF -> fp32) ...", flush=True)
    tokenizer, model = load_hf()
    torch.manual_seed(0)
    records = []
    for n in concurrencies:
        run_hf_once(tokenizer, model, n, NEW_TOKENS)  # warm-up, as for ours
        ttfts, tokens, wall = [], 0, 0.0
        with OutsideLoad() as outside, tqdm(total=n * rounds, desc=f"hf   N={n}", unit="req") as bar:
            for _ in range(rounds):
                ttft, round_wall, round_tokens = run_hf_once(tokenizer, model, n, NEW_TOKENS)
                ttfts += [ttft] * n  # every row of the batch gets its first token together
                tokens += round_tokens
                wall += round_wall
                bar.update(n)
        records.append(record("hf", n, ttfts, None, tokens, wall, rounds, outside.cpu_s))
    del model
    gc.collect()
    return records


# ---------------------------------------------------------------------------------- server


def bench_launched(
    concurrencies: list[int], rounds: int, flags: tuple[str, ...] = (), system: str = "ours", api: str = "generate"
) -> list[dict]:
    """Start the embedded-model server with default flags (plus `flags`), run ours, stop it."""
    port = free_port()
    print(f"starting the server on port {port} {' '.join(flags)} ...", flush=True)
    server = ServerProcess(["--port", str(port), "--log-level", "warning", *flags], port, startup_timeout=600)
    try:
        server.wait_healthy()
        return bench_ours(server.url, concurrencies, rounds, system, api)
    finally:
        server.stop()


def bench_llama_server(binary: str, concurrencies: list[int], rounds: int) -> list[dict]:
    """llama-server on the same GGUF, same slots, same /v1/completions workload."""
    server = LlamaServerProcess(binary, embedded_model_path(), free_port(), max(concurrencies), torch.get_num_threads())
    print(f"starting {' '.join(server.command)} ...", flush=True)
    try:
        server.wait_healthy()
        return bench_ours(server.url, concurrencies, rounds, LLAMA_SYSTEM, "completions")
    finally:
        server.stop()


def bench_anchor_pairs(
    binary: str, concurrencies: list[int], rounds: int, pairs: int, flags: tuple[str, ...] = ()
) -> list[dict]:
    """Ours (with `flags`) and llama-server one after the other, `pairs` times, the order
    alternating; each record says its pair."""
    records = []
    ours_flags = (*server_argv(concurrencies), *flags)
    for pair in range(pairs):
        ours = lambda: bench_launched(concurrencies, rounds, ours_flags, OPENAI_SYSTEM, "completions")
        theirs = lambda: bench_llama_server(binary, concurrencies, rounds)
        for run in (ours, theirs) if pair % 2 == 0 else (theirs, ours):
            records += [{**r, "pair": pair} for r in run()]
    return records


# ------------------------------------------------------------------------------ outside load


def _busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _tree_cpu_s() -> float:
    """CPU seconds used so far by this process and its descendants (a launched server included)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it just exited
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    mine, frontier = {os.getpid()}, [os.getpid()]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        mine.update(children)
        frontier += children
    return sum(cpu[pid] for pid in mine if pid in cpu)


class OutsideLoad:
    """CPU seconds spent by anything outside this benchmark's process tree while it measures.

    The machine is shared and torch's threads stall badly when another process takes a core,
    so every record says how much of the machine was busy elsewhere. With --url the server is
    outside the tree and counts too."""

    def __enter__(self) -> "OutsideLoad":
        self.cpu_s = 0.0
        self._busy, self._tree = _busy_cpu_s(), _tree_cpu_s()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cpu_s = max(0.0, (_busy_cpu_s() - self._busy) - (_tree_cpu_s() - self._tree))


# ---------------------------------------------------------------------------------- output


def record(
    system: str,
    n: int,
    ttft_s: list[float],
    itl_s: Optional[list[float]],
    tokens: int,
    wall: float,
    rounds: int,
    outside_cpu_s: float,
) -> dict:
    return {
        "system": system,
        "concurrency": n,
        "rounds": rounds,
        "output_tok_s": tokens / wall,
        "ttft_ms_median": 1e3 * statistics.median(ttft_s),
        "ttft_ms_p90": 1e3 * percentile(ttft_s, 0.9),
        "itl_ms_median": 1e3 * statistics.median(itl_s) if itl_s else None,
        "itl_ms_p90": 1e3 * percentile(itl_s, 0.9) if itl_s else None,
        "total_tokens": tokens,
        "wall_s": wall,
        "outside_load_cores": outside_cpu_s / wall,
    }


def git_revision() -> Optional[str]:
    """The commit measured, marked -dirty when the working tree has changes."""
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=RESULTS_DIR.parent)
    except OSError:
        return None
    return done.stdout.strip() or None


def run_header(started: datetime.datetime) -> dict:
    """What every CPU benchmark's JSON starts with: when, where, what software, which command."""
    return {
        "date": started.isoformat(timespec="seconds"),
        "machine": machine_description(torch.device("cpu")),
        "torch": torch.__version__,
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "git": git_revision(),
    }


def write_results(result: dict, name: str, plot: Callable[[list[dict], Path], None]) -> Path:
    """benchmark/results/<name>.json and the plot of result["records"] beside it (.png); -> the
    JSON's path."""
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"{name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result["records"], out.with_suffix(".png"))
    return out


def header_line(result: dict) -> str:
    return f"{result['date']} | {result['machine']} | torch {result['torch']} | {result['git']}"


def header(started: datetime.datetime, args: argparse.Namespace) -> dict:
    import transformers

    return {
        **run_header(started),
        "torch_threads": torch.get_num_threads(),
        "transformers": transformers.__version__,
        "server": args.url or f"launched: python -m sglang.launch_server {' '.join(args.ours_flags) or '(default flags)'}, embedded model",
        "new_tokens": NEW_TOKENS,
        "sampling_ours": SAMPLING,
        "sampling_hf": {**ANCHOR, "do_sample": True, "min_new_tokens": NEW_TOKENS},
        "prompts": PROMPTS,
    }


def fmt(value: Optional[float], digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def ratios(records: list[dict]) -> dict[int, float]:
    """ours / HF output tokens/s per concurrency measured by both."""
    by = {(r["system"], r["concurrency"]): r["output_tok_s"] for r in records}
    return {n: by[("ours", n)] / by[("hf", n)] for (s, n) in by if s == "ours" and ("hf", n) in by}


def markdown_table(records: list[dict]) -> str:
    records = [r for r in records if r["system"] not in (OPENAI_SYSTEM, LLAMA_SYSTEM)]
    ratio = ratios(records)
    by_system = {(r["system"], r["concurrency"]): r["output_tok_s"] for r in records}
    lines = [
        "| system | N | output tok/s | ours / HF | TTFT median ms | TTFT p90 ms | ITL median ms | ITL p90 ms | tokens | wall s | outside load (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(records, key=lambda r: (r["concurrency"], r["system"] != "ours")):
        share = f"{ratio[r['concurrency']]:.2f}x" if r["system"] == "ours" and r["concurrency"] in ratio else ""
        plain = by_system.get(("ours", r["concurrency"]))
        if r["system"] == "ours-deterministic" and plain:
            share = f"{r['output_tok_s'] / plain:.2f}x of ours"
        lines.append(
            f"| {r['system']} | {r['concurrency']} | {fmt(r['output_tok_s'])} | {share} | {fmt(r['ttft_ms_median'], 0)} "
            f"| {fmt(r['ttft_ms_p90'], 0)} | {fmt(r['itl_ms_median'])} | {fmt(r['itl_ms_p90'])} | {r['total_tokens']} | {r['wall_s']:.1f} | {r['outside_load_cores']:.2f} |"
        )
    return "\n".join(lines)


def anchor_pairs(records: list[dict]) -> list[tuple[dict, dict]]:
    """(llama.cpp record, ours record) per concurrency and pair, in that order."""
    ours = {(r["concurrency"], r["pair"]): r for r in records if r["system"] == OPENAI_SYSTEM}
    theirs = sorted((r for r in records if r["system"] == LLAMA_SYSTEM), key=lambda r: (r["concurrency"], r["pair"]))
    return [(r, ours[(r["concurrency"], r["pair"])]) for r in theirs if (r["concurrency"], r["pair"]) in ours]


def anchor_table(records: list[dict]) -> str:
    lines = [
        "| N | pair | llama.cpp tok/s | ours tok/s | ours / llama.cpp | target | TTFT median ms (llama.cpp / ours) "
        "| ITL median ms (llama.cpp / ours) | outside load, cores (llama.cpp / ours) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for theirs, ours in anchor_pairs(records):
        n, ratio = ours["concurrency"], ours["output_tok_s"] / theirs["output_tok_s"]
        target = LLAMA_TARGETS.get(n)
        verdict = "" if target is None else f">= {target:g}x: {'met' if ratio >= target else 'NOT met'}"
        lines.append(
            f"| {n} | {ours['pair']} | {fmt(theirs['output_tok_s'])} | {fmt(ours['output_tok_s'])} | {ratio:.2f}x | {verdict} "
            f"| {fmt(theirs['ttft_ms_median'], 0)} / {fmt(ours['ttft_ms_median'], 0)} "
            f"| {fmt(theirs['itl_ms_median'])} / {fmt(ours['itl_ms_median'])} "
            f"| {theirs['outside_load_cores']:.2f} / {ours['outside_load_cores']:.2f} |"
        )
    return "\n".join(lines)


def anchor_plot(records: list[dict], path: Path, title: str) -> None:
    """Output tokens/s and TTFT per concurrency, llama.cpp beside ours, one bar per pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = anchor_pairs(records)
    ns = sorted({ours["concurrency"] for _, ours in pairs})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, key, ylabel in zip(axes, ("output_tok_s", "ttft_ms_median"), ("output tokens/s", "TTFT median ms")):
        for k, (label, pick) in enumerate(((LLAMA_SYSTEM, 0), ("ours", 1))):
            for i, n in enumerate(ns):
                values = [pair[pick][key] for pair in pairs if pair[pick]["concurrency"] == n]
                xs = [i + (k - 0.5) * 0.4 + (j - (len(values) - 1) / 2) * 0.4 / len(values) for j in range(len(values))]
                ax.bar(xs, values, 0.4 / len(values), color=f"C{k}", label=label if i == 0 else None)
        label_axis(ax, ns, ylabel)
    save_figure(fig, path, title)


def label_axis(ax: Any, ns: list[int], ylabel: str) -> None:
    """One tick per concurrency, the y label, a light grid and the legend."""
    ax.set(xticks=range(len(ns)), xticklabels=[f"N={n}" for n in ns], ylabel=ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")


def save_figure(fig: Any, path: Path, title: str) -> None:
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def target_verdict(records: list[dict]) -> str:
    ratio = ratios(records).get(TARGET_N)
    if ratio is None:
        return f"target not measured (needs ours and HF at N={TARGET_N})"
    met = "MET" if ratio >= TARGET_RATIO else "NOT MET"
    return f"target: at least {TARGET_RATIO:g}x HF's output tokens/s at N={TARGET_N} -> {ratio:.2f}x: {met}"


def plot(records: list[dict], path: Path, title: str) -> None:
    """Tokens/s bars per concurrency (ours vs HF, with the 2x-HF target), TTFT and ITL bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = sorted({r["concurrency"] for r in records})
    by = {(r["system"], r["concurrency"]): r for r in records}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    systems = [s for s in ("ours", "ours-deterministic", "hf") if any(r["system"] == s for r in records)]
    width = 0.8 / len(systems)
    for k, system in enumerate(systems):
        offset = (k - (len(systems) - 1) / 2) * width
        xs = [i + offset for i, n in enumerate(ns) if (system, n) in by]
        picked = [by[(system, n)] for n in ns if (system, n) in by]
        axes[0].bar(xs, [r["output_tok_s"] for r in picked], width, label=system)
        medians = [r["ttft_ms_median"] for r in picked]
        spread = [[0] * len(picked), [r["ttft_ms_p90"] - r["ttft_ms_median"] for r in picked]]
        axes[1].bar(xs, medians, width, yerr=spread, capsize=3, label=system)
    for i, n in enumerate(ns):
        if ("hf", n) in by:
            target = TARGET_RATIO * by[("hf", n)]["output_tok_s"]
            axes[0].hlines(target, i - width, i + width, colors="k", linestyles="--", label=f"{TARGET_RATIO:g}x HF" if i == 0 else None)
        if ("hf", n) in by and ("ours", n) in by:
            mine = by[("ours", n)]["output_tok_s"]
            axes[0].annotate(f"{mine / by[('hf', n)]['output_tok_s']:.2f}x", (i - width / 2, mine), ha="center", va="bottom", fontsize=8)
    ours = [by[("ours", n)] for n in ns if ("ours", n) in by]
    xs = [i for i, n in enumerate(ns) if ("ours", n) in by]
    axes[2].bar([x - width / 2 for x in xs], [r["itl_ms_median"] for r in ours], width, color="C0", label="median")
    axes[2].bar([x + width / 2 for x in xs], [r["itl_ms_p90"] for r in ours], width, color="C0", alpha=0.45, label="p90")
    labels = ("output tokens/s", "TTFT ms (bar median, whisker p90)", "ours: ITL ms")
    for ax, ylabel in zip(axes, labels):
        label_axis(ax, ns, ylabel)
    save_figure(fig, path, title)


# ------------------------------------------------------------------------------------ main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", help="a running server (e.g. http://127.0.0.1:30000); it should be idle")
    where.add_argument("--launch", action="store_true", help="start the embedded-model server, stop it at the end (default)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16], help="concurrent requests per run (default 1 16)")
    parser.add_argument("--rounds", type=int, default=5, help="timed runs per system and concurrency, pooled (default 5)")
    parser.add_argument("--no-hf", action="store_true", help="skip HF transformers")
    parser.add_argument(
        "--deterministic", action="store_true",
        help="also launch the server with --enable-deterministic-inference (system ours-deterministic)",
    )
    parser.add_argument(
        "--llama-server", metavar="PATH",
        help="also run llama.cpp's llama-server on the same GGUF and ours through /v1/completions, one after the "
        "other (skipped with a message when PATH is not an executable)",
    )
    parser.add_argument("--pairs", type=int, default=2, help="ours / llama-server runs, order alternating (default 2)")
    parser.add_argument(
        "--ours-flags", type=shlex.split, default=[], metavar="FLAGS",
        help="extra flags for every server this benchmark launches, one quoted string, e.g. "
        "--ours-flags='--cpu-int8-activations --max-queued-requests 64'",
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    # HF first and alone: the server must not compete with it for the two cores.
    records = [] if args.no_hf else bench_hf(args.concurrency, args.rounds)
    if args.url:
        records += bench_ours(args.url.rstrip("/"), args.concurrency, args.rounds)
    else:
        flags = tuple(args.ours_flags)
        records += bench_launched(args.concurrency, args.rounds, flags)
        if args.deterministic:
            records += bench_launched(args.concurrency, args.rounds, (*flags, *DETERMINISTIC_FLAGS), "ours-deterministic")
    anchor = args.llama_server and missing_binary(args.llama_server) is None
    if args.llama_server and not anchor:
        print(f"skipping the llama.cpp anchor: {missing_binary(args.llama_server)}", flush=True)
    if anchor:
        records += bench_anchor_pairs(args.llama_server, args.concurrency, args.rounds, args.pairs, tuple(args.ours_flags))
    head = header(started, args)
    if anchor:
        head["llama_server"] = {
            "binary": args.llama_server, "version": LlamaServerProcess.version(args.llama_server),
            "payload": completions_request(0),  # what both servers got (prompts vary)
        }
    head["elapsed_s"] = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "serving_cpu.json").write_text(json.dumps({"header": head, "records": records}, indent=1) + "\n")
    plot(records, args.out_dir / "serving_cpu.png", f"Serving, {NEW_TOKENS} tokens/request, {head['machine']}, torch {head['torch']}")
    print(f"\n{head['date']} | {head['machine']} | torch {head['torch']} | transformers {head['transformers']}")
    print(markdown_table(records))
    print(target_verdict(records))
    if anchor:
        anchor_plot(records, args.out_dir / "serving_llama_cpp.png", f"/v1/completions, {NEW_TOKENS} tokens/request, {head['machine']}")
        print(anchor_table(records))


if __name__ == "__main__":
    main()
