"""Decode attention over the paged KV cache: achieved GB/s of KV read against the device's
measured copy bandwidth (issue 40 item 1), and a tile sweep of the split-KV kernel.

For each (batch, context) every request reads context positions of K and V for every KV head:
bytes = B x context x Hk x D x 2 (K and V) x element size. Time per call comes from a CUDA graph
of ten calls, replayed (so small shapes are not measured as host launches), over a cache several times the L2, with each request's
slots a contiguous run placed at random in the pool (as the allocator hands out pages of one),
or scattered token by token with --scatter. The kernel configurations swept: KV positions per
inner block, warps, pipeline stages and the split count (default_num_kv_splits' choice, and
around it).

    python benchmark/bench_attention.py --out-dir $OUT                  # Qwen3-0.6B heads
    python benchmark/bench_attention.py --shapes 1x4096 256x2048 --heads 32 8 --head-dim 128
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving_gpu import copy_bandwidth  # noqa: E402
from gpu_timing import graph_us  # noqa: E402

from sgl_kernel_ext.attention.paged_decode import (  # noqa: E402
    BLOCK_N,
    NUM_STAGES,
    NUM_WARPS,
    decode_workspace,
    default_num_kv_splits,
    paged_decode_attention,
)
from sgl_kernel_ext.attention.reference import decode_attention_reference  # noqa: E402

DEFAULT_SHAPES = ("1x256", "1x4096", "16x1024", "64x1024", "256x512", "256x2048", "512x512")


def make_case(batch: int, context: int, heads: int, kv_heads: int, head_dim: int, scatter: bool, seed: int = 0):
    """q [B, Hq, D], K/V pools [S, Hk, D] bf16 with S >= B x context, req_to_token [B, context]."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    slots = batch * context
    pool = slots + 1
    k_buf = torch.randn(pool, kv_heads, head_dim, generator=gen, device="cuda", dtype=torch.bfloat16)  # [S, Hk, D]
    v_buf = torch.randn(pool, kv_heads, head_dim, generator=gen, device="cuda", dtype=torch.bfloat16)  # [S, Hk, D]
    if scatter:
        order = torch.randperm(slots, generator=gen, device="cuda") + 1
    else:
        runs = torch.randperm(batch, generator=gen, device="cuda")  # request i's run starts at runs[i] * context
        order = (runs[:, None] * context + torch.arange(context, device="cuda")).flatten() + 1
    req_to_token = order.view(batch, context).to(torch.int64)  # [B, context]
    q = torch.randn(batch, heads, head_dim, generator=gen, device="cuda", dtype=torch.bfloat16)  # [B, Hq, D]
    req_pool_indices = torch.arange(batch, device="cuda", dtype=torch.int64)  # [B]
    seq_lens = torch.full((batch,), context, device="cuda", dtype=torch.int64)  # [B]
    return q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens


def kv_bytes(batch: int, context: int, kv_heads: int, head_dim: int) -> int:
    return batch * context * kv_heads * head_dim * 2 * 2


def configs(batch: int, kv_heads: int, sm_count: int, full: bool) -> list[dict]:
    default = default_num_kv_splits(batch, kv_heads, sm_count)
    if not full:
        return [dict(block_n=BLOCK_N, num_warps=NUM_WARPS, num_stages=NUM_STAGES, splits=default)]
    splits = sorted({default, max(1, default // 2), min(64, default * 2)})
    grid = itertools.product((32, 64, 128), (4, 8), (1, 2, 3, 4), splits)
    return [dict(block_n=b, num_warps=w, num_stages=s, splits=p) for b, w, s, p in grid]


def run_shape(shape: str, args: argparse.Namespace, copy_gbs: float, sm_count: int) -> list[dict]:
    batch, context = map(int, shape.split("x"))
    heads, kv_heads = args.heads
    q, k_buf, v_buf, r2t, rows, lens = make_case(batch, context, heads, kv_heads, args.head_dim, args.scatter)
    scale = args.head_dim ** -0.5
    ref = decode_attention_reference(q, k_buf, v_buf, r2t, rows, lens, scale).float()  # [B, Hq, D]
    nbytes = kv_bytes(batch, context, kv_heads, args.head_dim)
    records = []
    for cfg in configs(batch, kv_heads, sm_count, args.sweep):
        out = torch.empty_like(q)
        work = decode_workspace(batch, heads, cfg["splits"], args.head_dim, "cuda")

        def call() -> torch.Tensor:
            return paged_decode_attention(q, k_buf, v_buf, r2t, rows, lens, scale, out, work, cfg["splits"],
                                          block_n=cfg["block_n"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])

        try:
            out.fill_(float("nan"))
            err = float((call().float() - ref).abs().max())
            ms = graph_us([call] * 10) / 1e3
        except Exception as exc:  # a tile that does not fit (shared memory) is reported, not fatal
            records.append(dict(shape=shape, **cfg, error=f"{type(exc).__name__}: {str(exc)[:120]}"))
            continue
        gbs = nbytes / (ms * 1e-3) / 1e9
        records.append(dict(shape=shape, batch=batch, context=context, **cfg, us=ms * 1e3, gbs=gbs,
                            of_copy=gbs / copy_gbs, max_abs_err=err))
    good = [r for r in records if "gbs" in r]
    best = max(good, key=lambda r: r["gbs"])
    default = good[0] if not args.sweep else next(
        (r for r in good if (r["block_n"], r["num_warps"], r["num_stages"]) == (BLOCK_N, NUM_WARPS, NUM_STAGES)
         and r["splits"] == default_num_kv_splits(batch, kv_heads, sm_count)), best)
    print(f"{shape:>9s}: {nbytes / 1e6:9.1f} MB  default {default['us']:8.1f} us {default['gbs']:6.0f} GB/s "
          f"({default['of_copy']:.0%})  best {best['us']:8.1f} us {best['gbs']:6.0f} GB/s ({best['of_copy']:.0%}) "
          f"at block {best['block_n']} warps {best['num_warps']} stages {best['num_stages']} splits {best['splits']}  "
          f"max err {max(r['max_abs_err'] for r in good):.1e}", flush=True)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=Path("benchmark/results/attention"))
    parser.add_argument("--tag", default="")
    parser.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), help="BATCHxCONTEXT")
    parser.add_argument("--heads", type=int, nargs=2, default=[16, 8], metavar=("HQ", "HK"))
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--scatter", action="store_true", help="slots scattered token by token")
    parser.add_argument("--sweep", action="store_true", help="every tile configuration, not only the default")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    copy_gbs = copy_bandwidth("cuda", 1 << 30) / 1e9
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}: copy {copy_gbs:.0f} GB/s; heads {args.heads}, head_dim {args.head_dim}, "
          f"{'scattered' if args.scatter else 'contiguous'} slots", flush=True)
    started = time.perf_counter()
    records = [r for shape in args.shapes for r in run_shape(shape, args, copy_gbs, sm_count)]
    out = dict(device=torch.cuda.get_device_name(), copy_gbs=copy_gbs, heads=args.heads, head_dim=args.head_dim,
               scatter=args.scatter, seconds=time.perf_counter() - started, records=records)
    path = args.out_dir / f"attention{'_' + args.tag if args.tag else ''}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
