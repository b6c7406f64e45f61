"""Watermark overhead of whole serving: one server with --enable-watermark, N requests sent at
once (PROMPT_LEN-token random-id prompts, --max-new-tokens each, ignore_eos), plain against the
same requests watermarked, for temperature 1.0 and for T 0.7 / top_p 0.9 / top_k 50, in
alternating rounds after a warm-up batch of each. The median batch wall time of each; the
overhead is watermarked / plain - 1 (the issue's target: at most 5% at N=64 on an H100).
bench_watermark.py times the sampler's step alone.

Records go to benchmark/results/watermark/<tag>.json.

Usage:
  python benchmark/bench_watermark_serving.py --n 16 --max-new-tokens 32             # CPU, embedded model
  python benchmark/bench_watermark_serving.py --n 64 --tag h200 -- --model-path /tmp/qwen3-0.6b
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from pathlib import Path

from bench_guidance import post_batch, prompts  # this folder is on sys.path when run as a script
from bench_serving import OutsideLoad, run_header
from sglang.test.server_process import ServerProcess, free_port

TARGET_OVERHEAD = 0.05
RESULTS_DIR = Path(__file__).resolve().parent / "results" / "watermark"
CASES = {"t1": {"temperature": 1.0}, "filtered": {"temperature": 0.7, "top_p": 0.9, "top_k": 50}}
WATERMARK = {"key": "0123456789abcdef", "context_window": 4}


def bodies(mains: list[list[int]], case: dict, watermark: bool, new_tokens: int) -> list[dict]:
    out = []
    for i, ids in enumerate(mains):
        params = {**case, "max_new_tokens": new_tokens, "ignore_eos": True, "sampling_seed": i}
        if watermark:
            params["watermark"] = WATERMARK
        out.append({"input_ids": ids, "sampling_params": params})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=16, help="concurrent requests per batch")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tag", default="serving_cpu", help="results file name")
    parser.add_argument("server_flags", nargs="*", help="extra server flags, after --")
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    port = free_port()
    flags = ["--port", str(port), "--log-level", "warning", "--enable-watermark",
             "--max-running-requests", str(args.n), *args.server_flags]
    server = ServerProcess(flags, port, startup_timeout=900)
    records = []
    try:
        server.wait_healthy()
        mains = prompts(args.n, 0)
        for name, case in CASES.items():
            batches = {wm: bodies(mains, case, wm, args.max_new_tokens) for wm in (False, True)}
            times: dict[bool, list[float]] = {False: [], True: []}
            for wm in (False, True):
                post_batch(server.url, batches[wm])  # warm-up (and prefix cache)
            with OutsideLoad() as load:
                for r in range(args.rounds):
                    for wm in ((False, True) if r % 2 == 0 else (True, False)):
                        times[wm].append(post_batch(server.url, batches[wm])[0])
            plain, marked = statistics.median(times[False]), statistics.median(times[True])
            records.append({"case": name, "params": case, "n": args.n, "max_new_tokens": args.max_new_tokens,
                            "plain_s": times[False], "watermark_s": times[True], "plain_median_s": plain,
                            "watermark_median_s": marked, "overhead": round(marked / plain - 1, 4),
                            "outside_cpu_s": round(load.cpu_s, 1)})
            print(f"{name}: plain {plain:.3f} s, watermark {marked:.3f} s per batch of {args.n}: "
                  f"overhead {marked / plain - 1:+.1%}", flush=True)
    finally:
        server.stop()
    result = {**run_header(started), "benchmark": "watermark_serving", "server_flags": args.server_flags,
              "target_overhead": TARGET_OVERHEAD, "records": records}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"{args.tag}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("| params | N | plain batch s | watermarked batch s | overhead |\n|---|---|---|---|---|")
    for r in records:
        print(f"| {json.dumps(r['params'])} | {r['n']} | {r['plain_median_s']:.3f} | {r['watermark_median_s']:.3f} | {r['overhead']:+.1%} |")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
