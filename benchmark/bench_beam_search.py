"""Beam search against parallel sampling on the real server: N concurrent requests, each either
a beam search of width k (beam_width k, n k: all k beams returned) or the same prompt with n = k
seeded samples (temperature 1), max_new_tokens tokens each with ignore_eos, so both modes return
k sequences of the same length per request and compute k rows per step.

The server is launched once (the embedded SmolLM2 unless --model-path); after one untimed
warm-up of each mode, --rounds timed rounds of each, alternating (B S, S B, B S, ...). Each
round sends the N requests at once and waits for all. Output tok/s = returned tokens / wall
time of the round; the table gives the median round per mode. Every record says how busy the
machine was outside the benchmark (OutsideLoad, as bench_serving.py).

Results: benchmark/results/beam/beam_<device>.json (header + records).

Usage:
  python benchmark/bench_beam_search.py --rounds 2 --new-tokens 16   # CPU, N=8, k=4 (as recorded)
  python benchmark/bench_beam_search.py --device cuda --n 64 --model-path /models/Llama-3.1-8B-Instruct
  (any flags after -- go to the server)
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests
import torch

from bench_sampler import machine_description  # this folder is on sys.path when run as a script
from bench_serving import PROMPTS, OutsideLoad, run_header
from sglang.test.server_process import ServerProcess, free_port

RESULTS_DIR = Path(__file__).resolve().parent / "results" / "beam"
MODES = ("beam", "sampling")


def payload(mode: str, i: int, width: int, new_tokens: int) -> dict[str, Any]:
    params: dict[str, Any] = {"max_new_tokens": new_tokens, "ignore_eos": True, "n": width}
    if mode == "beam":
        params["beam_width"] = width
    else:
        params.update(temperature=1.0, sampling_seed=i)
    return {"text": PROMPTS[i % len(PROMPTS)], "sampling_params": params}


def returned_tokens(result: Any) -> int:
    """Tokens of every sequence a request returned: its k beams, or its n samples."""
    if isinstance(result, list):
        return sum(len(r["output_ids"]) for r in result)
    return sum(len(b["output_ids"]) for b in result["meta_info"]["beam_results"])


def one_round(url: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    def send(i: int) -> int:
        response = requests.post(url + "/generate", json=payload(mode, i, args.width, args.new_tokens), timeout=3600)
        response.raise_for_status()
        return returned_tokens(response.json())

    with OutsideLoad() as outside, ThreadPoolExecutor(args.n) as pool:
        start = time.perf_counter()
        tokens = sum(pool.map(send, range(args.n)))
        wall = time.perf_counter() - start
    expected = args.n * args.width * args.new_tokens
    if tokens != expected:
        raise RuntimeError(f"{mode}: {tokens} returned tokens instead of {expected}")
    return {"mode": mode, "requests": args.n, "width": args.width, "new_tokens": args.new_tokens,
            "wall_s": wall, "output_tok_s": tokens / wall, "outside_load_cores": outside.cpu_s / wall}


def run(args: argparse.Namespace, server_flags: list[str]) -> list[dict[str, Any]]:
    port = free_port()
    flags = ["--port", str(port), "--log-level", "warning", "--device", args.device, *server_flags]
    if args.model_path:
        flags += ["--model-path", args.model_path]
    log_path = Path(tempfile.gettempdir()) / f"bench_beam_server_{port}.log"
    print(f"starting the server: {' '.join(flags)} (log: {log_path})", flush=True)
    server = ServerProcess(flags, port, startup_timeout=1800, log_path=log_path)
    try:
        server.wait_healthy()
        for mode in MODES:
            one_round(server.url, mode, args)  # warm-up
        records = []
        for r in range(args.rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]
            for mode in order:
                records.append({**one_round(server.url, mode, args), "round": r})
                print(json.dumps(records[-1]), flush=True)
        return records
    finally:
        server.stop()


def summary(records: list[dict[str, Any]]) -> dict[str, float]:
    return {mode: statistics.median(r["output_tok_s"] for r in records if r["mode"] == mode) for mode in MODES}


def main() -> None:
    argv = sys.argv[1:]
    server_flags = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--n", type=int, default=None, help="concurrent requests (CPU 8, CUDA 64)")
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=None, help="max_new_tokens (CPU 32, CUDA 128)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--tag", default=None, help="suffix of the results file")
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    args.n = args.n or (64 if cuda else 8)
    args.new_tokens = args.new_tokens or (128 if cuda else 32)
    started = datetime.datetime.now(datetime.timezone.utc)
    records = run(args, server_flags)
    header = run_header(started)
    if cuda:
        header["machine"] = machine_description(torch.device("cuda"))
    result = {**header, "model": args.model_path or "embedded SmolLM2-135M-Instruct", "server_flags": server_flags,
              "median_output_tok_s": summary(records), "records": records}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"beam_{args.device}{'_' + args.tag if args.tag else ''}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}: median returned tok/s {result['median_output_tok_s']}")


if __name__ == "__main__":
    main()
