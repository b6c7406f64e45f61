"""Guidance benchmark: what a guided row (sampling_params.guidance: a second context in the batch
and the mix in the sampler) costs against an unguided one.

One server (the embedded model unless --model-path; the device the server picks: CUDA when
present). N requests are sent at once, each a PROMPT_LEN-token prompt generating --max-new-tokens
tokens (ignore_eos, greedy): all unguided, then all guided with `cfg` (weight 3) on a guide
prompt of the same length, then all guided with `mixture` / `kl_symmetry` (the bisection's
extra work), then `cfg` with weight 1, whose tokens must be the unguided ones (checked). Each batch runs --rounds times after one warm-up batch; the median wall time of a
batch (send -> last answer) is recorded, and guided / unguided is the per-row cost ratio (the
issue's target: at most 2.1x).

Records go to benchmark/results/guidance/<tag>.json.

Usage:
  python benchmark/bench_guidance.py                       # CPU: N=16
  python benchmark/bench_guidance.py --n 64 --tag h100 -- --model-path /tmp/qwen3-0.6b   # GPU: N=64
  (benchmark/gpu_guidance_check.sh writes that checkpoint and runs it)
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from bench_serving import OutsideLoad, run_header  # this folder is on sys.path when run as a script
from sglang.test.server_process import ServerProcess, free_port

PROMPT_LEN = 64
TARGET_RATIO = 2.1
RESULTS_DIR = Path(__file__).resolve().parent / "results" / "guidance"
MODES = {
    "unguided": None,
    "cfg": {"method": "cfg", "weight": 3.0},
    "mixture_kl": {"method": "mixture", "alpha": "kl_symmetry"},
    "cfg_w1": {"method": "cfg", "weight": 1.0},  # must give the unguided tokens exactly
}


def prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 20000) for _ in range(PROMPT_LEN)] for _ in range(n)]


def post_batch(url: str, bodies: list[dict]) -> tuple[float, list]:
    """(wall seconds, each request's output ids) of /generate `bodies` sent at once."""
    def one(body: dict) -> list[int]:
        response = requests.post(url + "/generate", json=body, timeout=3600)
        response.raise_for_status()
        return response.json()["output_ids"]

    start = time.perf_counter()
    with ThreadPoolExecutor(len(bodies)) as pool:
        produced = list(pool.map(one, bodies))
    return time.perf_counter() - start, produced


def run_batch(url: str, mains: list[list[int]], guides: list[list[int]], mode: str, new_tokens: int) -> tuple[float, list]:
    """(wall seconds, each request's output ids) of one batch sent at once."""
    bodies = []
    for main_ids, guide_ids in zip(mains, guides):
        params = {"temperature": 0.0, "max_new_tokens": new_tokens, "ignore_eos": True}
        if MODES[mode] is not None:
            params["guidance"] = {**MODES[mode], "input_ids": guide_ids}
        bodies.append({"input_ids": main_ids, "sampling_params": params})
    wall, produced = post_batch(url, bodies)
    assert all(len(ids) == new_tokens for ids in produced), [len(ids) for ids in produced]
    return wall, produced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=16, help="concurrent requests per batch")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tag", default="cpu", help="results file name")
    parser.add_argument("server_flags", nargs="*", help="extra server flags, after --")
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    port = free_port()
    flags = ["--port", str(port), "--log-level", "warning", "--max-running-requests", str(2 * args.n), *args.server_flags]
    server = ServerProcess(flags, port, startup_timeout=900)
    records = []
    try:
        server.wait_healthy()
        mains, guides = prompts(args.n, 0), prompts(args.n, 1)
        outputs = {}
        for mode in MODES:
            _, outputs[mode] = run_batch(server.url, mains, guides, mode, args.max_new_tokens)  # warm-up (and prefix cache)
            with OutsideLoad() as load:
                times = [run_batch(server.url, mains, guides, mode, args.max_new_tokens)[0] for _ in range(args.rounds)]
            records.append({"mode": mode, "n": args.n, "max_new_tokens": args.max_new_tokens, "batch_s": times,
                            "median_s": statistics.median(times), "outside_cpu_s": round(load.cpu_s, 1)})
            print(f"{mode:>12}: median {statistics.median(times):.3f} s per batch of {args.n} ({times})", flush=True)
    finally:
        server.stop()
    base = records[0]["median_s"]
    for record in records:
        record["ratio_to_unguided"] = round(record["median_s"] / base, 3)
    cfg_w1_exact = outputs["cfg_w1"] == outputs["unguided"]
    print(f"cfg weight 1 gives the unguided tokens: {cfg_w1_exact}")
    result = {**run_header(started), "benchmark": "guidance", "server_flags": args.server_flags,
              "target_ratio": TARGET_RATIO, "cfg_w1_equals_unguided": cfg_w1_exact, "records": records}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"{args.tag}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("| mode | N | median batch s | ratio to unguided |\n|---|---|---|---|")
    for r in records:
        print(f"| {r['mode']} | {r['n']} | {r['median_s']:.3f} | {r['ratio_to_unguided']:.2f}x |")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
