"""Micro-benchmark of the CPU block-quant linear (sgl_kernel_ext/gemm/block_quant_linear.c) at
decode sizes, on the embedded model's own weights (SmolLM2-135M: Q4_1 projections, Q8_0 LM
head), beside oneDNN's float32 matmul of the same weights, which is what runs without the
kernel, in the same run.

hot: one layer's weight every call (it stays in cache); cold: the 30 layers' weights in turn, as
a decode step reads them (from memory). Median microseconds per call, the CPU other processes
took meanwhile, JSON and a plot under benchmark/results/.

    .venv/bin/python benchmark/bench_block_quant.py [--rows 1 2 4 16] [--threads 1 2] [--tag cpu]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm import tqdm

from bench_serving import OutsideLoad, header_line, run_header, write_results
from sglang.srt.layers.linear import dense_matmul
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.utils.embedded_model import embedded_model_path
from sgl_kernel_ext.gemm.block_quant_linear import block_quant_linear

PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
CALLS = 200  # timed calls per (weight, rows, threads, placement); the LM head gets a tenth


def model_weights() -> dict[str, list[tuple[Any, torch.Tensor]]]:
    """name -> [(integer blocks, oneDNN-packed float32 weight)], one entry per layer."""
    model = ModelRunner(embedded_model_path(), max_running_requests=1, max_total_tokens=64).model
    weights = {}
    for name in PROJECTIONS:
        linears = [getattr(layer.self_attn if name in ("qkv_proj", "o_proj") else layer.mlp, name)
                   for layer in model.model.layers]
        weights[name] = [(linear.block_weight, linear.weight) for linear in linears]
    head = model.lm_head
    weights["lm_head"] = [(head._blocks, head._packed if head._packed is not None else head.weight)]
    return weights


def time_calls(call: Callable[[int], torch.Tensor], count: int, per_call: int) -> float:
    """Median microseconds of call(i) for i in 0..per_call-1, cycling `count` weights."""
    for i in range(min(count, 5)):
        call(i)
    times = []
    for i in range(per_call):
        start = time.perf_counter()
        call(i % count)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def measure(weights: dict, rows_list: list[int], threads_list: list[int]) -> list[dict[str, Any]]:
    records = []
    cases = [(n, r, t) for n in weights for r in rows_list for t in threads_list]
    with tqdm(total=len(cases) * 2, desc="block-quant linear", unit="case") as bar:
        for name, rows, threads in cases:
            torch.set_num_threads(threads)
            entries = weights[name]
            blocks0, dense0 = entries[0]
            x = torch.randn(rows, blocks0.in_features)
            calls = CALLS if name != "lm_head" else CALLS // 10
            for kernel, fn in (("block_quant", lambda i: block_quant_linear(x, entries[i][0])),
                               ("onednn_f32", lambda i: dense_matmul(x, entries[i][1]))):
                with OutsideLoad() as outside:
                    hot = time_calls(lambda i: fn(0), 1, calls)
                    cold = time_calls(fn, len(entries), calls) if len(entries) > 1 else hot
                records.append({
                    "weight": name, "shape": [blocks0.out_features, blocks0.in_features], "bits": blocks0.bits,
                    "rows": rows, "threads": threads, "kernel": kernel, "hot_us": round(hot, 1),
                    "cold_us": round(cold, 1), "outside_load_cpu_s": round(outside.cpu_s, 2),
                })
                bar.update(1)
    return records


def markdown_table(records: list[dict]) -> str:
    by_key = {(r["weight"], r["rows"], r["threads"], r["kernel"]): r for r in records}
    lines = ["| weight | rows | threads | block-quant hot / cold us | oneDNN f32 hot / cold us | cold speed-up |",
             "|---|---|---|---|---|---|"]
    for (name, rows, threads, kernel), r in by_key.items():
        if kernel != "block_quant":
            continue
        dense = by_key[(name, rows, threads, "onednn_f32")]
        lines.append(f"| {name} {r['shape'][0]}x{r['shape'][1]} | {rows} | {threads} | {r['hot_us']:.1f} / "
                     f"{r['cold_us']:.1f} | {dense['hot_us']:.1f} / {dense['cold_us']:.1f} | "
                     f"{dense['cold_us'] / r['cold_us']:.2f}x |")
    return "\n".join(lines)


def plot(records: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["weight"] for r in records))
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.4))
    for ax, name in zip(axes, names):
        for kernel, colour in (("block_quant", "tab:green"), ("onednn_f32", "tab:grey")):
            for threads, style in ((1, ":"), (2, "-")):
                pts = [r for r in records if r["weight"] == name and r["kernel"] == kernel and r["threads"] == threads]
                if pts:
                    ax.plot([p["rows"] for p in pts], [p["cold_us"] for p in pts], style, color=colour, marker="o",
                            label=f"{kernel}, {threads} thr")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("rows")
        ax.set_yscale("log")
    axes[0].set_ylabel("us per call, cold (lower is better)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 16])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tag", default="cpu", help="Results go to benchmark/results/block_quant_<tag>.json/.png.")
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    records = measure(model_weights(), args.rows, args.threads)
    result = {**run_header(started), "records": records}
    out = write_results(result, f"block_quant_{args.tag}", plot)
    print(header_line(result))
    print(markdown_table(records))
    print(f"wrote {out} and .png")


if __name__ == "__main__":
    main()
