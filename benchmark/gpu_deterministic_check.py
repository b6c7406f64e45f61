"""--enable-deterministic-inference on a GPU: SGLang's single / mixed / prefix checks through the
real server on a random-weight Qwen3-0.6B-shaped checkpoint, batch sizes up to 64, plus the
model's rows bit for bit and tokens/s with the flag on and off.

Every output is compared as (token id, logprob) pairs, so a difference in any bit of the logits
shows, not only one that flips a token. Prints PASS/FAIL lines and writes a JSON summary.

    bash benchmark/make_engine_carry.sh   # here, once: .carry_engine/ (server wheels, tokenizer)
    python benchmark/gpu_deterministic_check.py --out /tmp/out --tokenizer .carry_engine/tokenizer
    python benchmark/gpu_deterministic_check.py --device cpu --layers 2 --max-batch 4   # a dry run
    python benchmark/gpu_deterministic_check.py --tp-size 2 --out /tmp/out   # the server checks at TP=2

With `--tp-size N` above 1 only the server checks run: the model-rows check drives one
ModelRunner, which has no TP group.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import requests
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from random_checkpoint import write_qwen3_checkpoint  # noqa: E402
from sglang.test.server_process import free_port  # noqa: E402

SETTINGS = {
    "greedy": {"temperature": 0.0},
    "seeded": {"temperature": 0.8, "sampling_seed": 7, "min_p": 0.05, "top_p": 0.95,
               "frequency_penalty": 0.5, "repetition_penalty": 1.1},
}
NEW_TOKENS = 16
PROMPT = "Write a short poem about the sea and the wind."
OTHERS = ["Hi", "List three colours.", "What is 12 times 7?",
          "Explain in one paragraph why the sky looks blue during the day and red at sunset.",
          "Tell me a story about a robot who learns to paint, with a happy ending and a moral."]
PREFIX = ("You are a helpful assistant. Answer briefly and precisely. The user is curious about science, "
          "history and cooking, and likes examples. ")
SUFFIXES = ["Why is salt added to pasta water?", "Who built the pyramids?", "What is a prime number?"]


def batch(url: str, prompts: list[str], params: dict) -> list[tuple]:
    """One /generate batch: per prompt, its (logprob, token id) pairs."""
    payload = {"text": prompts, "sampling_params": {**params, "max_new_tokens": NEW_TOKENS}, "return_logprob": True}
    response = requests.post(url + "/generate", json=payload, timeout=600)
    response.raise_for_status()
    return [tuple(tuple(e[:2]) for e in r["meta_info"]["output_token_logprobs"]) for r in response.json()]


def concurrently(url: str, batches: list[list[str]], params: dict) -> list[list[tuple]]:
    with concurrent.futures.ThreadPoolExecutor(len(batches)) as pool:
        return list(pool.map(lambda prompts: batch(url, prompts, params), batches))


def check_single(url: str, params: dict, max_batch: int) -> int:
    sizes = sorted({1, 2, 3, 4, 8, 16, 32, 64} & set(range(1, max_batch + 1)))
    outputs = {out for size in sizes for out in batch(url, [PROMPT] * size, params)}
    return len(outputs)


def check_mixed(url: str, params: dict, max_batch: int) -> int:
    crowd = (OTHERS * (max_batch // len(OTHERS) + 1))[: max(0, max_batch - 2)]
    mixes = [[PROMPT], [PROMPT] + OTHERS[:2], OTHERS[2:] + [PROMPT], crowd[: len(crowd) // 2] + [PROMPT] + crowd[len(crowd) // 2 :]]
    outputs = set()
    for order in (mixes, mixes[::-1]):
        for mix, results in zip(order, concurrently(url, order, params)):
            outputs.update(out for prompt, out in zip(mix, results) if prompt == PROMPT)
    return len(outputs)


def check_prefix(url: str, params: dict, max_batch: int) -> int:
    """The largest number of distinct outputs of any one prompt (1 = pass)."""
    prompts = [PREFIX[:cut] + suffix for cut in (40, 90, len(PREFIX)) for suffix in SUFFIXES]
    seen: dict[str, set] = {p: set() for p in prompts}
    batches = [prompts, prompts[::-1], prompts[::3], (prompts * 8)[:max_batch]]
    for prompts_in, results in zip(batches, concurrently(url, batches, params)):
        for prompt, out in zip(prompts_in, results):
            seen[prompt].add(out)
    for prompt in prompts:
        seen[prompt].update(batch(url, [prompt], params))
    return max(len(outs) for outs in seen.values())


def throughput(url: str, n: int) -> float:
    """Output tokens/s of n concurrent seeded requests of NEW_TOKENS * 4 tokens."""
    params = {**SETTINGS["seeded"], "max_new_tokens": NEW_TOKENS * 4, "ignore_eos": True}
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(lambda i: requests.post(
            url + "/generate", json={"text": OTHERS[i % len(OTHERS)], "sampling_params": {**params, "sampling_seed": i}},
            timeout=600).json(), range(n)))
    return sum(r["meta_info"]["completion_tokens"] for r in results) / (time.perf_counter() - start)


def serve(folder: str, args: argparse.Namespace, deterministic: bool) -> dict[str, Any]:
    from sglang.test.server_process import ServerProcess

    port = free_port()
    flags = ["--model-path", folder, "--device", args.device, "--port", str(port), "--log-level", "warning",
             "--chunked-prefill-size", "64", "--max-running-requests", str(max(64, args.max_batch) + 8)]
    flags += ["--enable-deterministic-inference"] if deterministic else []
    flags += ["--sampling-backend", args.sampling_backend] if args.sampling_backend else []
    flags += ["--tp-size", str(args.tp_size)]
    server = ServerProcess(flags, port, startup_timeout=900)
    results: dict[str, Any] = {}
    try:
        server.wait_healthy()
        if deterministic:
            for name, params in SETTINGS.items():
                for check in (check_single, check_mixed, check_prefix):
                    unique = check(server.url, params, args.max_batch)
                    results[f"{check.__name__[6:]}/{name}"] = unique
                    print(f"{'PASS' if unique == 1 else 'FAIL'} {check.__name__[6:]:6s} {name:6s} unique outputs: {unique}", flush=True)
        throughput(server.url, args.max_batch)  # warm-up
        results["tok_s"] = throughput(server.url, args.max_batch)
        print(f"tokens/s, {args.max_batch} concurrent, deterministic={deterministic}: {results['tok_s']:.1f}", flush=True)
    finally:
        server.stop()
    return results


def model_rows(folder: str, args: argparse.Namespace, deterministic: bool) -> int:
    """Batch sizes (2..max) at which the prompt's prefill or decode logits differ from alone."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "test"))
    from runner_utils import Driver

    from sglang.srt.model_executor.model_runner import ModelRunner

    runner = ModelRunner(folder, device=args.device, max_total_tokens=16384, max_running_requests=args.max_batch + 1,
                         deterministic=deterministic)
    gen = torch.Generator().manual_seed(0)
    target = torch.randint(0, 49152, (37,), generator=gen).tolist()
    driver = Driver(runner)
    solo = driver.new_req()
    ref = [driver.extend([solo], [target]).next_token_logits[0].clone(), driver.decode([solo], [11])[0].clone()]
    driver.release()
    bad = 0
    for size in range(2, args.max_batch + 1, max(1, args.max_batch // 8)):
        prompts = [torch.randint(0, 49152, (int(torch.randint(3, 90, (1,), generator=gen)),), generator=gen).tolist()
                   for _ in range(size)]
        at = size // 2
        prompts[at] = target
        reqs = [driver.new_req() for _ in range(size)]
        prefill = driver.extend(reqs, prompts).next_token_logits[at]
        decode = driver.decode(reqs, [11] * size)[at]
        bad += not (torch.equal(prefill, ref[0]) and torch.equal(decode, ref[1]))
        driver.release()
    del runner
    if args.device == "cuda":
        torch.cuda.empty_cache()
    print(f"model rows, deterministic={deterministic}: batch sizes with different bits: {bad}", flush=True)
    return bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("/tmp/deterministic_out"))
    parser.add_argument("--tokenizer", default=".carry_engine/tokenizer")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--sampling-backend", help="the server's --sampling-backend (default: the server's default)")
    parser.add_argument("--checkpoint", default="/tmp/qwen3-0.6b-random", help="where to write the random checkpoint")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than Qwen3-0.6B's 28 (dry runs)")
    parser.add_argument("--tp-size", type=int, default=1, help="the server's --tp-size")
    args = parser.parse_args()
    folder = args.checkpoint
    overrides = {"num_hidden_layers": args.layers} if args.layers else {}
    write_qwen3_checkpoint(folder, args.tokenizer, device=args.device, **overrides)
    summary = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
        "tp": args.tp_size,
        "model_rows_mismatches": {mode: model_rows(folder, args, mode) if args.tp_size == 1 else None
                                  for mode in (False, True)},
        "server_deterministic": serve(folder, args, True),
        "server_default": serve(folder, args, False),
    }
    checks = {k: v for k, v in summary["server_deterministic"].items() if "/" in k}
    summary["pass"] = all(v == 1 for v in checks.values()) and summary["model_rows_mismatches"][True] in (0, None)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "deterministic.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("ALL PASS" if summary["pass"] else "SOME CHECKS FAILED", flush=True)
    sys.exit(0 if summary["pass"] else 1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
