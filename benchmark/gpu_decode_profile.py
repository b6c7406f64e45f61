"""Where a captured decode step's GPU time goes (issue 40 item 3): kernel by kernel, inside the
graph replay, on a random-weight Qwen3-0.6B-shaped bf16 checkpoint.

For each batch size: the decode graph's replay time (CUDA events over many replays), the kernels
one replay runs (torch.profiler / CUPTI sees the kernels inside a graph) summed by name and by
kind (GEMM, attention, norm, RoPE + KV store, activation, sampling, other), and the replay's time
not covered by any kernel (launch and dependency gaps between consecutive kernels). The decode
graph followed by the sampling graph is timed too, with the benchmark's mixed sampling list, since
a serving step runs both. Then every linear of one layer and the LM head alone, through the
library GEMM, in a graph that rotates over enough weight copies to defeat the L2: achieved
GB/s against the device's copy bandwidth.

    python benchmark/gpu_decode_profile.py --out $OUT --tokenizer .carry_engine/tokenizer --bs 1 64

Other shapes (--preset, dummy weights drawn at load; --quantization fp8 for online FP8 weights):

    python benchmark/gpu_decode_profile.py --out $OUT --tokenizer .carry_engine/tokenizer --bs 1 \
        --preset qwen3-30b-a3b --checkpoint /tmp/qwen3-30b-a3b-dummy --linear-rows --tag _moe
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import re
import sys
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "test"))
sys.path.insert(0, str(ROOT / "benchmark"))

from bench_serving import SAMPLING  # noqa: E402
from bench_serving_gpu import copy_bandwidth, ensure_checkpoint  # noqa: E402
from gpu_timing import gpu_ms, graph_us  # noqa: E402
from random_checkpoint import write_qwen3_checkpoint  # noqa: E402
from runner_utils import Driver  # noqa: E402
from sampling_utils import make_info  # noqa: E402

from sglang.srt.model_executor.model_runner import ModelRunner  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

# Kernel kinds by name pattern, first match wins.
KINDS = (
    ("gemm", re.compile(r"gemm|gemv|cutlass|nvjet|sm90_|cublas|splitK|_fp8_|matmul", re.I)),
    ("attention", re.compile(r"_split_kernel|_merge_kernel|decode_attention|attn", re.I)),
    ("norm", re.compile(r"rmsnorm|norm", re.I)),
    ("rope_store", re.compile(r"rope", re.I)),
    ("activation", re.compile(r"silu|gelu|act", re.I)),
    ("sampling", re.compile(r"sample|topk|top_k|penalt|softmax|_select|argmax|gumbel|hash", re.I)),
)


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if pattern.search(name)), "other")


def kernel_table(run, replays: int = 20) -> tuple[list[dict], float]:
    """Kernels of `replays` calls of run(): per name (count and time per call), and the summed
    kernel time per call in ms."""
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            run()
        torch.cuda.synchronize()
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and "memcpy" not in event.name.lower():
            by_name[event.name].append(event.device_time_total / 1e3)  # ms
    rows = [dict(name=name, kind=kind_of(name), per_call=len(times) / replays, ms_per_call=sum(times) / replays,
                 us_each=1e3 * sum(times) / len(times)) for name, times in by_name.items()]
    rows.sort(key=lambda r: -r["ms_per_call"])
    return rows, sum(r["ms_per_call"] for r in rows)


def summarise(label: str, rows: list[dict], kernel_ms: float, wall_ms: float) -> dict:
    kinds: dict[str, dict] = collections.defaultdict(lambda: dict(count=0.0, ms=0.0))
    for r in rows:
        kinds[r["kind"]]["count"] += r["per_call"]
        kinds[r["kind"]]["ms"] += r["ms_per_call"]
    count = sum(k["count"] for k in kinds.values())
    # Kernels launched with PDL start before the one ahead of them ends and wait inside: their
    # times then include that wait, they sum to more than the replay, and the gap is an overlap.
    gap = wall_ms - kernel_ms
    gap_text = f"gaps {gap:.3f} ms" if gap >= 0 else f"overlap {-gap:.3f} ms (PDL: times include waits)"
    print(f"--- {label}: replay {wall_ms:.3f} ms, kernels {kernel_ms:.3f} ms in {count:.0f} launches, "
          f"{gap_text} ({abs(gap) / max(count, 1) * 1e3:.2f} us per launch)")
    for kind, k in sorted(kinds.items(), key=lambda kv: -kv[1]["ms"]):
        print(f"  {kind:11s} {k['count']:6.0f} launches {k['ms']:.3f} ms ({k['ms'] / k['count'] * 1e3:.2f} us each)")
    for r in rows[:24]:
        print(f"    {r['ms_per_call']:.4f} ms {r['per_call']:5.0f}x {r['us_each']:7.2f} us  {r['name'][:90]}")
    return dict(label=label, replay_ms=wall_ms, kernel_ms=kernel_ms, launches=count, kinds=dict(kinds), kernels=rows[:40])


def make_runner(folder: str, dummy: bool = False, quantization: Optional[str] = None,
                max_bs: int = 256) -> ModelRunner:
    return ModelRunner(folder, device="cuda", dtype="bfloat16", max_total_tokens=200000, max_running_requests=300,
                       cuda_graph_max_bs=max_bs, sampling_backend="triton", load_format="dummy" if dummy else "auto",
                       quantization=quantization)


@torch.inference_mode()
def profile_steps(runner: ModelRunner, batch_sizes: list[int], context: int) -> list[dict]:
    graphs, records = runner.cuda_graph_runner, []
    for bs in batch_sizes:
        driver = Driver(runner)
        reqs = [driver.new_req() for _ in range(bs)]
        for start in range(0, bs, 32):
            driver.extend(reqs[start:start + 32], [[5] * context] * len(reqs[start:start + 32]))
        driver.decode(reqs, [7] * bs)  # the graph's buffers now hold this batch
        params = [SamplingParams(**SAMPLING[i % len(SAMPLING)]) for i in range(bs)]
        info = make_info(params, runner.vocab_size, device="cuda", prompts=[[5] * context] * bs)
        gen = torch.Generator(device="cuda").manual_seed(0)
        decode = graphs.graphs[bs]

        def step() -> None:
            decode.replay()
            graphs.replay_sampling(info, bs, gen)

        decode_ms, step_ms = gpu_ms(decode.replay), gpu_ms(step)
        rows, kernel_ms = kernel_table(decode.replay)
        record = summarise(f"decode graph, bs {bs}, context {context}", rows, kernel_ms, decode_ms)
        rows, kernel_ms = kernel_table(step)
        record["with_sampling"] = summarise(f"decode + sampling graphs, bs {bs}", rows, kernel_ms, step_ms)
        record["bs"] = bs
        records.append(record)
        driver.release()
    return records


@torch.inference_mode()
def linear_bandwidth(runner: ModelRunner, rows_list: list[int], copy_gbs: float) -> list[dict]:
    """Each distinct linear of layer 0 and the LM head through F.linear, rotating over weight
    copies that together exceed the L2, in one graph: us per call and achieved GB/s."""
    layer = runner.model.model.layers[0]
    weights = {
        "qkv_proj": layer.self_attn.qkv_proj.weight, "o_proj": layer.self_attn.o_proj.weight,
        "gate_up_proj": layer.mlp.gate_up_proj.weight, "down_proj": layer.mlp.down_proj.weight,
        "lm_head": runner.model.lm_head.weight,
    }
    out = []
    for name, weight in weights.items():
        nbytes = weight.numel() * weight.element_size()
        copies = [weight.clone() for _ in range(max(2, -(-256 * 2**20 // nbytes)))]  # >= 256 MiB together
        for rows in rows_list:
            x = torch.randn(rows, weight.shape[1], dtype=weight.dtype, device="cuda")  # [M, K]
            us = graph_us([functools.partial(F.linear, x, w) for w in copies])
            gbs = nbytes / (us * 1e-6) / 1e9
            out.append(dict(name=name, shape=list(weight.shape), rows=rows, us=us, gbs=gbs, of_copy=gbs / copy_gbs))
            print(f"  {name:13s} {str(list(weight.shape)):14s} M={rows:3d}: {us:7.2f} us  {gbs:6.0f} GB/s "
                  f"({gbs / copy_gbs:.0%} of copy)")
        del copies
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("/tmp/decode_profile"))
    parser.add_argument("--checkpoint", default="/tmp/qwen3-0.6b-random")
    parser.add_argument("--tokenizer", help="tokenizer folder copied into a new checkpoint")
    parser.add_argument("--bs", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--linear-rows", type=int, nargs="*", default=[1, 8, 64],
                        help="rows of the linears-alone table (dense Qwen3 layers only; none: no table)")
    parser.add_argument("--preset", help="a bench_serving_gpu.py preset served with dummy weights (config.json only) "
                        "in --checkpoint, instead of the written 0.6B checkpoint")
    parser.add_argument("--quantization", help="the runner's --quantization (e.g. fp8: online FP8 weights)")
    parser.add_argument("--tag", default="", help="suffix of the JSON record's name")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.preset:
        ensure_checkpoint(args.checkpoint, args.tokenizer, None, args.preset, dummy=True)
    elif not Path(args.checkpoint, "config.json").exists():
        write_qwen3_checkpoint(args.checkpoint, args.tokenizer, device="cuda")
    copy_gbs = copy_bandwidth("cuda", 1 << 30) / 1e9
    print(f"{torch.cuda.get_device_name()}: device-to-device copy {copy_gbs:.0f} GB/s (read + write)")
    runner = make_runner(args.checkpoint, bool(args.preset), args.quantization, max(256, *args.bs))
    result = dict(device=torch.cuda.get_device_name(), copy_gbs=copy_gbs, preset=args.preset or "qwen3-0.6b",
                  quantization=args.quantization, steps=profile_steps(runner, args.bs, args.context))
    if args.linear_rows:
        print("--- linears alone (library GEMM)")
        result["linears"] = linear_bandwidth(runner, args.linear_rows, copy_gbs)
    (args.out / f"decode_profile{args.tag}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
