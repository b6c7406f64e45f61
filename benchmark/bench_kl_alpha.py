"""The kl_symmetry alpha (sampling/guidance.py) at a serving shape: the Triton kernel
(sgl_kernel_ext/sampling/kl_alpha_triton.py) over a sweep of tiles against its torch reference,
CUDA events, median of --iters calls each. Rows are log-softmaxes of random logits (scale 3).

Usage (a CUDA machine):
  python benchmark/bench_kl_alpha.py --rows 64 --vocab 151936 --out benchmark/results/guidance/kl_alpha_h200.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sgl_kernel_ext.sampling.kl_alpha_reference import KL_BISECTION_TOL, kl_alpha_reference  # noqa: E402
from sgl_kernel_ext.sampling.kl_alpha_triton import kl_alpha_triton  # noqa: E402

TILES = [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 16), (8192, 32)]


def _median_ms(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    records = []
    for rows in args.rows:
        gen = torch.Generator(device="cuda").manual_seed(rows)
        main_logits = torch.randn(rows, args.vocab, device="cuda", generator=gen) * 3
        guide_logits = torch.randn(rows, args.vocab, device="cuda", generator=gen) * 3
        lc, lg = torch.log_softmax(main_logits, -1), torch.log_softmax(guide_logits, -1)
        diff = lg - lc
        want = kl_alpha_reference(lc, diff)
        ref_ms = _median_ms(lambda: kl_alpha_reference(lc, diff), args.iters)
        print(f"rows {rows} V {args.vocab}: torch reference {ref_ms:.3f} ms", flush=True)
        records.append({"rows": rows, "vocab": args.vocab, "impl": "torch", "ms": ref_ms})
        for block, warps in TILES:
            got = kl_alpha_triton(lc, diff, block, warps)
            gap = (got - want).abs().max().item()
            ms = _median_ms(lambda: kl_alpha_triton(lc, diff, block, warps), args.iters)
            ok = gap <= 2 * KL_BISECTION_TOL
            print(f"rows {rows} V {args.vocab}: triton BLOCK {block} warps {warps}: {ms:.3f} ms, max |alpha - ref| {gap:.2e}"
                  f"{'' if ok else '  MISMATCH'}", flush=True)
            records.append({"rows": rows, "vocab": args.vocab, "impl": "triton", "block": block, "num_warps": warps,
                            "ms": ms, "max_alpha_gap": gap, "within_tolerance": ok})
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "records": records}, indent=2) + "\n")


if __name__ == "__main__":
    main()
