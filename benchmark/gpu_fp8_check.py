"""GPU checks of FP8 weights (issue 34, item 3), in one command on one H100:

1. gemm: the linears of Qwen3-8B (qkv 6144x4096, o 4096x4096, gate_up 24576x4096,
   down 4096x12288) at M = 1, 64, 256. Each FP8 kernel against the torch reference
   (fp8_reference.py), then times inside a CUDA graph (as decode runs): bf16 F.linear; on
   per-channel FP8 weights the Triton kernel and torch._scaled_mm; on 128x128 block weights the
   Triton kernel. It prints the ROWWISE_TRITON_MAX_ROWS the times give beside the one in
   layers/quantization/fp8_gemm.py (the rule documented in docs/models.md), and whether the
   rule picks the faster kernel at every M.
2. model: a Qwen3-8B-shaped block-FP8 random checkpoint and its dequantised bf16 twin
   (random_checkpoint.py --fp8-block --dequantized-twin; the folders bench_serving_gpu.py
   --preset qwen3-8b reuses), through ModelRunner with CUDA graphs. The twin generates
   greedily; the FP8 checkpoint and the twin under --quantization fp8 replay its tokens
   (teacher forcing) and report the greedy-token agreement, the twin's top-2 margin where they
   disagree, and |logprob difference| of the twin's tokens.

    PYTHONPATH=python:. python benchmark/gpu_fp8_check.py --out $OUT --tokenizer .carry_engine/tokenizer
    (--only gemm / --only model split it over two calls; --layers N for a shorter model check)
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "test"))
sys.path.insert(0, str(ROOT / "benchmark"))

from bench_serving_gpu import ensure_checkpoint  # noqa: E402
from runner_utils import Driver  # noqa: E402

from sgl_kernel_ext.gemm.fp8_block_triton import GROUP, fp8_linear_triton  # noqa: E402
from sgl_kernel_ext.gemm.fp8_reference import (  # noqa: E402
    fp8_linear_reference,
    quantize_weight_blocks,
    quantize_weight_rows,
)
from sglang.srt.layers.quantization import fp8_gemm  # noqa: E402
from sglang.srt.model_executor.model_runner import ModelRunner  # noqa: E402

# Qwen3-8B's linears: name -> (N, K).
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
ROWS = (1, 64, 256)
BLOCK = (128, 128)
KERNEL_TOL = 2e-2  # max |kernel - reference| / max |reference|: bf16 output rounding and sum order
# A greedy disagreement where the twin's top-2 margin is larger than this is not rounding.
MARGIN_TOL = 0.5
LOGPROB_MEAN_TOL = 0.1  # mean |logprob of the twin's token, FP8 - twin|
PROMPTS, PROMPT_LEN, NEW_TOKENS = 8, 48, 32


def graph_time_ms(fn: Callable[[], torch.Tensor], iters: int = 50, reps: int = 5) -> float:
    """Median ms per call of `fn`, replayed from one CUDA graph of `iters` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()  # compiles the Triton kernels outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def gemm_check() -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows_out, failures = [], []
    for name, (n, k) in SHAPES.items():
        weight = torch.randn(n, k, generator=gen, device="cuda") * 0.02
        bf16 = weight.to(torch.bfloat16)
        row_codes, row_scale = quantize_weight_rows(weight)
        block_codes, block_scale = quantize_weight_blocks(weight, BLOCK)
        row_block = (1, -(-k // GROUP) * GROUP)
        for m in ROWS:
            x = torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16)
            kernels = {
                "bf16": lambda: F.linear(x, bf16),
                "triton_rowwise": lambda: fp8_linear_triton(x, row_codes, row_scale.view(-1, 1), row_block),
                "scaled_mm_rowwise": lambda: fp8_gemm.scaled_mm_rowwise(x, row_codes, row_scale, None),
                "triton_block": lambda: fp8_linear_triton(x, block_codes, block_scale, BLOCK),
            }
            refs = {
                "triton_rowwise": fp8_linear_reference(x, row_codes, row_scale, None, GROUP),
                "scaled_mm_rowwise": fp8_linear_reference(x, row_codes, row_scale, None, k),
                "triton_block": fp8_linear_reference(x, block_codes, block_scale, BLOCK, GROUP),
            }
            record = {"shape": name, "N": n, "K": k, "M": m}
            for kernel, fn in kernels.items():
                if kernel in refs:
                    err = rel_error(fn(), refs[kernel])
                    record[f"{kernel}_rel_err"] = err
                    if err > KERNEL_TOL:
                        failures.append(f"{kernel} {name} M={m}: relative error {err:.3g}")
                record[f"{kernel}_ms"] = graph_time_ms(fn)
            rows_out.append(record)
            print("  " + "  ".join(f"{key}={val:.4g}" if isinstance(val, float) else f"{key}={val}"
                                   for key, val in record.items()), flush=True)
    return {"records": rows_out, "failures": failures, **rule_verdict(rows_out)}


def rule_verdict(records: list[dict]) -> dict:
    """Per M, the four linears' summed times; the threshold they give; whether the code's rule
    picks the faster kernel at every M."""
    totals = {m: {kernel: sum(r[f"{kernel}_ms"] for r in records if r["M"] == m)
                  for kernel in ("bf16", "triton_rowwise", "scaled_mm_rowwise", "triton_block")} for m in ROWS}
    suggested = 0
    for m in ROWS:
        if totals[m]["triton_rowwise"] >= totals[m]["scaled_mm_rowwise"]:
            break
        suggested = m
    faster = {m: "triton" if totals[m]["triton_rowwise"] < totals[m]["scaled_mm_rowwise"] else "scaled_mm" for m in ROWS}
    picked = {m: fp8_gemm.rowwise_backend(m, 4096, 4096) for m in ROWS}
    return {"layer_totals_ms": totals, "faster_rowwise": faster, "rule_picks": picked,
            "rule_threshold": fp8_gemm.ROWWISE_TRITON_MAX_ROWS, "suggested_threshold": suggested,
            "rule_agrees": faster == picked}


def make_prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 150000, (PROMPT_LEN + i,), generator=gen).tolist() for i in range(PROMPTS)]


def run_model(path: str, quantization: Optional[str], forced: Optional[list[list[int]]]) -> dict:
    """Greedy tokens (or `forced` ones) for every prompt; per step the argmax, the chosen (or
    forced) token's logprob and the top-2 margin."""
    runner = ModelRunner(path, device="cuda", max_total_tokens=PROMPTS * (PROMPT_LEN + PROMPTS + NEW_TOKENS + 8),
                         max_running_requests=PROMPTS, cuda_graph_max_bs=PROMPTS,
                         piecewise_cuda_graph_max_tokens=PROMPTS * (PROMPT_LEN + PROMPTS), quantization=quantization)
    driver = Driver(runner)
    prompts = make_prompts()
    reqs = [driver.new_req() for _ in prompts]
    steps = {"argmax": [], "logprob": [], "margin": []}
    logits = driver.extend(reqs, prompts).next_token_logits
    for step in range(NEW_TOKENS):
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # [B, V]
        top2 = logprobs.topk(2, dim=-1).values
        argmax = logprobs.argmax(dim=-1)
        tokens = argmax if forced is None else torch.tensor([f[step] for f in forced], device="cuda")
        steps["argmax"].append(argmax.tolist())
        steps["logprob"].append(logprobs.gather(1, tokens[:, None])[:, 0].tolist())
        steps["margin"].append((top2[:, 0] - top2[:, 1]).tolist())
        if step + 1 < NEW_TOKENS:
            logits = driver.decode(reqs, tokens.tolist())
    driver.release()
    del driver, runner
    gc.collect()
    torch.cuda.empty_cache()
    return steps


def compare(twin: dict, other: dict) -> dict:
    agree, total, worst_margin, diffs = 0, 0, 0.0, []
    for step in range(NEW_TOKENS):
        for b in range(PROMPTS):
            total += 1
            if twin["argmax"][step][b] == other["argmax"][step][b]:
                agree += 1
            else:
                worst_margin = max(worst_margin, twin["margin"][step][b])
            diffs.append(abs(twin["logprob"][step][b] - other["logprob"][step][b]))
    mean_diff = statistics.mean(diffs)
    return {"agreement": agree / total, "tokens": total, "max_twin_margin_at_disagreement": worst_margin,
            "logprob_diff_mean": mean_diff, "logprob_diff_max": max(diffs),
            "ok": worst_margin <= MARGIN_TOL and mean_diff <= LOGPROB_MEAN_TOL}


def model_check(args: argparse.Namespace) -> dict:
    t0 = time.monotonic()
    ensure_checkpoint(args.twin, args.tokenizer, args.layers, "qwen3-8b", args.fp8)
    torch.cuda.empty_cache()
    print(f"checkpoints ready in {time.monotonic() - t0:.0f} s", flush=True)
    twin = run_model(args.twin, None, None)
    forced = [[twin["argmax"][s][b] for s in range(NEW_TOKENS)] for b in range(PROMPTS)]
    out = {}
    for label, path, quant in (("fp8_checkpoint", args.fp8, None), ("fp8_online", args.twin, "fp8")):
        out[label] = compare(twin, run_model(path, quant, forced))
        print(f"  {label} vs the bf16 twin: {out[label]}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("/tmp/gpu_fp8_out"))
    p.add_argument("--tokenizer", default=".carry_engine/tokenizer")
    p.add_argument("--twin", default="/tmp/qwen3-8b-bf16", help="the dequantised bf16 twin (bench_serving_gpu's --checkpoint)")
    p.add_argument("--fp8", default="/tmp/qwen3-8b-bf16-fp8", help="the block-FP8 checkpoint")
    p.add_argument("--layers", type=int, help="fewer layers than Qwen3-8B's 36")
    p.add_argument("--only", choices=("gemm", "model"))
    args = p.parse_args()
    print(f"{torch.cuda.get_device_name(0)} | torch {torch.__version__}", flush=True)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    if args.only in (None, "gemm"):
        print("1. FP8 GEMMs of Qwen3-8B's linears", flush=True)
        result["gemm"] = gemm_check()
        g = result["gemm"]
        print(f"layer totals (ms) per M: {json.dumps(g['layer_totals_ms'])}", flush=True)
        print(f"rule: ROWWISE_TRITON_MAX_ROWS = {g['rule_threshold']}; the measurements give {g['suggested_threshold']}; "
              f"rule picks the faster kernel at every M: {g['rule_agrees']}", flush=True)
    if args.only in (None, "model"):
        print("2. block-FP8 Qwen3-8B-shaped checkpoint and --quantization fp8 against the dequantised bf16 twin", flush=True)
        result["model"] = model_check(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_fp8_check.json").write_text(json.dumps(result, indent=1) + "\n")
    failed = result.get("gemm", {}).get("failures", []) + [
        f"{label}: {r}" for label, r in result.get("model", {}).items() if not r["ok"]]
    print("\nFAILED:\n  " + "\n  ".join(failed) if failed else "\nall FP8 checks passed", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
