"""Soak: the reliability suite's load for minutes on one server, with figures.

Phases, on one server (deterministic mode, so every completed request must replay to the same
tokens; --enable-metrics):
1. load: --clients streaming clients for --minutes, mixed sampling parameters, --disconnect-share
   of the requests closing their connection at a random token (test/reliability's driver);
   the scheduler's load, RSS and the machine's CPU use sampled every --sample-s seconds;
2. kills: --kills streams closed after their first 1-3 chunks, 32 at a time;
3. idle: the scheduler's load must be exactly idle (no running or queued request, every request
   slot free, no KV token held by a request) after each phase;
4. replay: every completed request of the load phase sent again; its tokens must be equal.

Writes benchmark/results/soak_<date>.json and soak_<date>.png (time series; latency CDFs with
p50/p99; request outcomes). `outside_load_cores` says how much CPU other work on the machine
took meanwhile (the 2-core development machine is shared).

Usage: python benchmark/soak.py [--minutes 10] [--clients 64] [--kills 1000]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "test"), str(ROOT / "test" / "reliability")]

from bench_sampler import machine_description  # noqa: E402 - this folder is on sys.path when run as a script
from bench_serving import git_revision  # noqa: E402
from sglang.test.server_process import percentile  # noqa: E402
from reliability_utils import (  # noqa: E402
    is_idle, kill_streams, load, replay_mismatches, run_load, server, server_rss_mib, wait_idle,
)
from sglang.srt.utils.embedded_model import embedded_model_path  # noqa: E402

RESULTS_DIR = ROOT / "benchmark" / "results"
FLAGS = ("--enable-deterministic-inference", "--enable-metrics")


class Sampler(threading.Thread):
    """Every `period` seconds: the scheduler's load, the server's RSS, CPU cores used by the server
    and by everything else on the machine."""

    def __init__(self, srv: Any, period: float) -> None:
        super().__init__(daemon=True)
        self.srv, self.period = srv, period
        self.rows: list[dict[str, float]] = []
        self.missed = 0  # samples the server did not answer
        self.stop = threading.Event()
        self.start_time = time.monotonic()

    def _server_cpu_s(self) -> float:
        proc = psutil.Process(self.srv.proc.pid)
        return sum(sum(p.cpu_times()[:2]) for p in [proc, *proc.children(recursive=True)])

    def run(self) -> None:
        last = (time.monotonic(), sum(psutil.cpu_times()[:3]), self._server_cpu_s(), sum(psutil.Process().cpu_times()[:2]))
        while not self.stop.wait(self.period):
            now = (time.monotonic(), sum(psutil.cpu_times()[:3]), self._server_cpu_s(), sum(psutil.Process().cpu_times()[:2]))
            wall = now[0] - last[0]
            try:
                state = load(self.srv)
            except AssertionError:  # a 503: the scheduler did not answer in time; counted, not fatal
                self.missed += 1
                continue
            self.rows.append({
                "t_s": now[0] - self.start_time,
                "num_running_reqs": state["num_running_reqs"], "num_queue_reqs": state["num_queue_reqs"],
                "token_usage": state["token_usage"], "rss_mib": server_rss_mib(self.srv),
                "server_cores": (now[2] - last[2]) / wall,
                "outside_load_cores": max(0.0, (now[1] - last[1]) - (now[2] - last[2]) - (now[3] - last[3])) / wall,
            })
            last = now


def latency_summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"p50_s": percentile(values, 0.5), "p90_s": percentile(values, 0.9), "p99_s": percentile(values, 0.99),
            "max_s": max(values)}


def plot(result: dict, samples: list[dict], report: Any, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    t = [s["t_s"] / 60 for s in samples]
    ax = axes[0][0]
    ax.plot(t, [s["num_running_reqs"] for s in samples], label="running requests")
    ax.plot(t, [s["num_queue_reqs"] for s in samples], label="queued requests")
    ax.set_xlabel("minutes")
    ax.legend(loc="upper left")
    twin = ax.twinx()
    twin.plot(t, [100 * s["token_usage"] for s in samples], color="tab:red", label="KV token usage %")
    twin.legend(loc="upper right")
    ax.set_title("Scheduler load during the soak")
    ax = axes[0][1]
    ax.plot(t, [s["rss_mib"] for s in samples], label="server RSS (MiB)")
    ax.axhline(result["rss_mib"]["before"], color="gray", linestyle="--", label="before")
    ax.axhline(result["rss_mib"]["after"], color="black", linestyle=":", label="after (idle)")
    ax.set_xlabel("minutes")
    ax.legend()
    ax.set_title("Server memory")
    ax = axes[1][0]
    for name, values in (("TTFT", [r.ttft_s for r in report.records if r.ttft_s is not None]),
                         ("end-to-end", [r.e2e_s for r in report.completed() if r.e2e_s is not None])):
        if not values:
            continue
        ordered = sorted(values)
        ax.plot(ordered, [i / len(ordered) for i in range(len(ordered))], label=f"{name} (p99 {percentile(values, 0.99):.2f} s)")
    ax.set_xscale("log")
    ax.set_xlabel("seconds")
    ax.set_ylabel("share of requests")
    ax.legend()
    ax.set_title("Latency CDFs")
    ax = axes[1][1]
    counts = result["requests"]
    names = ["sent", "completed", "disconnected", "errors", "lost", "replay mismatches"]
    values = [counts["sent"], counts["completed"], counts["disconnected"], counts["errors"], counts["lost"],
              result["replay"]["mismatches"]]
    ax.bar(names, values, color=["tab:blue", "tab:green", "tab:orange", "tab:red", "tab:red", "tab:red"])
    for i, v in enumerate(values):
        ax.text(i, v, str(v), ha="center", va="bottom")
    ax.set_title(f"Requests ({result['tokens']} tokens); then {result['kills']['count']} kills")
    plt.setp(ax.get_xticklabels(), rotation=20)
    fig.suptitle(f"Soak {result['date']} on {result['machine']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--disconnect-share", type=float, default=0.1)
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--tag", default="", help="Suffix of the result files' names.")
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    with server("--model-path", embedded_model_path(), *FLAGS) as srv:
        run_load(srv, seconds=5, clients=8)  # warm-up
        idle_before = wait_idle(srv)
        rss_before = server_rss_mib(srv)
        sampler = Sampler(srv, args.sample_s)
        sampler.start()
        bar = tqdm(total=None, desc="load requests")
        report = run_load(srv, seconds=60 * args.minutes, clients=args.clients, disconnect_share=args.disconnect_share,
                          progress=lambda record: bar.update(1))
        bar.close()
        idle_after_load = wait_idle(srv)
        kill_bar = tqdm(total=args.kills, desc="kills")
        kills = kill_streams(srv, args.kills, progress=lambda record: kill_bar.update(1))
        kill_bar.close()
        idle_after_kills = wait_idle(srv)
        sampler.stop.set()
        sampler.join()
        rss_after = server_rss_mib(srv)
        completed = report.completed()
        print(f"replaying {len(completed)} completed requests")
        mismatches = replay_mismatches(srv, completed)
        final = load(srv)
    errors = report.errors()
    lost = [r for r in errors if r.status == 0]  # no response at all
    result = {
        "date": started.isoformat(timespec="seconds"),
        "machine": machine_description(torch.device("cpu")),
        "commit": git_revision(),
        "flags": list(FLAGS),
        "minutes": args.minutes, "clients": args.clients, "disconnect_share": args.disconnect_share,
        "requests": {"sent": len(report.records), "completed": len(completed),
                     "disconnected": len(report.records) - len(completed), "errors": len(errors), "lost": len(lost)},
        "tokens": sum(len(r.output_ids) for r in report.records),
        "tokens_per_s": sum(len(r.output_ids) for r in report.records) / report.seconds,
        "ttft": latency_summary([r.ttft_s for r in report.records if r.ttft_s is not None]),
        "e2e": latency_summary([r.e2e_s for r in completed if r.e2e_s is not None]),
        "rss_mib": {"before": round(rss_before, 1), "after": round(rss_after, 1),
                    "peak": round(max([s["rss_mib"] for s in sampler.rows] + [rss_after]), 1)},
        "samples_missed": sampler.missed,
        "kv": {"before": idle_before, "after_load": idle_after_load, "after_kills": idle_after_kills},
        "kills": {"count": len(kills), "failed": sum(1 for r in kills if r.error or r.status != 200),
                  "idle_after": is_idle(idle_after_kills)},
        "replay": {"requests": len(completed), "mismatches": len(mismatches)},
        "final_idle": is_idle(final),
        "outside_load_cores_mean": sum(s["outside_load_cores"] for s in sampler.rows) / max(len(sampler.rows), 1),
        "server_cores_mean": sum(s["server_cores"] for s in sampler.rows) / max(len(sampler.rows), 1),
        "samples": sampler.rows,
        "error_examples": [{"body": r.body, "status": r.status, "error": r.error, "finish_reason": r.finish_reason} for r in errors[:5]],
    }
    RESULTS_DIR.mkdir(exist_ok=True)
    stem = f"soak_{started.strftime('%Y%m%d')}{args.tag}"
    (RESULTS_DIR / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, sampler.rows, report, RESULTS_DIR / f"{stem}.png")
    summary = {k: result[k] for k in ("requests", "tokens", "ttft", "e2e", "rss_mib", "kills", "replay", "final_idle",
                                     "outside_load_cores_mean")}
    print(json.dumps(summary, indent=1))
    print(f"wrote {RESULTS_DIR / stem}.json and .png")


if __name__ == "__main__":
    main()
