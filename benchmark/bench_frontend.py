"""The front end's ceiling: output tokens/s that the HTTP + tokenizer + detokenizer path sustains
with 1, 2 and 4 tokenizer workers (--tokenizer-worker-num), on a model too small to be the limit.

For each worker count W and concurrency N: a server is started with --tokenizer-worker-num W
(plus --server-args), N streamed POST /generate requests are sent at once, each generating exactly
--new-tokens tokens (greedy, ignore_eos, N distinct prompts), one untimed warm-up run, then
--rounds timed runs; output tok/s = all output tokens / wall (release -> last request done). The
client is bench_serving_gpu's: several processes with a thread per request, so that parsing the
SSE events does not become the limit being measured.

The model: on the CPU a one-layer Qwen3 with hidden size 64 and the embedded tokenizer's
vocabulary, served with --load-format dummy (random weights, no file to write), so a decode step
of 256 rows costs milliseconds; on a GPU (--preset qwen3-0.6b) the 0.6B-shaped config with dummy
weights. Records go to benchmark/results/frontend/<tag>.json and a markdown table beside it.

Usage (repo root, PYTHONPATH=python):
  python benchmark/bench_frontend.py --tag cpu                    # CPU: N = 64, 256; W = 1, 2, 4
  python benchmark/bench_frontend.py --tag h100x2 --preset qwen3-0.6b --concurrency 256 \\
      --server-args "--dp-size 2 --detokenizer-mode process --detokenizer-worker-num 2" \\
      --tokenizer .carry_engine/tokenizer --new-tokens 512          # the lead's two-GPU run
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_serving_gpu import Client, cpu_name, ensure_checkpoint, failures, find_tokenizer, git_revision
from sglang.test.server_process import ServerProcess, free_port

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE / "results" / "frontend"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,", "1, 2, 3, 4,"]
# The CPU model: one small layer, so the step costs little next to the front end's work per token.
CPU_CONFIG = dict(
    architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=64, intermediate_size=128,
    num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True, hidden_act="silu", torch_dtype="float32",
)


def bodies(n: int, new_tokens: int) -> list[bytes]:
    params = {"temperature": 0.0, "max_new_tokens": new_tokens, "ignore_eos": True}
    return [json.dumps({"text": f"{PROMPTS[i % len(PROMPTS)]} (request {i})", "sampling_params": params,
                        "stream": True}).encode() for i in range(n)]


def model_folder(args: argparse.Namespace) -> str:
    """A config.json and a tokenizer, served with --load-format dummy."""
    folder = args.model_dir or tempfile.mkdtemp(prefix="bench_frontend_model_")
    if args.preset != "cpu-tiny":
        ensure_checkpoint(folder, args.tokenizer, None, args.preset, dummy=True)
        return folder
    tokenizer = find_tokenizer(args.tokenizer)
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(tokenizer))
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / "config.json").write_text(json.dumps({**CPU_CONFIG, "vocab_size": vocab}, indent=1))
    AutoTokenizer.from_pretrained(tokenizer).save_pretrained(folder)
    return folder


def start_server(args: argparse.Namespace, folder: str, workers: int, max_n: int) -> ServerProcess:
    port = free_port()
    argv = ["--model-path", folder, "--tokenizer-path", folder, "--load-format", "dummy", "--port", str(port),
            "--max-running-requests", str(max_n), "--tokenizer-worker-num", str(workers), "--log-level", "warning",
            *shlex.split(args.server_args)]
    log = Path(tempfile.mkdtemp(prefix="bench_frontend_")) / "server.log"
    server = ServerProcess(argv, port, log_path=log, own_process_group=True)
    print(f"starting: {shlex.join(['python', *server.command[1:]])} (log {log})", flush=True)
    try:
        server.wait_healthy(args.server_timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


def measure(client: Client, n: int, args: argparse.Namespace) -> dict[str, Any]:
    batch = bodies(n, args.new_tokens)
    client.run(batch)  # warm-up
    tokens, wall, results = 0, 0.0, []
    for _ in range(args.rounds):
        got, seconds = client.run(batch)
        tokens += sum(r["tokens"] for r in got)
        wall += seconds
        results += got
    failed, messages = failures(results, args.new_tokens)
    return {"output_tok_s": tokens / wall, "wall_s": wall, "output_tokens": tokens, "error_count": failed,
            "errors": messages}


def table(records: list[dict[str, Any]]) -> str:
    ns = sorted({r["N"] for r in records})
    lines = ["| tokenizer workers | " + " | ".join(f"N={n} tok/s" for n in ns) + " |",
             "|---|" + "---|" * len(ns)]
    for workers in sorted({r["tokenizer_workers"] for r in records}):
        cells = []
        for n in ns:
            match = [r for r in records if r["tokenizer_workers"] == workers and r["N"] == n]
            cells.append(f"{match[0]['output_tok_s']:,.0f}" if match else "-")
        lines.append(f"| {workers} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tag", default="cpu")
    parser.add_argument("--preset", default="cpu-tiny", help="cpu-tiny, or a random_checkpoint.py preset (qwen3-0.6b)")
    parser.add_argument("--model-dir", default=None, help="where to write the config (default: a temporary folder)")
    parser.add_argument("--tokenizer", default=".carry_engine/tokenizer")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--client-procs", type=int, default=4)
    parser.add_argument("--server-args", default="", help="more server flags, e.g. '--dp-size 2'")
    parser.add_argument("--server-timeout-s", type=float, default=900.0)
    args = parser.parse_args()
    folder = model_folder(args)
    head = {"tag": args.tag, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git": git_revision(), "cpu": cpu_name(), "preset": args.preset, "new_tokens": args.new_tokens,
            "rounds": args.rounds, "server_args": args.server_args, "command": shlex.join(["python", *sys.argv])}
    records: list[dict[str, Any]] = []
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for workers in args.workers:
        server = start_server(args, folder, workers, max(args.concurrency))
        client = Client(server.url, args.client_procs)
        try:
            for n in args.concurrency:
                t0 = time.monotonic()
                record = {"tokenizer_workers": workers, "N": n, **measure(client, n, args)}
                print(f"W={workers} N={n}: {record['output_tok_s']:,.0f} tok/s ({time.monotonic() - t0:.0f} s, "
                      f"{record['error_count']} errors)", flush=True)
                records.append(record)
                (OUT_DIR / f"{args.tag}.json").write_text(json.dumps({"head": head, "records": records}, indent=1))
                (OUT_DIR / f"{args.tag}.md").write_text(table(records))
        finally:
            client.close()
            server.stop()
    print(table(records))


if __name__ == "__main__":
    main()
