"""Where a serving step's host time goes: py-spy samples the server's processes while a client
keeps N requests in flight, then the scheduler process's samples are summarised by function
(inclusive and self share). Serves a random-weight Qwen3-0.6B-shaped bf16 checkpoint (the
benchmark preset) with extra server flags per run, e.g. speculative decoding against none:

  python benchmark/gpu_profile_server.py --out-dir OUT --tokenizer .carry_engine/tokenizer \\
      --run off= --run ngram="--speculative-algorithm NGRAM --speculative-num-draft-tokens 8"

Needs `py-spy` on PATH (the device machines: pip install the carried wheel). Each run writes
OUT/<name>.collapsed (py-spy's raw collapsed stacks), OUT/<name>.log and prints the summary.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_tp_check import post_json, wait_healthy  # noqa: E402
from profile_processes import read, short  # noqa: E402
from random_checkpoint import write_preset  # noqa: E402
from sglang.test.server_process import free_port  # noqa: E402

CYCLE = list(range(1000, 1016))


def keep_busy(url: str, n: int, max_new_tokens: int, bias: str, stop: threading.Event, extra: dict) -> list[float]:
    """N clients each sending greedy requests (with `extra` sampling params) until `stop`; tokens/s
    of each finished request."""
    params = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True, **extra}
    # Random weights repeat text only when steered to (NGRAM then finds drafts): a token cycle,
    # or one token (every draft accepted).
    if bias == "cycle":
        params["logit_bias"] = {str(t): 30.0 for t in CYCLE}
    elif bias == "constant":
        params["logit_bias"] = {str(CYCLE[0]): 100.0}
    rates: list[float] = []

    def client() -> None:
        while not stop.is_set():
            start = time.perf_counter()
            out = post_json(url, {"input_ids": CYCLE * 8, "sampling_params": params})
            first = out[0] if isinstance(out, list) else out  # n > 1 answers a list
            rates.append(first["meta_info"]["completion_tokens"] / (time.perf_counter() - start))

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        for future in [pool.submit(client) for _ in range(n)]:
            future.result()
    return rates


def summarise(collapsed: str, top: int) -> list[str]:
    """Inclusive and self sample shares per function over the scheduler process (the process of
    which some stack passes through managers/scheduler.py)."""
    stacks = read(collapsed)
    processes = {process for process, frames, _ in stacks if any("scheduler.py" in frame for frame in frames)}
    inclusive: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()
    total = 0
    for process, frames, n in stacks:
        if process not in processes:
            continue
        total += n
        names = [short(frame) for frame in frames]
        for name in set(names):
            inclusive[name] += n
        if names:
            own[names[-1]] += n
    lines = [f"{total} active samples in the scheduler process", "inclusive:"]
    lines += [f"  {100 * c / max(total, 1):5.1f}%  {name}" for name, c in inclusive.most_common(top)]
    lines.append("self:")
    lines += [f"  {100 * c / max(total, 1):5.1f}%  {name}" for name, c in own.most_common(top)]
    return lines


def profile_run(args: argparse.Namespace, model: str, name: str, flags: list[str]) -> None:
    port = free_port()
    log_path = os.path.join(args.out_dir, f"{name}.log")
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--port", str(port),
               "--context-length", "4096", "--max-running-requests", str(max(64, args.n)), *flags]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(proc, f"http://127.0.0.1:{port}", log_path)
            url = f"http://127.0.0.1:{port}/generate"
            post_json(url, {"input_ids": CYCLE * 8, "sampling_params": {"max_new_tokens": 16}})  # warm-up
            stop = threading.Event()
            box: dict = {}
            client = threading.Thread(target=lambda: box.update(
                rates=keep_busy(url, args.n, args.max_new_tokens, args.bias, stop, json.loads(args.params))))
            client.start()
            time.sleep(2)  # the request loop reaches its steady state before sampling starts
            collapsed = os.path.join(args.out_dir, f"{name}.collapsed")
            subprocess.run(["py-spy", "record", "--pid", str(proc.pid), "--subprocesses", "--duration", str(args.seconds),
                            "--rate", "500", "--format", "raw", "--output", collapsed, "--nonblocking"],
                           check=True, stdout=subprocess.DEVNULL)
            stop.set()
            client.join()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    rates = box.get("rates", [])
    print(f"== {name}: {' '.join(flags) or '(no extra flags)'}")
    print(f"mean per-request tok/s {sum(rates) / max(len(rates), 1):.1f} over {len(rates)} requests (N={args.n})")
    print("\n".join(summarise(collapsed, args.top)), flush=True)
    with open(os.path.join(args.out_dir, f"{name}.json"), "w") as f:
        json.dump({"name": name, "flags": flags, "n": args.n, "per_request_tok_per_s": rates}, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, help='NAME=FLAGS (shell-quoted server flags)')
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--seconds", type=int, default=12)
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--bias", choices=["none", "cycle", "constant"], default="none",
                        help="steer the greedy rows to repeat a token cycle or one token")
    parser.add_argument("--params", default="{}", help='extra sampling params (JSON), e.g. {"beam_width": 4, "n": 4}')
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    model = os.path.join(tempfile.mkdtemp(prefix="profile_ckpt_"), "target")
    write_preset(model, "qwen3-0.6b", args.tokenizer, device="cuda")
    for spec in args.run:
        name, _, flags = spec.partition("=")
        flags = flags.replace("{model}", model)
        profile_run(args, model, name, shlex.split(flags))


if __name__ == "__main__":
    main()
