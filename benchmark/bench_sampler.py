"""Sampler micro-benchmark: the time of one decode step's sampling, ours against reference samplers.

One step of ours is `info.apply_logits_bias(logits)` + `Sampler.forward(...)`, exactly what the
model runner calls per decode step. Both mutate the logits in place, so every call gets a fresh
copy of a fixed random [B, V] tensor, made outside the timed region. The contenders of one
configuration run interleaved (one call each per iteration, rotating who goes first), and all
configurations run in several rounds, so drift and bursts of outside load on a noisy machine hit
every contender and configuration alike; each reports the median over its timed iterations.

Contenders:
  ours:<backend>      our Sampler with that sampling backend (any name create_sampler knows:
                      built-ins and registered factories)
  ours:<backend>+graph  (CUDA) the same step captured once in a CUDA graph and replayed, as a
                      serving engine runs a fixed-shape decode step (no per-op launch cost)
  torch.argmax        plain argmax over the logits: the floor any sampler is compared with
  hf-transformers     HF's logits-processor pipeline + softmax + multinomial, called as
                      `generate` does (processors(input_ids, scores), input_ids = prompt + output)
  flashinfer-kernels  (CUDA) flashinfer.sampling chains on softmax probabilities
  one-read-floor      (CUDA, computed) B*V*4 bytes at the measured device copy bandwidth

Usage:
  python benchmark/bench_sampler.py                 # CPU: B 1/16/64, V 49152
  python benchmark/bench_sampler.py --device cuda   # B 1..256, V 131072/151936, CUDA events
  python benchmark/bench_sampler.py --profile penalties:64   # also torch.profiler of ours
  python benchmark/bench_sampler.py --processors    # batch-level logits processors' cost per step
  python benchmark/bench_sampler.py --processors --device cuda

--processors times the batch-level logits-processor pipeline (LogitsProcessorPipeline.run, what
the model runner adds to a step) with none, one trivial argmax-invariant plugin, and the four
built-ins on every row, beside the sampler step of the minp case (B 16/64; V 49152 on the CPU,
151936 on CUDA). Each timed step first appends one token to every row's output, as decoding does.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from tqdm import tqdm

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampler import create_sampler
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams

RESULTS_DIR = Path(__file__).resolve().parent / "results"
PROMPT_LEN = 100
GENERATED_LEN = 512
LOGIT_SCALE = 3.0  # randn * 3: a spread whose softmax at T 0.7 has a short, heavy head
TARGET_CASE, TARGET_B, TARGET_RATIO = "penalties", 64, 5.0

ARGMAX, HF, FLASHINFER, FLOOR = "torch.argmax", "hf-transformers", "flashinfer-kernels", "one-read-floor"

# Per device: batch sizes, vocab sizes, our backends, rounds, warm-up iterations per round and
# timed iterations in all (split evenly over the rounds).
DEVICE_DEFAULTS = {
    "cpu": dict(
        batch_sizes=[1, 16, 64], vocab_sizes=[49152], backends=["pytorch"], graph_backends=[], rounds=5, warmup=3, iters=100
    ),
    "cuda": dict(
        batch_sizes=[1, 16, 64, 128, 256],
        vocab_sizes=[131072, 151936],
        backends=["pytorch", "flashinfer", "triton"],
        graph_backends=["triton"],
        rounds=4,
        warmup=5,
        iters=200,
    ),
}


# ---------------------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    name: str
    temperature: float = 1.0
    top_k: Optional[int] = None
    top_p: float = 1.0
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seeded: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0

    def params(self, row: int) -> SamplingParams:
        extra = {"top_k": self.top_k} if self.top_k is not None else {}
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            min_p=self.min_p,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            repetition_penalty=self.repetition_penalty,
            sampling_seed=1000 + row if self.seeded else None,
            **extra,
        )


_TOPK_TOPP = dict(temperature=0.7, top_k=50, top_p=0.9)
_MINP = dict(_TOPK_TOPP, min_p=0.05)
CASES = {
    case.name: case
    for case in (
        Case("greedy", temperature=0.0),
        Case("temperature", temperature=0.7),
        Case("topk_topp", **_TOPK_TOPP),
        Case("topp", temperature=0.7, top_p=0.9),
        Case("minp", **_MINP),
        Case("penalties", **_MINP, frequency_penalty=0.3, presence_penalty=0.2, repetition_penalty=1.1),
        Case("seeded", **_MINP, seeded=True),
    )
}


# ------------------------------------------------------------------------------------- workload


@dataclass
class Workload:
    """One (case, B, V) configuration: the fixed logits and each row's token history."""

    case: Case
    device: torch.device
    logits: torch.Tensor  # [B, V] float32, never mutated
    history: torch.Tensor  # [B, PROMPT_LEN + GENERATED_LEN] int64: prompt then generated tokens
    positions: torch.Tensor  # [B] int64, position of each row's last token

    @property
    def batch_size(self) -> int:
        return self.logits.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.logits.shape[1]


def zipf_tokens(rows: int, length: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """[rows, length] ids: text reuses a few tokens often, so draw Zipf ranks over a shuffled vocab."""
    weights = torch.arange(1, vocab + 1, dtype=torch.float64).pow(-1.1)
    ranks = torch.multinomial(weights, rows * length, replacement=True, generator=gen)
    return torch.randperm(vocab, generator=gen)[ranks].view(rows, length)


def make_workload(case: Case, batch_size: int, vocab: int, device: torch.device) -> Workload:
    # Built on the CPU from one seed, so every device sees the same numbers.
    gen = torch.Generator().manual_seed(batch_size * 7919 + vocab)
    logits = torch.randn(batch_size, vocab, generator=gen) * LOGIT_SCALE
    history = zipf_tokens(batch_size, PROMPT_LEN + GENERATED_LEN, vocab, gen)
    positions = torch.full((batch_size,), PROMPT_LEN + GENERATED_LEN - 1, dtype=torch.int64)
    return Workload(case, device, logits.to(device), history.to(device), positions.to(device))


# ------------------------------------------------------------------------------------ contenders

Step = Callable[[torch.Tensor], object]  # consumes a fresh [B, V] copy of the workload's logits


def build_sampling_info(work: Workload) -> SamplingBatchInfo:
    """Our batch state after PROMPT_LEN prompt tokens and GENERATED_LEN decode steps."""
    prompts = work.history[:, :PROMPT_LEN].tolist()
    reqs = [Req(f"r{i}", prompt, work.case.params(i)) for i, prompt in enumerate(prompts)]
    batch = ScheduleBatch(reqs=reqs, device=work.device)
    info = SamplingBatchInfo.from_schedule_batch(batch, work.vocab_size)
    batch.sampling_info = info
    for step in range(PROMPT_LEN, work.history.shape[1]):
        info.update_penalties(work.history[:, step])
    return info  # holds the batch strongly (the orchestrator only weakly)


def available_backends(names: list[str]) -> list[str]:
    """Our backends that build here: unknown names (a backend not written yet) and backends whose
    package is missing (flashinfer) are skipped with a note, once."""
    usable = []
    for name in names:
        try:
            create_sampler(name)
        except (ValueError, RuntimeError) as err:
            print(f"note: skipping ours:{name}: {err}")
            continue
        usable.append(name)
    return usable


def ours(backend: str, work: Workload) -> Step:
    sampler = create_sampler(backend)
    info = build_sampling_info(work)
    positions = work.positions

    def step(logits: torch.Tensor) -> torch.Tensor:
        info.apply_logits_bias(logits)
        return sampler(LogitsProcessorOutput(next_token_logits=logits), info, positions=positions)

    return step


def ours_graph(backend: str, work: Workload) -> Step:
    """ours:<backend> replayed from a CUDA graph captured on the first logits tensor it is given
    (measure() reuses one buffer per round, so each round captures once, in a warm-up call)."""
    eager = ours(backend, work)
    captured: dict = {}

    def step(logits: torch.Tensor) -> None:
        if captured.get("ptr") != logits.data_ptr():
            eager(logits)  # compiles kernels outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                eager(logits)
            captured.update(ptr=logits.data_ptr(), graph=graph)
        captured["graph"].replay()

    return step


def argmax(work: Workload) -> Step:
    return lambda logits: torch.argmax(logits, -1)


def hf_transformers(work: Workload) -> Optional[Step]:
    """HF generate's processors for the case; HF has no frequency/presence penalty nor per-row seeds."""
    case = work.case
    if case.greedy or case.seeded:
        return None  # HF greedy is argmax; HF has no per-row seeded sampling
    lp = importlib.import_module("transformers.generation.logits_process")
    processors = lp.LogitsProcessorList()
    if case.repetition_penalty != 1.0:
        processors.append(lp.RepetitionPenaltyLogitsProcessor(case.repetition_penalty))
    processors.append(lp.TemperatureLogitsWarper(case.temperature))
    if case.top_k is not None:
        processors.append(lp.TopKLogitsWarper(case.top_k))
    if case.top_p < 1.0:
        processors.append(lp.TopPLogitsWarper(case.top_p))
    if case.min_p > 0.0:
        processors.append(lp.MinPLogitsWarper(case.min_p))
    input_ids = work.history

    def step(logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(processors(input_ids, logits), dim=-1)
        return torch.multinomial(probs, num_samples=1).squeeze(1)

    return step


def flashinfer_kernels(work: Workload) -> Optional[Step]:
    """flashinfer.sampling on softmax(logits / T); the closest kernel chain for each case."""
    case = work.case
    if work.device.type != "cuda" or case.greedy or case.penalized or case.seeded:
        return None
    ops = importlib.import_module("flashinfer.sampling")
    rows = work.batch_size
    temps = torch.full((rows, 1), case.temperature, device=work.device)
    top_ks = torch.full((rows,), case.top_k or work.vocab_size, dtype=torch.int32, device=work.device)
    top_ps = torch.full((rows,), case.top_p, device=work.device)
    min_ps = torch.full((rows,), case.min_p, device=work.device)

    def draw(probs: torch.Tensor) -> torch.Tensor:
        if case.min_p > 0.0:
            probs = ops.top_p_renorm_probs(ops.top_k_renorm_probs(probs, top_ks), top_ps)
            return ops.min_p_sampling_from_probs(probs, min_ps)
        if case.top_k is not None:
            return ops.top_k_top_p_sampling_from_probs(probs, top_ks, top_ps, filter_apply_order="joint")
        if case.top_p < 1.0:
            return ops.top_p_sampling_from_probs(probs, top_ps)
        return ops.sampling_from_probs(probs)

    return lambda logits: draw(torch.softmax(logits.div_(temps), dim=-1))


def flashinfer_available() -> bool:
    try:
        importlib.import_module("flashinfer.sampling")
    except ImportError as err:
        print(f"note: skipping {FLASHINFER}: flashinfer.sampling is not importable ({err})")
        return False
    return True


def build_contenders(
    work: Workload, backends: list[str], graph_backends: list[str], with_flashinfer: bool, with_hf: bool
) -> dict[str, Step]:
    """Every contender that applies to this workload, ours first."""
    builders: dict[str, Callable[[], Optional[Step]]] = {
        f"ours:{name}": (lambda name=name: ours(name, work)) for name in backends
    }
    for name in graph_backends:
        builders[f"ours:{name}+graph"] = lambda name=name: ours_graph(name, work)
    builders[ARGMAX] = lambda: argmax(work)
    if with_hf:
        builders[HF] = lambda: hf_transformers(work)
    if with_flashinfer:
        builders[FLASHINFER] = lambda: flashinfer_kernels(work)
    built = {name: build() for name, build in builders.items()}
    return {name: step for name, step in built.items() if step is not None}


# -------------------------------------------------------------------------------------- timing


def time_cpu_us(step: Step, logits: torch.Tensor) -> float:
    start = time.perf_counter_ns()
    step(logits)
    return (time.perf_counter_ns() - start) / 1e3


def time_cuda_us(step: Step, logits: torch.Tensor) -> float:
    # The logits copy was queued before `start`, so the events bracket the step alone (launches included).
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    step(logits)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


@dataclass
class Bench:
    """One configuration's contenders and every timed sample so far, in microseconds."""

    work: Workload
    contenders: dict[str, Step]
    samples: dict[str, list[float]]


def measure(bench: Bench, warmup: int, iters: int, bar: tqdm) -> None:
    """Time warmup + iters iterations of every contender, interleaved and rotated each iteration."""
    work = bench.work
    timer = time_cuda_us if work.device.type == "cuda" else time_cpu_us
    buffer = torch.empty_like(work.logits)
    names = list(bench.contenders)
    for it in range(warmup + iters):
        shift = it % len(names)
        for name in names[shift:] + names[:shift]:
            buffer.copy_(work.logits)
            elapsed = timer(bench.contenders[name], buffer)
            if it >= warmup:
                bench.samples[name].append(elapsed)
        bar.update(1)


def copy_bandwidth(device: torch.device) -> float:
    """Device copy bandwidth in bytes/s, counting read + write (1 GiB copies, median of 20)."""
    src = torch.empty(1 << 28, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    times = [time_cuda_us(lambda _: dst.copy_(src), src) for _ in range(25)][5:]
    return 2 * src.numel() * 4 / (statistics.median(times) / 1e6)


# ------------------------------------------------------------------------------------- outputs


def machine_description(device: torch.device) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    desc = f"{os.cpu_count()}-core {platform.machine()} ({cpu}), {platform.system()} {platform.release()}"
    if device.type == "cuda":
        desc += f"; GPU {torch.cuda.get_device_name(device)}"
    return desc


def package_version(name: str) -> Optional[str]:
    """The installed distribution's version; None when absent (a bundled copy may lack metadata)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def header(started: datetime.datetime, device: torch.device, bandwidth: Optional[float]) -> dict:
    return {
        "date": started.isoformat(timespec="seconds"),
        "machine": machine_description(device),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "transformers": package_version("transformers"),
        "flashinfer": package_version("flashinfer-python"),
        "copy_bandwidth_bytes_per_s": bandwidth,
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
    }


def markdown_table(records: list[dict], ours_name: str) -> str:
    """One row per (case, V, B): every contender's median, ours / argmax and HF / ours."""
    names = list(dict.fromkeys(r["backend"] for r in records))
    medians: dict[tuple, dict[str, float]] = {}
    for r in records:
        medians.setdefault((r["case"], r["V"], r["B"]), {})[r["backend"]] = r["median_us"]
    lines = [
        "| case | V | B | " + " | ".join(f"{n} (µs)" for n in names) + f" | {ours_name} / argmax | HF / {ours_name} |",
        "|---|---|---|" + "---|" * (len(names) + 2),
    ]
    for (case, vocab, batch), row in medians.items():
        cells = [fmt_us(row[n]) if n in row else "—" for n in names]
        mine, floor, hf = row.get(ours_name), row.get(ARGMAX), row.get(HF)
        ratios = [ratio(mine, floor), ratio(hf, mine)]
        lines.append(f"| {case} | {vocab} | {batch} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)


def fmt_us(us: float) -> str:
    return f"{us:,.0f}" if us >= 100 else f"{us:.3g}"  # floors on a GPU are fractions of a µs


def ratio(num: Optional[float], den: Optional[float]) -> str:
    return f"{num / den:.2f}x" if num is not None and den else "—"


def target_verdict(records: list[dict], ours_name: str) -> str:
    keyed = {(r["case"], r["B"], r["backend"]): r["median_us"] for r in records if r["case"] == TARGET_CASE}
    mine, floor = keyed.get((TARGET_CASE, TARGET_B, ours_name)), keyed.get((TARGET_CASE, TARGET_B, ARGMAX))
    if mine is None or floor is None:
        return f"target not measured ({TARGET_CASE} at B={TARGET_B} missing)"
    met = "MET" if mine <= TARGET_RATIO * floor else "NOT MET"
    return (
        f"target: temperature + top_k 50 + top_p 0.9 + min_p 0.05 + penalties at B={TARGET_B} within "
        f"{TARGET_RATIO:g}x of argmax -> {ours_name} {mine:,.0f} µs vs argmax {floor:,.0f} µs = "
        f"{mine / floor:.2f}x: {met}"
    )


# The GPU issue's targets: (case, which B, reference contender, most ours may take as a multiple).
GPU_TARGETS = (
    ("topk_topp", lambda b, v: b >= 16, FLASHINFER, 0.5),
    ("minp", lambda b, v: b >= 16, FLASHINFER, 0.35),
    ("topk_topp", lambda b, v: b == 256 and v == 151936, FLOOR, 3.0),
    ("greedy", lambda b, v: True, ARGMAX, 1.2),
)


def gpu_target_lines(records: list[dict]) -> list[str]:
    """One line per target and configuration, for our fastest eager backend and for the CUDA-graph
    replay, then a count of those met."""
    med = {(r["case"], r["B"], r["V"], r["backend"]): r["median_us"] for r in records}
    configs = sorted({(r["case"], r["B"], r["V"]) for r in records})
    lines, met, total = [], 0, 0
    for label, graph in (("eager", False), ("graph", True)):
        for case, applies, reference, limit in GPU_TARGETS:
            for c, b, v in configs:
                ours_vals = {n: m for (cc, bb, vv, n), m in med.items() if (cc, bb, vv) == (c, b, v)
                             and n.startswith("ours:") and n.endswith("+graph") == graph}
                ref = med.get((c, b, v, reference))
                if c != case or not applies(b, v) or not ours_vals or ref is None:
                    continue
                name, mine = min(ours_vals.items(), key=lambda item: item[1])
                ok = mine <= limit * ref
                met, total = met + ok, total + 1
                lines.append(
                    f"{label} {case} B={b} V={v}: {name} {mine:,.1f} µs / {reference} {ref:,.1f} µs = "
                    f"{mine / ref:.2f}x (target <= {limit:g}x): {'MET' if ok else 'NOT MET'}"
                )
    lines.append(f"GPU targets met: {met} of {total}")
    return lines


def plot(records: list[dict], path: Path, title: str) -> None:
    """One panel per case: median µs vs B on log axes, one line per contender (and V)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r["case"] for r in records))
    names = list(dict.fromkeys(r["backend"] for r in records))
    vocabs = sorted({r["V"] for r in records})
    cols = min(4, len(cases))
    rows = math.ceil(len(cases) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.6 * rows), squeeze=False)
    legend: dict[str, object] = {}  # label -> line, over all panels (not every panel has every contender)
    for ax, case in zip(axes.flat, cases):
        for color, name in enumerate(names):
            for vocab, style in zip(vocabs, ["-", "--", ":", "-."]):
                picked = [r for r in records if (r["case"], r["backend"], r["V"]) == (case, name, vocab)]
                points = sorted((r["B"], r["median_us"]) for r in picked)
                if points:
                    label = name if len(vocabs) == 1 else f"{name} V={vocab}"
                    (legend[label],) = ax.plot(*zip(*points), style, color=f"C{color}", marker="o")
        ax.set(title=case, xscale="log", yscale="log", xlabel="B", ylabel="median µs per step")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(cases) :]:
        ax.axis("off")
    fig.legend(list(legend.values()), list(legend), loc="lower right", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------ profiling


def profile_ours(spec: str, backend: str, vocab: int, device: torch.device, iters: int = 20) -> None:
    """Print torch.profiler's op table for ours on `case:B` (fresh logits copy outside each step)."""
    case_name, batch = spec.split(":")
    work = make_workload(CASES[case_name], int(batch), vocab, device)
    step = ours(backend, work)
    buffer = torch.empty_like(work.logits)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    for _ in range(3):
        buffer.copy_(work.logits)
        step(buffer)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(iters):
            buffer.copy_(work.logits)
            with torch.profiler.record_function("step"):
                step(buffer)
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(f"\ntorch.profiler, ours:{backend}, {spec}, V={vocab}, {iters} steps:")
    print(prof.key_averages().table(sort_by=sort, row_limit=25))


def host_time_ours(spec: str, backend: str, vocab: int, device: torch.device, iters: int = 50) -> None:
    """Print the median CPU time of ours on `case:B` per call, the device sync after each call
    excluded: what an eager step costs the host before its kernels run."""
    case_name, batch = spec.split(":")
    work = make_workload(CASES[case_name], int(batch), vocab, device)
    step = ours(backend, work)
    buffer = torch.empty_like(work.logits)
    times = []
    for it in range(iters + 5):
        buffer.copy_(work.logits)
        torch.cuda.synchronize(device)
        start = time.perf_counter_ns()
        step(buffer)
        if it >= 5:
            times.append((time.perf_counter_ns() - start) / 1e3)
        torch.cuda.synchronize(device)
    print(f"host time, ours:{backend}, {spec}, V={vocab}: median {statistics.median(times):.1f} µs per call")


# ----------------------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=sorted(DEVICE_DEFAULTS))
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--batch-sizes", nargs="+", type=int)
    parser.add_argument("--vocab-sizes", nargs="+", type=int)
    parser.add_argument("--backends", nargs="+", help="our sampling backends, by name (skipped if unavailable)")
    parser.add_argument("--graph-backends", nargs="*", help="(CUDA) our backends also timed as CUDA-graph replays")
    parser.add_argument("--no-hf", action="store_true", help="leave out the HF transformers pipeline")
    parser.add_argument("--rounds", type=int, help="passes over all configurations")
    parser.add_argument("--warmup", type=int, help="untimed iterations per configuration and round")
    parser.add_argument("--iters", type=int, help="timed iterations per configuration, over all rounds")
    parser.add_argument("--profile", metavar="CASE:B", help="also print a torch.profiler table of ours")
    parser.add_argument("--host-time", metavar="CASE:B", nargs="*", help="(CUDA) also print ours' CPU time per call")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--processors", action="store_true", help="time the batch-level logits-processor pipeline instead")
    args = parser.parse_args()
    if args.processors:
        args.batch_sizes = args.batch_sizes or PROCESSOR_DEFAULTS[args.device]["batch_sizes"]
        args.vocab_sizes = args.vocab_sizes or [PROCESSOR_DEFAULTS[args.device]["vocab"]]
    for key, value in DEVICE_DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def run(args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Every configuration once per round, so a burst of outside load on the shared machine
    lands on a slice of each configuration's samples instead of on whole configurations."""
    backends = available_backends(args.backends)
    graph_backends = [name for name in args.graph_backends if name in backends]
    with_flashinfer = device.type == "cuda" and flashinfer_available()
    benches = []
    for vocab in args.vocab_sizes:
        for case_name in args.cases:
            for batch in args.batch_sizes:
                work = make_workload(CASES[case_name], batch, vocab, device)
                contenders = build_contenders(work, backends, graph_backends, with_flashinfer, not args.no_hf)
                benches.append(Bench(work, contenders, {name: [] for name in contenders}))
    per_round = math.ceil(args.iters / args.rounds)
    with tqdm(total=args.rounds * len(benches) * (args.warmup + per_round), unit="it") as bar:
        for round_no in range(args.rounds):
            for bench in benches:
                work = bench.work
                bar.set_description(f"round {round_no + 1}/{args.rounds} {work.case.name} B={work.batch_size}")
                measure(bench, args.warmup, per_round, bar)
    return [
        dict(
            device=device.type,
            backend=name,
            case=bench.work.case.name,
            B=bench.work.batch_size,
            V=bench.work.vocab_size,
            median_us=round(statistics.median(values), 2),
        )
        for bench in benches
        for name, values in bench.samples.items()
    ]


def floor_records(records: list[dict], bandwidth: float) -> list[dict]:
    configs = dict.fromkeys((r["device"], r["case"], r["B"], r["V"]) for r in records)
    return [
        dict(device=dev, backend=FLOOR, case=case, B=b, V=v, median_us=round(b * v * 4 / bandwidth * 1e6, 3))
        for dev, case, b, v in configs
    ]


# ------------------------------------------------------------------- batch-level logits processors

PROCESSOR_DEFAULTS = {"cpu": dict(batch_sizes=[16, 64], vocab=49152), "cuda": dict(batch_sizes=[16, 64], vocab=151936)}
BUILT_IN_NAMES = ("allowed_token_ids", "bad_words", "no_repeat_ngram_size", "thinking_token_budget")  # load order
PROCESSOR_SETS = ("none", "noop-plugin", *BUILT_IN_NAMES, "built-ins")
PROCESSOR_REFERENCE_CASE = "minp"
BUILT_INS_CPU_TARGET, NOOP_GPU_TARGET_US = 0.10, 5.0


def processor_classes(name: str) -> list:
    from sglang.srt.sampling.logits_processor import BUILT_IN_LOGITS_PROCESSORS, LogitsProcessor

    class NoOp(LogitsProcessor):
        def __init__(self, server_args, device, is_pin_memory) -> None:
            pass

        def update_state(self, batch_update) -> None:
            pass

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            return logits

        def is_argmax_invariant(self) -> bool:
            return True

    sets = {"none": [], "noop-plugin": [NoOp], "built-ins": list(BUILT_IN_LOGITS_PROCESSORS)}
    sets.update({n: [cls] for n, cls in zip(BUILT_IN_NAMES, BUILT_IN_LOGITS_PROCESSORS)})
    return sets[name]


def built_in_params(row: int, vocab: int, gen: torch.Generator) -> SamplingParams:
    """Every built-in on: 1000 allowed ids, 16 bad-word sequences of 1-3 tokens, no_repeat_ngram_size
    3, and a thinking budget the benchmark never exhausts (the prompt opens the think section)."""
    params = CASES[PROCESSOR_REFERENCE_CASE].params(row)
    params.allowed_token_ids = torch.randperm(vocab, generator=gen)[:1000].tolist()
    params.bad_words_token_ids = [torch.randint(0, vocab, (1 + k % 3,), generator=gen).tolist() for k in range(16)]
    params.no_repeat_ngram_size = 3
    params.thinking_token_budget = 10**6
    return params


def processor_pipeline(set_name: str, work: Workload, device: torch.device) -> Callable[[torch.Tensor], object]:
    """One step of the pipeline for `set_name` over the workload's rows (None for "none": no pipeline)."""
    from types import SimpleNamespace

    from sglang.srt.sampling.logits_processor import LoadedLogitsProcessors, thinking_budget

    vocab = work.vocab_size
    # No tokenizer in a micro-benchmark: the think markers are the last two ids.
    thinking_budget.think_markers = lambda server_args: ([vocab - 2], [vocab - 1])
    gen = torch.Generator().manual_seed(work.batch_size)
    prompts = work.history[:, :PROMPT_LEN].tolist()
    reqs = []
    for i, prompt in enumerate(prompts):
        # Every row sets all four parameters; the set's classes decide which of them run.
        params = built_in_params(i, vocab, gen) if set_name not in ("none", "noop-plugin") else CASES[PROCESSOR_REFERENCE_CASE].params(i)
        reqs.append(Req(f"r{i}", prompt + [vocab - 2], params))
    batch = ScheduleBatch(reqs=reqs, device=device)
    batch.loaded_logits_processors = LoadedLogitsProcessors(processor_classes(set_name), SimpleNamespace(), device)
    info = SamplingBatchInfo.from_schedule_batch(batch, vocab)
    generated = work.history[:, PROMPT_LEN:].tolist()

    def step(logits: torch.Tensor) -> object:
        for req, tokens in zip(reqs, generated):
            req.output_ids.append(tokens[len(req.output_ids) % len(tokens)])
        if info.logits_processors is None:
            return None
        return info.logits_processors.run(logits, info.rows, info.is_all_greedy)

    step.info = info  # keeps the batch alive
    return step


def time_host_and_device_us(step: Callable, logits: torch.Tensor, device: torch.device) -> tuple[float, float]:
    """(host µs the call takes, device µs between events around it; = host on the CPU)."""
    if device.type != "cuda":
        host = time_cpu_us(step, logits)
        return host, host
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter_ns()
    step(logits)
    host = (time.perf_counter_ns() - t0) / 1e3
    end.record()
    end.synchronize()
    return host, start.elapsed_time(end) * 1e3


def run_processor_bench(args: argparse.Namespace, device: torch.device) -> list[dict]:
    vocab = args.vocab_sizes[-1]
    backend = available_backends(args.backends)[-1]  # the newest: triton on CUDA
    benches = []
    for batch in args.batch_sizes:
        work = make_workload(CASES[PROCESSOR_REFERENCE_CASE], batch, vocab, device)
        contenders = {f"pipeline:{name}": processor_pipeline(name, work, device) for name in PROCESSOR_SETS}
        contenders[f"sampler-step:ours:{backend}"] = ours(backend, work)
        benches.append((work, contenders, {name: [] for name in contenders}))
    per_round = math.ceil(args.iters / args.rounds)
    with tqdm(total=args.rounds * len(benches) * (args.warmup + per_round), unit="it") as bar:
        for round_no in range(args.rounds):
            for work, contenders, samples in benches:
                bar.set_description(f"processors round {round_no + 1}/{args.rounds} B={work.batch_size}")
                buffer = torch.empty_like(work.logits)
                for it in range(args.warmup + per_round):
                    for name, step in contenders.items():
                        buffer.copy_(work.logits)
                        timed = time_host_and_device_us(step, buffer, device)
                        if it >= args.warmup:
                            samples[name].append(timed)
                    bar.update(1)
    return [
        dict(device=device.type, backend=name, case="processors", B=work.batch_size, V=work.vocab_size,
             host_us=round(statistics.median(h for h, _ in values), 2),
             median_us=round(statistics.median(d for _, d in values), 2))
        for work, _, samples in benches
        for name, values in samples.items()
    ]


def processor_lines(records: list[dict], device: torch.device) -> list[str]:
    lines = ["| B | V | contender | host µs | device µs |", "|---|---|---|---|---|"]
    lines += [f"| {r['B']} | {r['V']} | {r['backend']} | {r['host_us']:.1f} | {r['median_us']:.1f} |" for r in records]
    med = {(r["B"], r["backend"]): r for r in records}
    step = next(r for r in records if r["backend"].startswith("sampler-step"))["backend"]
    for b in sorted({r["B"] for r in records}):
        built, ref, noop = med[(b, "pipeline:built-ins")], med[(b, step)], med[(b, "pipeline:noop-plugin")]
        share = built["median_us"] / ref["median_us"]
        lines.append(f"B={b}: built-ins {built['median_us']:.1f} µs = {share:.1%} of the sampler step ({ref['median_us']:.1f} µs)"
                     + (f"; target < {BUILT_INS_CPU_TARGET:.0%} at B=64: {'MET' if share < BUILT_INS_CPU_TARGET else 'NOT MET'}"
                        if device.type == "cpu" and b == 64 else ""))
        # "none" times the benchmark's own per-step bookkeeping (one token appended per row): the
        # plugin costs what it adds on top, on the host or the device, whichever is longer.
        none = med[(b, "pipeline:none")]
        cost = max(noop["host_us"] - none["host_us"], noop["median_us"] - none["median_us"])
        lines.append(f"B={b}: no-op argmax-invariant plugin {cost:.1f} µs per step over none"
                     + (f"; target < {NOOP_GPU_TARGET_US:g} µs: {'MET' if cost < NOOP_GPU_TARGET_US else 'NOT MET'}"
                        if device.type == "cuda" else ""))
    return lines


def processors_main(args: argparse.Namespace, device: torch.device) -> None:
    started = datetime.datetime.now(datetime.timezone.utc)
    records = run_processor_bench(args, device)
    head = header(started, device, None)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    json_path = args.out_dir / f"logits_processors_{device.type}.json"
    json_path.write_text(json.dumps({"header": head, "records": records}, indent=1) + "\n")
    plot(records, json_path.with_suffix(".png"), f"Logits-processor pipeline per step, {head['machine']}")
    print(f"\n{head['date']} | {head['machine']} | torch {head['torch']} ({head['torch_threads']} threads)")
    print(f"command: {head['command']}\n")
    print("\n".join(processor_lines(records, device)))
    print(f"wrote {json_path} and {json_path.with_suffix('.png')}")


def main() -> None:
    args = parse_args()
    if args.processors:
        processors_main(args, torch.device(args.device))
        return
    started = datetime.datetime.now(datetime.timezone.utc)
    device = torch.device(args.device)
    bandwidth = copy_bandwidth(device) if device.type == "cuda" else None
    records = run(args, device)
    if bandwidth is not None:
        records += floor_records(records, bandwidth)
    # The table's ratio columns are for the last backend listed (the newest: triton on CUDA).
    ours_name = next((f"ours:{b}" for b in reversed(args.backends) if any(r["backend"] == f"ours:{b}" for r in records)), "ours")

    args.out_dir.mkdir(parents=True, exist_ok=True)
    head = header(started, device, bandwidth)
    json_path = args.out_dir / f"sampler_{device.type}.json"
    json_path.write_text(json.dumps({"header": head, "records": records}, indent=1) + "\n")
    plot(records, args.out_dir / f"sampler_{device.type}.png", f"Sampler step, {head['machine']}, torch {head['torch']}")
    print(f"\n{head['date']} | {head['machine']} | torch {head['torch']} ({head['torch_threads']} threads)")
    print(f"command: {head['command']}\n")
    print(markdown_table(records, ours_name))
    if device.type == "cuda":
        print("\n" + "\n".join(gpu_target_lines(records)))
    else:
        print("\n" + target_verdict(records, ours_name))
    print(f"wrote {json_path} and {json_path.with_suffix('.png')}")
    if args.profile:
        profile_ours(args.profile, args.backends[-1], args.vocab_sizes[-1], device)  # the newest backend, as the table
    if device.type == "cuda":
        for spec in args.host_time or ():
            host_time_ours(spec, args.backends[-1], args.vocab_sizes[-1], device)


if __name__ == "__main__":
    main()
