"""Watermark overhead per decode step: the sampler's step (Sampler.sample_step, what the model
runner calls) over N sampled rows, plain against the same rows watermarked, interleaved.

Each timed step gets a fresh copy of a fixed random [N, V] logits tensor (made outside the timed
region). The watermarked contender first starts every row's context (as a prefill does) and then
steps on, appending each sampled token to its request's context, so contexts are new (forced) as
in a real decode; the history holds up to `--steps` contexts per request. Reported: the median
step time of each (CUDA events on a GPU; process CPU time on the CPU), and the difference (the watermark's cost per step, which adds to the model's
forward time).

Usage:
  python benchmark/bench_watermark.py --threads 1        # CPU: N 16, V 49152
  python benchmark/bench_watermark.py --device cuda      # N 64, V 151936, CUDA events
  python benchmark/bench_watermark.py --device cuda --profile   # and each contender's kernels
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from sglang.srt.layers.sampler import Sampler, SamplerInput  # noqa: E402
from sglang.srt.sampling.sampling_batch_info import RowSpec, SamplingBatchInfo  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.sampling.watermarking.config import WatermarkSettings  # noqa: E402
from sglang.srt.sampling.watermarking.state import WatermarkState  # noqa: E402


class _Row:
    rid, origin_input_ids, output_ids, logprob, grammar, sampling_report = "r", [1, 2, 3], [], None, None, None


def _contender(n: int, vocab: int, device: torch.device, watermark: bool, params: dict, backend: str):
    wm = {"key": "0123456789abcdef", "context_window": 4} if watermark else None
    rows = [RowSpec(params=SamplingParams(**params, watermark=wm)) for _ in range(n)]
    info = SamplingBatchInfo(rows=rows, vocab_size=vocab, device=device)
    sampler = Sampler(backend, generator=torch.Generator(device=device).manual_seed(0), device=device)
    slots = torch.arange(n, device=device)
    if watermark:
        sampler.watermark_state = WatermarkState(WatermarkSettings(), n, 8192, device)
        sampler.watermark_state.start(slots, [[i, 1, 2, 3] for i in range(n)], [[] for _ in range(n)], [4] * n)
    store = torch.zeros(n, dtype=torch.int64, device=device)
    positions = torch.zeros(n, dtype=torch.int64, device=device)

    def step(logits: torch.Tensor) -> None:
        sampler.sample_step(SamplerInput(logits=logits, info=info, positions=positions, rows=[_Row()] * n,
                                         token_store=(store, slots)))

    return step


def _time(step, base: torch.Tensor, device: torch.device) -> float:
    logits = base.clone()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(logits)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    # Process CPU time: on a shared CPU, wall time mostly measures the other tenants' load.
    t0 = time.process_time()
    step(logits)
    return (time.process_time() - t0) * 1e3


def run(n: int, vocab: int, device: torch.device, steps: int, warmup: int, params: dict, backend: str) -> dict:
    base = torch.randn(n, vocab, generator=torch.Generator().manual_seed(0)).to(device)
    contenders = {name: _contender(n, vocab, device, name == "watermark", params, backend) for name in ("plain", "watermark")}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for i in range(warmup + steps):
        order = list(contenders) if i % 2 == 0 else list(contenders)[::-1]
        for name in order:
            ms = _time(contenders[name], base, device)
            if i >= warmup:
                times[name].append(ms)
    medians = {name: statistics.median(v) for name, v in times.items()}
    return {"n": n, "vocab": vocab, "params": params, "backend": backend, "median_ms": medians,
            "overhead_ms": medians["watermark"] - medians["plain"]}


def profile(n: int, vocab: int, device: torch.device, params: dict, backend: str, steps: int = 5) -> None:
    """Print each contender's kernels by device time over `steps` steps (torch.profiler)."""
    base = torch.randn(n, vocab, generator=torch.Generator().manual_seed(0)).to(device)
    sort_by = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    for watermark in (False, True):
        step = _contender(n, vocab, device, watermark, params, backend)
        for _ in range(2):
            _time(step, base, device)
        with torch.profiler.profile() as prof:
            for _ in range(steps):
                _time(step, base, device)
        print(f"--- profile N={n} {json.dumps(params)} {'watermark' if watermark else 'plain'}, {steps} steps")
        print(prof.key_averages().table(sort_by=sort_by, row_limit=20))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--n", type=int, nargs="+", default=None, help="Batch sizes (default: 16 CPU, 64 CUDA).")
    parser.add_argument("--vocab", type=int, default=None, help="Default: 49152 CPU, 151936 CUDA.")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's).")
    parser.add_argument("--backend", default=None, help="Sampling backend (default: the server's, triton on CUDA).")
    parser.add_argument("--out", default=None, help="Write the results as JSON here.")
    parser.add_argument("--profile", action="store_true", help="Also print each contender's kernels (torch.profiler).")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sizes = args.n or ([64] if cuda else [16])
    vocab = args.vocab or (151936 if cuda else 49152)
    backend = args.backend or ("triton" if cuda else "pytorch")
    cases = [{"temperature": 1.0}, {"temperature": 0.7, "top_p": 0.9, "top_k": 50}]
    results = [run(n, vocab, device, args.steps, args.warmup, case, backend) for n in sizes for case in cases]
    for r in results:
        m = r["median_ms"]
        print(f"N={r['n']:4d} V={r['vocab']} {backend} {json.dumps(r['params'])}: plain {m['plain']:.3f} ms, "
              f"watermark {m['watermark']:.3f} ms, overhead {r['overhead_ms']:+.3f} ms per step")
    if args.profile:
        for case in cases:
            profile(sizes[0], vocab, device, case, backend)
    record = {"device": torch.cuda.get_device_name(device) if cuda else platform.processor() or platform.machine(),
              "torch": torch.__version__, "argv": sys.argv[1:], "results": results}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
