"""Skinny matmuls at decode batch sizes: the library GEMM (F.linear) against gemv_triton, with a
tile sweep (issue 40 item 3: the N=1 step is mostly GEMM time).

Each measurement is one CUDA graph that runs the matmul over enough copies of the weight to
exceed the L2 (>= 256 MiB together), replayed; time per matmul and achieved GB/s of weight read
against the device's copy bandwidth. The gate/up projection is timed both ways a layer can run
it: the GEMM then silu * up (two launches), and gemv_triton's fused silu_mul (one).

    python benchmark/bench_gemv.py --out-dir $OUT                      # Qwen3-0.6B's linears
    python benchmark/bench_gemv.py --shapes 6144x4096 4096x4096 24576x4096 4096x12288   # Qwen3-8B
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving_gpu import copy_bandwidth  # noqa: E402
from gpu_timing import graph_us  # noqa: E402

from sgl_kernel_ext.activation.silu_mul_triton import silu_mul_triton  # noqa: E402
from sgl_kernel_ext.gemm.gemv_reference import gemv_reference  # noqa: E402
from sgl_kernel_ext.gemm.gemv_triton import gemv_tile, gemv_triton  # noqa: E402

# N x K of Qwen3-0.6B's qkv, o, gate_up (fused with silu), down, and the LM head.
DEFAULT_SHAPES = ("4096x1024", "1024x2048", "6144x1024:silu", "1024x3072", "151936x1024")
TILES = [t for t in itertools.product((4, 8, 16), (256, 512, 1024), (4, 8), (1, 3)) if t[0] * t[1] <= 8192]


def run_shape(spec: str, rows_list: list[int], copy_gbs: float, sweep: bool) -> list[dict]:
    shape, _, mode = spec.partition(":")
    n, k = map(int, shape.split("x"))
    silu = mode == "silu"
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02  # [N, K]
    nbytes = weight.numel() * 2
    weights = [weight] + [weight.clone() for _ in range(max(1, -(-256 * 2**20 // nbytes)) - 1)]
    out_n = n // 2 if silu else n
    records = []
    for rows in rows_list:
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)  # [M, K]
        library = (lambda w: silu_mul_triton(F.linear(x, w))) if silu else (lambda w: F.linear(x, w))
        lib_us = graph_us([functools.partial(library, w) for w in weights])
        want = gemv_reference(x, weight, silu_mul=silu)
        default = gemv_tile(out_n, k)
        tiles = sorted(set(TILES) | {default}) if sweep else [default]
        results = []
        for tile in tiles:
            got = gemv_triton(x, weight, silu_mul=silu, tile=tile)
            err = float((got.float() - want.float()).abs().max())
            us = graph_us([functools.partial(gemv_triton, x, w, silu_mul=silu, tile=tile) for w in weights])
            results.append(dict(tile=list(tile), us=us, gbs=nbytes / us / 1e3, max_abs_err=err))
        best = min(results, key=lambda r: r["us"])
        chosen = next(r for r in results if tuple(r["tile"]) == default)
        lib_gbs = nbytes / lib_us / 1e3
        print(f"{spec:>15s} M={rows}: library {lib_us:7.2f} us ({lib_gbs / copy_gbs:4.0%})  gemv default "
              f"{chosen['us']:7.2f} us ({chosen['gbs'] / copy_gbs:4.0%}) {tuple(chosen['tile'])}  best "
              f"{best['us']:7.2f} us ({best['gbs'] / copy_gbs:4.0%}) {tuple(best['tile'])}  "
              f"max err {max(r['max_abs_err'] for r in results):.1e}", flush=True)
        records.append(dict(shape=spec, n=n, k=k, silu_mul=silu, rows=rows, bytes=nbytes, library_us=lib_us,
                            library_gbs=lib_gbs, default=chosen, best=best, sweep=results))
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=Path("benchmark/results/gemv"))
    parser.add_argument("--tag", default="")
    parser.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), help="NxK, or NxK:silu for gate/up")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--sweep", action="store_true", help="every tile of TILES, not only gemv_tile's")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    copy_gbs = copy_bandwidth("cuda", 1 << 30) / 1e9
    print(f"{torch.cuda.get_device_name()}: copy {copy_gbs:.0f} GB/s; tiles (BLOCK_N, BLOCK_K, warps, stages)",
          flush=True)
    started = time.perf_counter()
    records = [r for spec in args.shapes for r in run_shape(spec, args.rows, copy_gbs, args.sweep)]
    out = dict(device=torch.cuda.get_device_name(), copy_gbs=copy_gbs, seconds=time.perf_counter() - started,
               records=records)
    path = args.out_dir / f"gemv{'_' + args.tag if args.tag else ''}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
