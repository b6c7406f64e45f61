"""Micro-benchmark of a bare CPU decode step of the embedded model (SmolLM2-135M, no scheduler,
no sampling), three paths fed the same tokens, alternating step by step in one run:

  op by op              the layers' kernels called one by one from the modules
  one call per layer    every decoder layer in one C call (decode_layer_cpu.c): what serves;
                        its logits must equal op by op's at every step (same functions, same order)
  int8 activations      one call per layer with --cpu-int8-activations (block_quant_linear_q8.c):
                        its distance from the exact logits is recorded at every step (max |diff|,
                        relative L2 distance, share of rows whose argmax agrees)

Then the text-level effect of int8 activations: each of the serving benchmark's prompts decoded
greedily by the exact and the int8 runner, and how many tokens they agree on before the first
difference.

Median and minimum ms per step, the CPU other processes took meanwhile, JSON and a plot under
benchmark/results/.

    .venv/bin/python benchmark/bench_decode_step_cpu.py [--batch 1 3 16] [--steps 80] [--tag cpu]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from bench_serving import PROMPTS, OutsideLoad, header_line, run_header, write_results
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.models import llama
from sglang.srt.utils.embedded_model import embedded_model_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))
from runner_utils import Driver  # noqa: E402  (the tests' stand-in for the scheduler's part of a step)

PROMPT_LEN = 8
WARMUP_STEPS = 10
EXACT, OP_BY_OP, INT8 = "one call per layer", "op by op", "int8 activations"
PATHS = (EXACT, OP_BY_OP, INT8)


def measure(batch: int, steps: int) -> list[dict[str, Any]]:
    fused_step = llama.LlamaModel._cpu_decode_step
    runners = [
        ModelRunner(embedded_model_path(), max_running_requests=batch, max_total_tokens=4096, cpu_int8_activations=path == INT8)
        for path in PATHS
    ]
    drivers = [Driver(r) for r in runners]
    reqs = [[d.new_req() for _ in range(batch)] for d in drivers]
    times: dict[str, list[float]] = {path: [] for path in PATHS}
    max_diff, relative, agree = [], [], 0
    try:
        with torch.inference_mode(), OutsideLoad() as outside:
            for d, rq in zip(drivers, reqs):
                d.extend(rq, [[1 + b + i for i in range(PROMPT_LEN)] for b in range(batch)])
            for i in tqdm(range(WARMUP_STEPS + steps), desc=f"decode step B={batch}", unit="step"):
                tokens = [100 + i + b for b in range(batch)]
                logits = {}
                for path, d, rq in zip(PATHS, drivers, reqs):
                    llama.LlamaModel._cpu_decode_step = (lambda *a: None) if path == OP_BY_OP else fused_step
                    start = time.perf_counter()
                    logits[path] = d.decode(rq, tokens)
                    if i >= WARMUP_STEPS:
                        times[path].append((time.perf_counter() - start) * 1e3)
                if not torch.equal(logits[EXACT], logits[OP_BY_OP]):
                    raise AssertionError(f"B={batch} step {i}: the two exact paths' logits differ")
                diff = logits[INT8] - logits[EXACT]
                max_diff.append(diff.abs().max().item())
                relative += (diff.norm(dim=-1) / logits[EXACT].norm(dim=-1)).tolist()
                agree += int((logits[INT8].argmax(-1) == logits[EXACT].argmax(-1)).sum())
    finally:
        llama.LlamaModel._cpu_decode_step = fused_step
    error = {"int8_max_abs_logit_diff": round(max(max_diff), 4), "int8_relative_l2_median": round(statistics.median(relative), 5),
             "int8_relative_l2_max": round(max(relative), 5), "int8_argmax_agreement": round(agree / len(relative), 4)}
    return [
        {"batch": batch, "path": path, "median_ms": round(statistics.median(t), 2), "min_ms": round(min(t), 2),
         "steps": len(t), "exact_logits_equal": True, "outside_load_cpu_s": round(outside.cpu_s, 2),
         **(error if path == INT8 else {})}
        for path, t in times.items()
    ]


def greedy_agreement(new_tokens: int) -> list[dict[str, Any]]:
    """Per bench prompt: the tokens the exact and the int8 runner agree on, greedy, before the
    first difference (new_tokens when they never differ)."""
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    tokenizer = get_tokenizer(embedded_model_path(), False)
    runners = [ModelRunner(embedded_model_path(), max_running_requests=1, max_total_tokens=4096,
                           cpu_int8_activations=int8) for int8 in (False, True)]
    results = []
    with torch.inference_mode():
        for prompt in tqdm(PROMPTS, desc="greedy agreement", unit="prompt"):
            outputs = [greedy(Driver(runner), tokenizer.encode(prompt), new_tokens) for runner in runners]
            same = next((i for i, (a, b) in enumerate(zip(*outputs)) if a != b), new_tokens)
            results.append({"prompt": prompt, "agreeing_tokens": same, "of": new_tokens})
    return results


def greedy(driver: Driver, prompt: list[int], new_tokens: int) -> list[int]:
    req = [driver.new_req()]
    tokens = [int(driver.extend(req, [prompt]).next_token_logits.argmax(-1)[0])]
    for _ in range(new_tokens - 1):
        tokens.append(int(driver.decode(req, tokens[-1:]).argmax(-1)[0]))
    driver.release()
    return tokens


def markdown_table(records: list[dict]) -> str:
    lines = [
        "| B | op by op median (min) ms | one call per layer median (min) ms | int8 activations median (min) ms "
        "| int8: max abs logit diff | int8: relative L2 (median / max) | int8: argmax agrees |",
        "|---|---|---|---|---|---|---|",
    ]
    by_key = {(r["batch"], r["path"]): r for r in records}
    for batch in dict.fromkeys(r["batch"] for r in records):
        fused, plain, int8 = (by_key[(batch, path)] for path in (EXACT, OP_BY_OP, INT8))
        lines.append(
            f"| {batch} | {plain['median_ms']} ({plain['min_ms']}) | {fused['median_ms']} ({fused['min_ms']}) | "
            f"{int8['median_ms']} ({int8['min_ms']}) | {int8['int8_max_abs_logit_diff']} | "
            f"{int8['int8_relative_l2_median']} / {int8['int8_relative_l2_max']} | {100 * int8['int8_argmax_agreement']:.1f}% |"
        )
    return "\n".join(lines)


def plot(records: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    batches = list(dict.fromkeys(r["batch"] for r in records))
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    width = 0.27
    for j, (name, colour) in enumerate(zip((OP_BY_OP, EXACT, INT8), ("tab:grey", "tab:green", "tab:blue"))):
        medians = [next(r["median_ms"] for r in records if r["batch"] == b and r["path"] == name) for b in batches]
        ax.bar([i + (j - 1) * width for i in range(len(batches))], medians, width, color=colour, label=name)
    ax.set_xticks(range(len(batches)), [f"B={b}" for b in batches])
    ax.set_ylabel("ms per decode step (lower is better)")
    ax.set_title("Bare CPU decode step, embedded model", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 3, 16])
    parser.add_argument("--steps", type=int, default=80, help="Timed steps per path and batch.")
    parser.add_argument("--tag", default="cpu", help="Results go to benchmark/results/decode_step_<tag>.json/.png.")
    parser.add_argument("--greedy-tokens", type=int, default=32, help="Tokens per prompt for the greedy agreement.")
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    records = [r for batch in args.batch for r in measure(batch, args.steps)]
    agreement = greedy_agreement(args.greedy_tokens)
    result = {**run_header(started), "torch_threads": torch.get_num_threads(), "records": records,
              "int8_greedy_agreement": agreement}
    out = write_results(result, f"decode_step_{args.tag}", plot)
    print(header_line(result))
    print(markdown_table(records))
    full = sum(a["agreeing_tokens"] == a["of"] for a in agreement)
    print(f"int8 activations, greedy: {full} of {len(agreement)} prompts give the exact path's {args.greedy_tokens} tokens; "
          f"agreeing tokens per prompt: {[a['agreeing_tokens'] for a in agreement]}")
    print(f"wrote {out} and .png")


if __name__ == "__main__":
    main()
