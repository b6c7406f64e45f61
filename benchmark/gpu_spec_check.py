"""Speculative decoding on CUDA against decoding without it, through the real server.

Serves a random-weight Qwen3-0.6B-shaped float32 checkpoint with CUDA graphs on (decode graphs,
piecewise extend graphs): without speculation, with NGRAM, with STANDALONE drafting with the
target itself (every greedy draft accepted: the verify path at full acceptance) and with a
2-layer draft of the same shape (many rejections). With two or more GPUs visible, STANDALONE
(self-draft) and NGRAM also run at --tp-size 2 (the draft sharded over both ranks, NCCL) with
the rank agreement check on. Every run gets the same batch: per prompt a greedy row, a greedy
row with penalties, a seeded row with top-k / top-p / min-p and every penalty, a seeded row with
min_new_tokens and logit_bias, a greedy row steered to repeat a token cycle (NGRAM finds
drafts), and one unseeded row (compared by nobody; the agreement check covers it at TP=2).

In float32 the verify's extend kernels and the decode kernels agree to rounding, so every
compared row must give the tokens of the run without speculation (docs/speculative.md); the
script prints each run's acceptance (spec_accept_length) so a run that never speculated shows.
Exit status 1 on a difference.

  python benchmark/gpu_spec_check.py --out-dir OUT
  python benchmark/gpu_spec_check.py --runs standalone_self_tp2 ngram_tp2   # two GPUs: the TP=2 runs only
  python benchmark/gpu_spec_check.py --device cpu --shape tiny   # the same flow on the CPU (gloo at TP=2)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_tp_check import SEEDED, SHAPES, post_json, wait_healthy, write_checkpoint, write_tokenizer  # noqa: E402
from sglang.test.server_process import free_port  # noqa: E402

CYCLE = list(range(1000, 1016))  # the token cycle the steered rows repeat
UNCHECKED = "ngram_tp2_unchecked"  # the one run without SGLANG_TP_CHECK_TOKEN_AGREEMENT


def build_requests(vocab_size: int, max_new_tokens: int) -> tuple[list[dict], list[str]]:
    """(bodies, kind of each); kind "unseeded" is never compared."""
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, vocab_size - 1, (n,), generator=gen).tolist() for n in (9, 40, 130)]
    prompts.append(CYCLE * 4)
    common = dict(max_new_tokens=max_new_tokens, ignore_eos=True)
    bodies, kinds = [], []
    for i, prompt in enumerate(prompts):
        variants = {
            "greedy": {"temperature": 0.0},
            "greedy+penalties": {"temperature": 0.0, "frequency_penalty": 0.8, "repetition_penalty": 1.3},
            "seeded+penalties": {**SEEDED, "sampling_seed": 2000 + i},
            "seeded+min_new_tokens+logit_bias": {"temperature": 0.9, "top_k": 40, "sampling_seed": 3000 + i,
                                                 "min_new_tokens": 8, "logit_bias": {str(7 + i): 4.0}},
            "greedy+repeat": {"temperature": 0.0, "logit_bias": {str(t): 30.0 for t in CYCLE}},
            "unseeded": {"temperature": 1.0, "top_p": 0.9},
        }
        for kind, params in variants.items():
            bodies.append({"input_ids": prompt, "sampling_params": {**params, **common}})
            kinds.append(kind)
    return bodies, kinds


def serve(device: str, model: str, flags: list[str], bodies: list[dict], log_path: str,
          check_agreement: bool = True) -> dict[str, Any]:
    """Start the server, send every body at once, stop it: tokens, spec counters, timings."""
    port = free_port()
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--device", device,
               "--dtype", "float32", "--port", str(port), "--context-length", "1024", "--max-running-requests", "32",
               "--max-total-tokens", "32768", *flags]
    env = {**os.environ, "SGLANG_TP_CHECK_TOKEN_AGREEMENT": "1" if check_agreement else "0"}
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_healthy(proc, f"http://127.0.0.1:{port}", log_path)
            ready_s = time.perf_counter() - start
            start = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
                url = f"http://127.0.0.1:{port}/generate"
                results = list(pool.map(lambda body: post_json(url, body), bodies))
            generate_s = time.perf_counter() - start
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    return {"command": " ".join(command[1:]), "ready_s": round(ready_s, 1), "generate_s": round(generate_s, 2),
            "output_ids": [r["output_ids"] for r in results],
            "accept_length": [r["meta_info"].get("spec_accept_length") for r in results],
            "exit_code": proc.returncode}


def runs_to_make(target: str, draft2: str, tp2: bool) -> dict[str, list[str]]:
    spec = ["--speculative-disable-batch-size", "64"]
    self_draft = ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", target,
                  "--speculative-num-steps", "4", *spec]
    ngram = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8", *spec]
    runs = {
        "off": [],
        "ngram": ngram,
        "standalone_self": self_draft,
        "standalone_2layer": ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", draft2,
                              "--speculative-num-steps", "4", *spec],
        # NGRAM sampling eagerly (no graphs) at TP=1, as TP=2 with the agreement check does.
        "ngram_eager": [*ngram, "--disable-cuda-graph"],
        "ngram_eager_no_overlap": [*ngram, "--disable-cuda-graph", "--disable-overlap-schedule"],
    }
    if tp2:
        runs["standalone_self_tp2"] = [*self_draft, "--tp-size", "2"]
        runs["ngram_tp2"] = [*ngram, "--tp-size", "2"]
        runs["ngram_tp2_no_overlap"] = [*ngram, "--tp-size", "2", "--disable-overlap-schedule"]
        runs[UNCHECKED] = [*ngram, "--tp-size", "2"]  # without the agreement check: graphs sample
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--shape", default="qwen3-0.6b", choices=["qwen3-0.6b", "tiny"])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--runs", nargs="+", default=None,
                        help="the speculative runs to make (default: all that the GPUs allow); spec off always runs")
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args()
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="gpu_spec_check_")
    os.makedirs(out_dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="spec_ckpt_")
    shape = SHAPES[args.shape]
    target, draft2 = os.path.join(root, "target"), os.path.join(root, "draft2")
    for folder, layers, seed in ((target, shape["num_hidden_layers"], 0), (draft2, 2, 1)):
        os.makedirs(folder)
        write_checkpoint(folder, {**shape, "num_hidden_layers": layers}, torch.float32, seed=seed)
        write_tokenizer(folder, shape["vocab_size"])
    bodies, kinds = build_requests(shape["vocab_size"], args.max_new_tokens)
    results: dict[str, dict] = {}
    tp2 = args.device == "cpu" or torch.cuda.device_count() >= 2
    runs = runs_to_make(target, draft2, tp2)
    if args.runs:
        unknown = set(args.runs) - set(runs)
        if unknown:
            parser.error(f"unknown or impossible runs {sorted(unknown)}; possible: {sorted(runs)}")
        runs = {name: flags for name, flags in runs.items() if name == "off" or name in args.runs}
    for name, flags in runs.items():
        started = time.perf_counter()
        try:
            results[name] = serve(args.device, target, flags, bodies, os.path.join(out_dir, f"server-{name}.log"),
                                  check_agreement=name != UNCHECKED)
        except Exception as err:  # noqa: BLE001 - reported, the other runs go on
            results[name] = {"error": repr(err)[-3000:]}
            print(f"{name}: FAILED {err!r}"[:3000], flush=True)
            continue
        lengths = [a for a in results[name]["accept_length"] if a is not None]
        mean = sum(lengths) / len(lengths) if lengths else None
        print(f"{name}: ready {results[name]['ready_s']} s, batch {results[name]['generate_s']} s "
              f"(total {time.perf_counter() - started:.0f} s), mean accept length {mean}, exit {results[name]['exit_code']}",
              flush=True)
    failures = compare(results, kinds)
    with open(os.path.join(out_dir, "spec_check.json"), "w") as f:
        json.dump({"kinds": kinds, "runs": results}, f)
    print("RESULT:", "PASS, speculation gives the tokens of decoding without it" if failures == 0
          else f"FAIL, {failures} differences or failed runs")
    return 1 if failures else 0


def compare(results: dict[str, dict], kinds: list[str]) -> int:
    """Print each spec run's per-kind equality with the run without speculation; the failures."""
    reference = results.get("off")
    if reference is None or "error" in reference:
        return 1
    failures = 0
    for name, run in results.items():
        if name == "off":
            continue
        if "error" in run:
            failures += 1
            continue
        summary: dict[str, list[int]] = {}
        for i, kind in enumerate(kinds):
            if kind == "unseeded":
                continue
            want, got = reference["output_ids"][i], run["output_ids"][i]
            same = want == got
            summary.setdefault(kind, [0, 0])[0 if same else 1] += 1
            if not same:
                failures += 1
                first = next((k for k, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
                print(f"{name}: request {i} ({kind}) differs from token {first}\n  off:  {want}\n  spec: {got}")
        print(f"{name}: " + ", ".join(f"{kind} {s} equal / {d} differ" for kind, (s, d) in summary.items()))
    return failures


if __name__ == "__main__":
    sys.exit(main())
