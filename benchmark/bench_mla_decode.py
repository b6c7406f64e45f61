"""Micro-benchmark of the MLA decode kernel (sgl_kernel_ext/attention/mla_decode.py) at DeepSeek-V3's
attention shape: kv_lora_rank 512 + rope 64 per cached latent row, bf16, 128 heads (one GPU) or
16 (a TP-8 rank's share). Each case fills a shuffled paged cache for B requests of L tokens, checks
the kernel against the plain-torch reference on the first request, and times the launch (CUDA
events over repeated calls, after warm-up). Reported: microseconds per call and the latent-cache
read rate, B * L * 576 * 2 bytes per call, in GB/s (the figure to compare with the HBM bandwidth:
decode attention reads every cached row once).

    python benchmark/bench_mla_decode.py --out benchmark/results/hybrid        (CUDA)
    python benchmark/bench_mla_decode.py --device cpu --out ...                (TRITON_INTERPRET dry run)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "python"))

import torch  # noqa: E402

from sgl_kernel_ext.attention.mla_decode import mla_decode_attention, mla_decode_workspace  # noqa: E402
from sgl_kernel_ext.attention.paged_decode import default_num_kv_splits  # noqa: E402
from sgl_kernel_ext.attention.reference import mla_decode_reference  # noqa: E402

RANK, ROPE = 512, 64
SCALE = (128 + ROPE) ** -0.5
# (heads, batch, context, BLOCK_N): the kernel's default BLOCK_N (32) and 64 (both fit an H100's
# shared memory).
GPU_CASES = [(h, b, l, n) for h in (128, 16) for b in (1, 8, 32, 64) for l in (1024, 4096) for n in (32, 64)]
CPU_CASES = [(4, 2, 64, 32)]


def paged_cache(batch: int, length: int, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """(latent rows [S, 1, R + P], req_to_token [B, L], req_pool_indices [B], seq_lens [B]): every
    request's slots shuffled over the pool (slot 0 is the zero padding slot)."""
    gen = torch.Generator(device=device).manual_seed(0)
    slots = batch * length + 1
    kv = torch.randn(slots, 1, RANK + ROPE, generator=gen, device=device).to(dtype)  # [S, 1, R + P]
    kv[0] = 0
    perm = (torch.randperm(slots - 1, generator=gen, device=device) + 1).view(batch, length)  # [B, L]
    return kv, perm, torch.arange(batch, device=device), torch.full((batch,), length, dtype=torch.int64, device=device)


def run_case(heads: int, batch: int, length: int, block_n: int, device: str, iters: int) -> dict:
    dtype = torch.bfloat16
    kv, r2t, pool, seq_lens = paged_cache(batch, length, device, dtype)
    q = torch.randn(batch, heads, RANK + ROPE, generator=torch.Generator(device=device).manual_seed(1), device=device).to(dtype)
    splits = default_num_kv_splits(batch, 1, torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 132)
    out = torch.empty(batch, heads, RANK, dtype=dtype, device=device)
    workspace = mla_decode_workspace(batch, heads, splits, RANK, device)

    def call() -> None:
        mla_decode_attention(q, kv, r2t, pool, seq_lens, SCALE, RANK, out, workspace, splits, block_n=block_n)

    call()
    want = mla_decode_reference(q[:1], kv, r2t, pool[:1], seq_lens[:1], SCALE, RANK)
    err = (out[:1].float() - want.float()).abs().max().item()
    seconds = _time(call, device, iters)
    read = batch * length * (RANK + ROPE) * kv.element_size()
    return {"heads": heads, "batch": batch, "context": length, "block_n": block_n, "num_kv_splits": splits,
            "us_per_call": seconds * 1e6,
            "latent_read_gb_s": read / seconds / 1e9, "max_abs_err_vs_reference": err}


def _time(call, device: str, iters: int) -> float:
    if device != "cuda":
        start = time.perf_counter()
        call()
        return time.perf_counter() - start
    for _ in range(5):
        call()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(iters):
        call()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / 1e3 / iters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_mla_decode"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    cases = GPU_CASES if args.device == "cuda" else CPU_CASES
    result = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu (TRITON_INTERPRET=1: correctness only)",
              "kv_lora_rank": RANK, "qk_rope_head_dim": ROPE, "dtype": "bfloat16", "cases": []}
    for heads, batch, length, block_n in cases:
        result["cases"].append(run_case(heads, batch, length, block_n, args.device, args.iters))
        print(json.dumps(result["cases"][-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "mla_decode_cuda.json" if args.device == "cuda" else "mla_decode_cpu.json"
    (args.out / name).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out / name}")


if __name__ == "__main__":
    main()
