"""Tile sweeps and a profile of the decode kernels the FP8 and MoE models spend their steps in
(run through the device tool; prints one JSON line per record and a summary):

1. fp8: Qwen3-8B's linears with 128x128 block-FP8 weights at M = 1 ... 256: bf16 F.linear,
   the W8A8 Triton kernel, block-wise torch._scaled_mm; errors against the reference, achieved
   GB/s of weight read.
2. moe: Qwen3-30B-A3B's experts (128 experts, top-8, hidden 2048, intermediate 768) in bf16:
   each GEMV kernel at N = 1 and 8 and the grouped GEMM at N = 64 and 256 over their tiles;
   the whole MoE block (router, routing, experts) replayed from a CUDA graph, GEMV path on and
   off; a torch.profiler table of the block's kernels at N = 1, 64, 256.

    PYTHONPATH=python:. python benchmark/gpu_kernel_sweep.py --out $OUT [--only fp8|moe]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmark"))

from gpu_fp8_check import SHAPES, graph_time_ms  # noqa: E402
from gpu_timing import graph_us  # noqa: E402

from sgl_kernel_ext.gemm import fp8_block_triton as block_mod  # noqa: E402
from sgl_kernel_ext.gemm.fp8_reference import fp8_linear_reference, quantize_weight_blocks  # noqa: E402
from sgl_kernel_ext.moe import fused_moe_gemv as moe_gemv  # noqa: E402
from sgl_kernel_ext.moe import fused_moe_triton as moe_grouped  # noqa: E402
from sgl_kernel_ext.moe.align import align_to_blocks  # noqa: E402
from sgl_kernel_ext.triton_launch import launch  # noqa: E402
from sglang.srt.layers.moe.sparse_block import SparseMoeBlock  # noqa: E402
from sglang.srt.layers.quantization import fp8_gemm  # noqa: E402
from sglang.srt.layers.moe.topk import TopKConfig  # noqa: E402

BLOCK = (128, 128)
EXPERTS, TOP_K, HIDDEN, INTER = 128, 8, 2048, 768


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def fp8_sweep() -> dict:
    """Qwen3-8B's four linears per M: bf16, the W8A8 Triton kernel, block-wise torch._scaled_mm."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = {}
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, generator=gen, device="cuda") * 0.02
        weights[name] = (w.to(torch.bfloat16),) + quantize_weight_blocks(w, BLOCK)
    weight_bytes = sum(c.numel() for _, c, _ in weights.values())
    summary = {}
    for m in (1, 4, 16, 17, 64, 256):
        totals = {"bf16": 0.0, "w8a8_triton": 0.0, "scaled_mm_blockwise": 0.0}
        errors = {}
        for name, (bf16, codes, scale) in weights.items():
            x = torch.randn(m, codes.shape[1], generator=gen, device="cuda").to(torch.bfloat16)
            ref = fp8_linear_reference(x, codes, scale, BLOCK, 128).float()
            fns = {"bf16": lambda: F.linear(x, bf16),
                   "w8a8_triton": lambda: block_mod.fp8_linear_triton(x, codes, scale, BLOCK),
                   "scaled_mm_blockwise": lambda: fp8_gemm.scaled_mm_blockwise(x, codes, scale)}
            for key, fn in fns.items():
                if key != "bf16":
                    errors[f"{name}_{key}"] = ((fn().float() - ref).abs().max() / ref.abs().max()).item()
                totals[key] += graph_time_ms(fn)
        summary[m] = {**{f"{key}_ms": v for key, v in totals.items()}, "max_rel_err": max(errors.values()),
                      "fp8_GBps": weight_bytes / min(totals["w8a8_triton"], totals["scaled_mm_blockwise"]) / 1e6,
                      "bf16_GBps": 2 * weight_bytes / totals["bf16"] / 1e6}
        emit({"part": "fp8_total", "M": m, **summary[m]})
    return summary


def _moe_inputs(n: int, gen: torch.Generator):
    x = torch.randn(n, HIDDEN, generator=gen, device="cuda").to(torch.bfloat16)
    logits = torch.randn(n, EXPERTS, generator=gen, device="cuda")
    weights, ids = torch.topk(torch.softmax(logits, -1), TOP_K, -1)
    return x, weights.float(), ids.to(torch.int32)


def _moe_weights(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    w13 = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen, device="cuda") * HIDDEN**-0.5).to(torch.bfloat16)
    w2 = (torch.randn(EXPERTS, HIDDEN, INTER, generator=gen, device="cuda") * INTER**-0.5).to(torch.bfloat16)
    return w13, w2


def moe_sweep(part: str = "all") -> dict:
    """`part`: all (GEMV and grouped tiles, then the block), gemv or grouped (that sweep alone)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    w13, w2 = _moe_weights(gen)
    summary = moe_gemv_sweep(w13, w2, gen) if part in ("all", "gemv") else {}
    if part in ("all", "grouped"):
        summary.update(moe_grouped_sweep(w13, w2, gen))
    if part == "all":
        summary["block"] = moe_block_times()
    return summary


def moe_grouped_sweep(w13: torch.Tensor, w2: torch.Tensor, gen: torch.Generator) -> dict:
    """The grouped GEMM (gate_up and down) over its tiles at N = 64 and 256 tokens."""
    summary = {}
    for n in (64, 256):
        x, weights, ids = _moe_inputs(n, gen)
        results = {}
        for bm, bn, bk, warps, stages in itertools.product((16, 32, 64), (64, 128), (64, 128), (4, 8), (3, 4)):
            try:
                results[(bm, bn, bk, warps, stages)] = graph_time_ms(
                    _moe_grouped_call(x, w13, w2, weights, ids, bm, bn, bk, warps, stages), iters=10, reps=3)
            except Exception as exc:  # noqa: BLE001  (a tile that does not fit is skipped)
                emit({"part": "moe_grouped_skip", "config": [bm, bn, bk, warps, stages], "error": str(exc)[:120]})
        best = min(results, key=results.get)
        default = graph_time_ms(lambda: moe_grouped.fused_experts_triton(x, w13, w2, weights, ids))
        summary[f"grouped_N{n}"] = {"default_ms": default, "best_config": best, "best_ms": results[best]}
        emit({"part": "moe_grouped", "N": n, **summary[f"grouped_N{n}"]})
    return summary


def moe_gemv_sweep(w13: torch.Tensor, w2: torch.Tensor, gen: torch.Generator) -> dict:
    """Each GEMV kernel alone over its tiles at N = 1 and 8 tokens, in a graph over 16 routings
    (different experts each: the weights do not stay in L2); us per call and GB/s of weight read."""
    summary = {}
    tiles = [moe_gemv.GemvTile(bn, bk, warps, 1) for bn, bk, warps in itertools.product((2, 4, 8, 16), (256, 512, 1024), (4, 8))]
    for n in (1, 8):
        routings = [_moe_inputs(n, gen) for _ in range(16)]
        act = torch.randn(n * TOP_K, INTER, generator=gen, device="cuda").to(torch.bfloat16)
        out = torch.empty(n, HIDDEN, dtype=torch.bfloat16, device="cuda")
        experts = sum(len(set(ids.flatten().tolist())) for _, _, ids in routings) / len(routings)
        kernels = {
            "gate_up": (lambda x, w, ids, tile: moe_gemv.gate_up_gemv(x, w13, act, ids.reshape(-1), TOP_K, tile),
                        experts * w13[0].numel() * 2, moe_gemv.GATE_UP_TILES),
            "down": (lambda x, w, ids, tile: moe_gemv.down_gemv(act, w2, out, w.reshape(-1), ids.reshape(-1), TOP_K, tile),
                     experts * w2[0].numel() * 2, (moe_gemv.DOWN_TILE,) * 2),
        }
        for name, (run, nbytes, defaults) in kernels.items():
            results = {}
            for tile in tiles:
                if name == "down" and TOP_K * tile.block_n * tile.block_k > moe_gemv.DOWN_ACC_MAX:
                    continue  # the [k, BN, BK] float32 accumulator would not fit the registers
                try:
                    results[tile] = graph_us([functools.partial(run, *r, tile) for r in routings])
                except Exception as exc:  # noqa: BLE001  (a tile that does not compile or fit is left out)
                    emit({"part": "moe_gemv_skip", "kernel": name, "tile": list(tile), "error": str(exc)[:120]})
            best = min(results, key=results.get)
            default = defaults[n * TOP_K > moe_gemv.FEW_PAIRS]
            record = {"kernel": name, "N": n, "best_tile": list(best), "best_us": results[best],
                      "best_GBps": nbytes / results[best] / 1e3, "default_tile": list(default),
                      "default_us": results.get(default), "all": {",".join(map(str, t)): round(us, 2) for t, us in results.items()}}
            summary[f"{name}_N{n}"] = record
            emit({"part": "moe_gemv", **record})
    return summary


def _moe_grouped_call(x, w13, w2, weights, ids, bm, bn, bk, warps, stages):
    n, k = ids.shape
    blocks = align_to_blocks(ids, EXPERTS, bm)
    flags = moe_grouped.dot_flags(x.dtype)
    act = torch.empty(n * k, INTER, dtype=x.dtype, device=x.device)
    out = torch.zeros(n * k, HIDDEN, dtype=x.dtype, device=x.device)
    flat_w = weights.reshape(-1).contiguous()
    nblocks = blocks.block_expert.shape[0]
    cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, **flags)

    def call():
        launch(moe_grouped._gate_up_kernel, (nblocks * triton.cdiv(INTER, bn),), x, w13, act, blocks.sorted_pairs,
               blocks.block_expert, n * k, k, EXPERTS, HIDDEN, INTER, x.stride(0), w13.stride(0), w13.stride(1),
               act.stride(0), **cfg, num_warps=warps, num_stages=stages, pdl=True)
        launch(moe_grouped._down_kernel, (nblocks * triton.cdiv(HIDDEN, bn),), act, w2, out, flat_w,
               blocks.sorted_pairs, blocks.block_expert, n * k, EXPERTS, HIDDEN, INTER, act.stride(0), w2.stride(0),
               w2.stride(1), out.stride(0), **cfg, num_warps=warps, num_stages=stages, pdl=True)
        return out

    return call


def moe_block_times() -> dict:
    block = SparseMoeBlock(HIDDEN, EXPERTS, INTER, TopKConfig(TOP_K, True), params_dtype=torch.bfloat16).cuda()
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.02)
    times = {}
    for n in (1, 8, 64, 256):
        x = torch.randn(n, HIDDEN, device="cuda").to(torch.bfloat16)
        times[n] = {"gemv_on_ms": graph_time_ms(lambda: block(x))}
        saved, moe_gemv.GEMV_MAX_PAIRS = moe_gemv.GEMV_MAX_PAIRS, 0
        times[n]["gemv_off_ms"] = graph_time_ms(lambda: block(x))
        moe_gemv.GEMV_MAX_PAIRS = saved
        emit({"part": "moe_block", "N": n, **times[n]})
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                block(x)
            torch.cuda.synchronize()
        print(f"--- MoE block kernels, N={n}, 10 calls (eager) ---")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14), flush=True)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("/tmp/gpu_sweep_out"))
    p.add_argument("--only", choices=("fp8", "moe"))
    p.add_argument("--no-moe-sweep", action="store_true", help="moe: only the block times and profile")
    p.add_argument("--moe-part", choices=("all", "gemv", "grouped"), default="all",
                   help="moe: both tile sweeps and the block, or one tile sweep alone")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name()}
    if args.only in (None, "fp8"):
        result["fp8"] = fp8_sweep()
    if args.only in (None, "moe"):
        result["moe"] = {"block": moe_block_times()} if args.no_moe_sweep else moe_sweep(args.moe_part)
    (args.out / "gpu_kernel_sweep.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
