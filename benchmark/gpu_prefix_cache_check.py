"""The radix prefix cache on CUDA, through the real server: cached runs against --disable-radix-cache.

Serves a random-weight Qwen3-0.6B-shaped checkpoint (fp32) with a KV pool small enough that the
cache must evict, and sends at once: prompts sharing prefixes of 0, 100, 300 and 600 tokens with
four suffixes each, greedy and seeded (penalties), then the same bodies again (whole-prompt hits).
Deterministic mode (--enable-deterministic-inference, 64-token chunks): every request's tokens
must be equal with and without the cache (exit status 1 otherwise). Default mode: the cached
K/V come from other batch shapes, so only agreement is reported. Prints the cache hits.

  python benchmark/gpu_prefix_cache_check.py --out-dir OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_tp_check import SEEDED, SHAPES, serve_and_generate, write_checkpoint, write_tokenizer  # noqa: E402

SMALL_POOL = ["--max-total-tokens", "6000", "--max-running-requests", "16"]


def build_requests(vocab_size: int, max_new_tokens: int) -> list[dict]:
    gen = torch.Generator().manual_seed(3)
    base = torch.randint(0, vocab_size - 1, (600,), generator=gen).tolist()
    suffixes = [torch.randint(0, vocab_size - 1, (n,), generator=gen).tolist() for n in (3, 9, 20, 41)]
    common = dict(max_new_tokens=max_new_tokens, ignore_eos=True)
    bodies = []
    for cut in (600, 300, 100, 0):
        for i, suffix in enumerate(suffixes):
            prompt = base[:cut] + suffix
            bodies.append({"input_ids": prompt, "sampling_params": {"temperature": 0.0, **common}})
            bodies.append({"input_ids": prompt, "sampling_params": {**SEEDED, "sampling_seed": 40 + i, **common}})
    return bodies + [dict(b) for b in bodies]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args()
    args.device, args.dtype = "cuda", "float32"
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="gpu_prefix_cache_")
    os.makedirs(out_dir, exist_ok=True)
    model = tempfile.mkdtemp(prefix="qwen3_random_")
    shape = SHAPES["qwen3-0.6b"]
    write_checkpoint(model, shape, torch.bfloat16)
    write_tokenizer(model, shape["vocab_size"])
    bodies = build_requests(shape["vocab_size"], args.max_new_tokens)
    modes = {"default": [], "deterministic": ["--enable-deterministic-inference", "--chunked-prefill-size", "64"]}
    failures, report = 0, {}
    for mode, flags in modes.items():
        runs = {}
        for name, extra in (("cache", []), ("no_cache", ["--disable-radix-cache"])):
            log = os.path.join(out_dir, f"server-{mode}-{name}.log")
            runs[name] = serve_and_generate(args, model, 1, SMALL_POOL + flags + extra, bodies, log)
            print(f"{mode}/{name}: ready {runs[name]['ready_s']} s, {len(bodies)} requests in "
                  f"{runs[name]['generate_s']} s, exit {runs[name]['exit_code']}", flush=True)
        equal = sum(a == b for a, b in zip(runs["cache"]["output_ids"], runs["no_cache"]["output_ids"]))
        hits = runs["cache"]["cached_tokens"]
        print(f"{mode}: {equal}/{len(bodies)} requests equal with and without the cache; cache hits: "
              f"{sum(h > 0 for h in hits)} requests, {sum(hits)} tokens (none without: {not any(runs['no_cache']['cached_tokens'])})")
        if mode == "deterministic" and equal != len(bodies):
            failures += len(bodies) - equal
        report[mode] = {"equal": equal, "total": len(bodies), "runs": runs}
    with open(os.path.join(out_dir, "prefix_cache_check.json"), "w") as f:
        json.dump(report, f)
    print("RESULT:", "PASS" if failures == 0 else f"FAIL, {failures} deterministic-mode requests differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
