"""GPU checks of the CUDA-graph engine at the ModelRunner level, on a random-weight
Qwen3-0.6B-shaped checkpoint (run through the device tool; output under docs/gpu/).

1. Graphs on vs off, fp32: 256 requests of different prompt and output lengths join in waves
   and leave when done, so decode batches cross many buckets with padding. The graph runner
   generates greedily; the eager runner replays the same schedule on the same tokens (teacher
   forcing) and reports where its own argmax differs and by what top-2 margin.
2. The same 256 requests each alone (graphs, batch 1) against their batched tokens.
3. Deterministic mode (batch-invariant kernels captured): graph vs eager logits bit-equal.
4. bf16: graph vs eager log-softmax difference on the same schedule.
5. Decode step time per batch size, graphs vs eager.
6. Extend (prefill) step time, piecewise graphs vs eager.
7. The sampling step's share of a decode step (bench_serving.py's mixed sampling list, B = 1, 16,
   64, 256): decode graph alone vs decode graph + sampling graph, and + eager sampling.
8. `host-eager` (only when named): cProfile of 10 eager decode steps at bs 1 and 256, where the
   eager step's host time goes.

    python benchmark/gpu_engine_check.py --out $OUT
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "test"))
sys.path.insert(0, str(ROOT / "benchmark"))

from bench_serving import SAMPLING  # noqa: E402
from gpu_timing import gpu_ms  # noqa: E402
from random_checkpoint import write_qwen3_checkpoint  # noqa: E402
from runner_utils import Driver  # noqa: E402
from sampling_utils import make_info  # noqa: E402

from sglang.srt.layers.logits_processor import LogitsProcessorOutput  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from sglang.srt.model_executor.model_runner import ModelRunner  # noqa: E402

MARGIN_TOL = 1e-3  # fp32: a different argmax with a larger top-2 margin is a bug, not rounding
# bf16: graph and eager run the same kernels; only a padded batch's split-KV count and the GEMM
# shapes differ, which moves a logprob by rounding only.
BF16_LOGPROB_TOL = 0.05


def make_schedule(n: int, seed: int) -> list[tuple[list[int], int]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(3, 120, (1,), generator=gen))
        out.append((torch.randint(0, 150000, (length,), generator=gen).tolist(), int(torch.randint(4, 40, (1,), generator=gen))))
    return out


def run_schedule(runner: ModelRunner, schedule, forced=None, wave: int = 32, every: int = 3):
    """Waves of `wave` requests join every `every` decode steps and leave when done. Returns per
    request the token list (greedy, or `forced`'s tokens with own argmax/margins recorded) and
    the per-step logits summary."""
    driver = Driver(runner)
    tokens = {i: [] for i in range(len(schedule))}
    mismatches, logits_log = [], []
    live, pending, step = [], list(range(len(schedule))), 0

    def take(i: int, row: torch.Tensor) -> None:
        own = int(row.argmax())
        top2 = row.topk(2).values
        if forced is None:
            tokens[i].append(own)
        else:
            want = forced[i][len(tokens[i])]
            if own != want:
                mismatches.append((i, len(tokens[i]), float(top2[0] - top2[1]), float(row[own] - row[want])))
            tokens[i].append(want)

    while pending or live:
        if pending and step % every == 0:
            joining, pending = pending[:wave], pending[wave:]
            reqs = [driver.new_req() for _ in joining]
            out = driver.extend(reqs, [schedule[i][0] for i in joining]).next_token_logits
            logits_log.append(out.float().log_softmax(-1).cpu())
            for i, req, row in zip(joining, reqs, out.float()):
                take(i, row)
                live.append((i, req))
        live = [(i, r) for i, r in live if len(tokens[i]) < schedule[i][1]]
        if live:
            out = driver.decode([r for _, r in live], [tokens[i][-1] for i, _ in live])
            logits_log.append(out.float().log_softmax(-1).cpu())
            for (i, _), row in zip(live, out.float()):
                take(i, row)
        step += 1
    driver.release()
    return tokens, mismatches, logits_log


def runner(folder: str, dtype: str, graphs: bool, deterministic: bool = False) -> ModelRunner:
    return ModelRunner(folder, device="cuda", dtype=dtype, max_total_tokens=160000, max_running_requests=300,
                       disable_cuda_graph=not graphs, deterministic=deterministic, cuda_graph_max_bs=256,
                       piecewise_cuda_graph_max_tokens=8192)


def release_gpu() -> None:
    """After the caller dropped its runner: hand its KV cache and graph pool back."""
    gc.collect()
    torch.cuda.empty_cache()


def check_graphs_vs_eager(folder: str, results: dict) -> None:
    schedule = make_schedule(256, 0)
    r = runner(folder, "float32", graphs=True)
    graph_tokens, _, _ = run_schedule(r, schedule)
    solo_diff = []
    for i, (prompt, n) in enumerate(schedule):
        solo, _, _ = run_schedule(r, [(prompt, n)])
        if solo[0] != graph_tokens[i]:
            solo_diff.append(i)
    r = None
    release_gpu()
    r = runner(folder, "float32", graphs=False)
    _, mismatches, _ = run_schedule(r, schedule, forced=graph_tokens)
    r = None
    release_gpu()
    bad = [m for m in mismatches if m[2] > MARGIN_TOL]
    total = sum(len(t) for t in graph_tokens.values())
    results["fp32_graph_vs_eager"] = dict(tokens=total, argmax_differs=len(mismatches), beyond_margin=len(bad), details=mismatches[:10])
    results["fp32_solo_vs_batched"] = dict(requests=256, differing=len(solo_diff), ids=solo_diff[:20])
    print(f"{'PASS' if not bad else 'FAIL'} fp32 graphs vs eager: {total} tokens, argmax differs at {len(mismatches)} "
          f"(all within top-2 margin {MARGIN_TOL}: {not bad}) {mismatches[:5]}", flush=True)
    print(f"{'PASS' if not solo_diff else 'NOTE'} fp32 256 requests batched (joining/leaving, graphs) vs each alone: "
          f"{256 - len(solo_diff)} of 256 token-identical", flush=True)


def bf16_graph_vs_eager(folder: str, seed: int, deterministic: bool):
    """64 requests through a graph runner (greedy), then teacher-forced through an eager one:
    (graph log-softmax per step, eager log-softmax per step, eager argmax mismatches)."""
    schedule = make_schedule(64, seed)
    r = runner(folder, "bfloat16", graphs=True, deterministic=deterministic)
    tokens, _, graph_logits = run_schedule(r, schedule)
    r = None
    release_gpu()
    r = runner(folder, "bfloat16", graphs=False, deterministic=deterministic)
    _, mismatches, eager_logits = run_schedule(r, schedule, forced=tokens)
    r = None
    release_gpu()
    return graph_logits, eager_logits, mismatches


def check_deterministic(folder: str, results: dict) -> None:
    graph_logits, eager_logits, mismatches = bf16_graph_vs_eager(folder, 1, deterministic=True)
    unequal = sum(not torch.equal(a, b) for a, b in zip(graph_logits, eager_logits))
    results["deterministic_graph_vs_eager"] = dict(steps=len(graph_logits), unequal_steps=unequal, argmax_differs=len(mismatches))
    print(f"{'PASS' if unequal == 0 and not mismatches else 'FAIL'} deterministic bf16 graphs vs eager: "
          f"{unequal} of {len(graph_logits)} steps with different bits", flush=True)


def check_bf16(folder: str, results: dict) -> None:
    graph_logits, eager_logits, mismatches = bf16_graph_vs_eager(folder, 2, deterministic=False)
    worst = max(float((a - b).abs().max()) for a, b in zip(graph_logits, eager_logits))
    results["bf16_logprob_max_abs_diff"] = worst
    print(f"{'PASS' if worst <= BF16_LOGPROB_TOL else 'FAIL'} bf16 graphs vs eager: max |logprob diff| {worst:.2e} "
          f"(tolerance {BF16_LOGPROB_TOL}) over {len(graph_logits)} steps; argmax differs at {len(mismatches)}", flush=True)


def decoding_batch(r: ModelRunner, bs: int, context: int) -> tuple[Driver, list]:
    """bs requests of `context` prompt tokens prefilled (32 at a time) and decoded three steps."""
    driver = Driver(r)
    reqs = [driver.new_req() for _ in range(bs)]
    for start in range(0, bs, 32):
        driver.extend(reqs[start:start + 32], [[5] * context] * len(reqs[start:start + 32]))
    for _ in range(3):
        driver.decode(reqs, [7] * bs)
    torch.cuda.synchronize()
    return driver, reqs


def time_decode(folder: str, results: dict, context: int = 256) -> None:
    timings = {}
    for graphs in (True, False):
        r = runner(folder, "bfloat16", graphs=graphs)
        for bs in (1, 16, 64, 256):
            driver, reqs = decoding_batch(r, bs, context)
            t = time.perf_counter()
            steps = 20
            for _ in range(steps):
                driver.decode(reqs, [7] * bs)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t) / steps * 1e3
            timings[f"{'graph' if graphs else 'eager'}_bs{bs}_ms"] = ms
            print(f"decode step bf16 (ModelRunner.forward from host lists), context ~{context}, bs {bs:3d}, graphs {graphs}: "
                  f"{ms:.3f} ms ({bs / ms * 1e3:.0f} tok/s)", flush=True)
            if graphs:
                graph = r.cuda_graph_runner.graphs[bs]
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(steps):
                    graph.replay()
                end.record()
                torch.cuda.synchronize()
                timings[f"replay_only_bs{bs}_ms"] = start.elapsed_time(end) / steps
                print(f"  graph replay alone (GPU time): {start.elapsed_time(end) / steps:.3f} ms", flush=True)
            driver.release()
        r = None
        release_gpu()
    results["decode_step"] = timings


def time_extend(folder: str, results: dict) -> None:
    """Wall time of extend steps (host + GPU, synchronised): piecewise graphs vs eager."""
    timings = {}
    for graphs in (True, False):
        r = runner(folder, "bfloat16", graphs=graphs)
        for bs, n in ((1, 16), (1, 100), (1, 1000), (32, 100), (8, 1000)):
            driver = Driver(r)
            times = []
            for _ in range(6):
                reqs = [driver.new_req() for _ in range(bs)]
                torch.cuda.synchronize()
                t = time.perf_counter()
                driver.extend(reqs, [[5] * n] * bs)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t) * 1e3)
                driver.release()
            ms = sorted(times[1:])[len(times[1:]) // 2]  # median after the first (kernel compiles)
            timings[f"{'piecewise' if graphs else 'eager'}_bs{bs}_n{n}_ms"] = ms
            print(f"extend bf16, {bs} x {n} tokens, piecewise graphs {graphs}: {ms:.2f} ms", flush=True)
        r = None
        release_gpu()
    results["extend_step"] = timings


@torch.inference_mode()
def time_sampling(folder: str, results: dict, context: int = 256) -> None:
    """Sampling (bias + penalties + sampler + penalty update) as a share of the decode step, with
    the mixed sampling list: the decode graph alone, then followed by the sampling graph, then by
    the eager sampling step."""
    r = ModelRunner(folder, device="cuda", dtype="bfloat16", max_total_tokens=160000, max_running_requests=300,
                    cuda_graph_max_bs=256, sampling_backend="triton")
    graphs, timings = r.cuda_graph_runner, {}
    vocab = r.vocab_size
    for bs in (1, 16, 64, 256):
        driver = Driver(r)
        reqs = [driver.new_req() for _ in range(bs)]
        for start in range(0, bs, 32):
            driver.extend(reqs[start:start + 32], [[5] * context] * len(reqs[start:start + 32]))
        driver.decode(reqs, [7] * bs)  # the graph's buffers now hold this batch
        params = [SamplingParams(**{k: v for k, v in SAMPLING[i % len(SAMPLING)].items()}) for i in range(bs)]
        info = make_info(params, vocab, device="cuda", prompts=[[5] * context] * bs)
        gen = torch.Generator(device="cuda").manual_seed(0)
        decode = graphs.graphs[bs]

        def eager_sampling() -> None:
            decode.replay()
            logits = graphs.logits[bs]
            info.apply_logits_bias(logits)
            ids = r.sampler(LogitsProcessorOutput(next_token_logits=logits), info, positions=graphs.buffers.positions[:bs])
            info.update_penalties(ids)

        decode_ms = gpu_ms(decode.replay)
        graph_ms = gpu_ms(lambda: (decode.replay(), graphs.replay_sampling(info, bs, gen)))
        eager_ms = gpu_ms(eager_sampling)
        share = (graph_ms - decode_ms) / graph_ms
        timings[f"bs{bs}"] = dict(decode_ms=decode_ms, decode_and_sampling_graph_ms=graph_ms,
                                  decode_and_eager_sampling_ms=eager_ms, sampling_graph_share=share)
        print(f"bs {bs:3d}: decode graph {decode_ms:.3f} ms; + sampling graph {graph_ms:.3f} ms "
              f"(sampling {graph_ms - decode_ms:.3f} ms = {share:.1%} of the step); + eager sampling {eager_ms:.3f} ms",
              flush=True)
        driver.release()
    results["sampling_share"] = timings
    r = None
    release_gpu()


def profile_decode(folder: str, results: dict, context: int = 256) -> None:
    """Kernel time by name of one eager decode step (the kernels a graph replays), bs 1 and 64."""
    from torch.profiler import ProfilerActivity, profile

    r = runner(folder, "bfloat16", graphs=False)
    for bs in (1, 64):
        driver = Driver(r)
        reqs = [driver.new_req() for _ in range(bs)]
        driver.extend(reqs, [[5] * context] * bs)
        for _ in range(3):
            driver.decode(reqs, [7] * bs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                driver.decode(reqs, [7] * bs)
            torch.cuda.synchronize()
        print(f"--- eager decode step kernels, bs {bs}, 5 steps ---")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))
        driver.release()
    r = None
    release_gpu()


def profile_eager_host(folder: str, results: dict, context: int = 256) -> None:
    """Where an eager decode step's host time goes: cProfile over 10 steps at bs 1 and 256, the
    functions with the most own time and the most cumulative time."""
    import cProfile
    import io
    import pstats

    r = runner(folder, "bfloat16", graphs=False)
    for bs in (1, 256):
        driver, reqs = decoding_batch(r, bs, context)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(10):
            driver.decode(reqs, [7] * bs)
        torch.cuda.synchronize()
        prof.disable()
        for order in ("tottime", "cumulative"):
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats(order).print_stats(28)
            print(f"--- eager decode, bs {bs}, 10 steps, by {order} ---")
            print("\n".join(line[:150] for line in text.getvalue().splitlines()[6:]), flush=True)
        driver.release()
    r = None
    release_gpu()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("/tmp/engine_check"))
    parser.add_argument("--checkpoint", default="/tmp/qwen3-0.6b-random")
    parser.add_argument("--tokenizer", help="tokenizer folder copied into a new checkpoint")
    parser.add_argument("--checks", nargs="+", default=["timing", "extend", "sampling", "graphs", "deterministic", "bf16"])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not Path(args.checkpoint, "config.json").exists():
        write_qwen3_checkpoint(args.checkpoint, args.tokenizer, device="cuda")
    results: dict = {"device": torch.cuda.get_device_name()}
    checks = {"host-eager": profile_eager_host, "profile": profile_decode, "timing": time_decode, "extend": time_extend, "sampling": time_sampling, "graphs": check_graphs_vs_eager, "deterministic": check_deterministic, "bf16": check_bf16}
    for name in args.checks:
        started = time.perf_counter()
        checks[name](args.checkpoint, results)
        print(f"[{name}: {time.perf_counter() - started:.0f} s]", flush=True)
        (args.out / "engine_check.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
