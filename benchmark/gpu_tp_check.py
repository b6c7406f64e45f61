"""TP=2 against TP=1 through the real server, on a random-weight Qwen3 checkpoint.

Writes a Qwen3-0.6B-shaped checkpoint (random weights, tied embeddings, safetensors) and a
word-level tokenizer for its vocabulary, then serves it with `python -m sglang.launch_server`
at TP=1 and at TP=2 (overlap schedule on, then off) with SGLANG_TP_CHECK_TOKEN_AGREEMENT=1, and
compares the tokens of greedy and seeded (penalised) requests. An unseeded request rides along
in every batch: it cannot be compared with TP=1, but the agreement check would stop the server
if the ranks drew different tokens for it. Exit status 1 on any difference.

In float32 TP=2 only sums in another order, so tokens must be equal. In bfloat16 (`--dtype
bfloat16`) that reordering moves logits by a few ulps and a near tie can flip a token, so the
check compares the output logprobs on each request's common token prefix against
`--logprob-tolerance` instead (the single-GPU graph-vs-eager tolerance) and reports how many
tokens agree.

  python benchmark/gpu_tp_check.py --device cuda --out-dir OUT        # two GPUs, NCCL
  python benchmark/gpu_tp_check.py --device cuda --dtype bfloat16     # logprobs within tolerance
  python benchmark/gpu_tp_check.py --device cpu --shape tiny          # the same flow on gloo
  python benchmark/gpu_tp_check.py --tp-size 4 --shape llama3.1-70b-2layers --graphs-vs-eager  # graphs = eager at TP=4
  python benchmark/gpu_tp_check.py --device cuda --tp-size 1 --dp-size 2 --dtype bfloat16   # two replicas on one GPU

With --dp-size D the server also runs as D data-parallel replicas (of --tp-size ranks each; all
on GPU 0 with --gpu-id-step 0 when one GPU is visible), compared with TP=1 the same way; at
--tp-size 1 only that run is made.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

import torch

from sglang.test.server_process import free_port

SHAPES = {
    "qwen3-0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=3072, vocab_size=151936),
    # Llama-3.1-70B's layer shape at two layers, with a 32k vocabulary to keep the fp32 file small.
    "llama3.1-70b-2layers": dict(hidden_size=8192, num_hidden_layers=2, num_attention_heads=64, num_key_value_heads=8,
                                 head_dim=128, intermediate_size=28672, vocab_size=32000),
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=32, intermediate_size=256, vocab_size=1024),
}
WEIGHT_STD = 0.02
SEEDED = dict(temperature=0.8, top_p=0.95, top_k=100, min_p=0.01, frequency_penalty=0.3, presence_penalty=0.2,
              repetition_penalty=1.1)
HEALTH_TIMEOUT_S = 600
LLAMA_SHAPES = ("llama3.1-70b-2layers",)


# ------------------------------------------------------------------ checkpoint and tokenizer


def write_checkpoint(folder: str, shape: dict[str, int], dtype: torch.dtype, seed: int = 0, llama: bool = False) -> None:
    """config.json + model.safetensors with N(0, WEIGHT_STD) projections and ~1 norms: a Qwen3
    (q/k norms, tied embeddings) or, with `llama`, a Llama-3.1 checkpoint (separate LM head)."""
    from safetensors.torch import save_file

    h, d, v = shape["hidden_size"], shape["head_dim"], shape["vocab_size"]
    q, kv, inter = shape["num_attention_heads"] * d, shape["num_key_value_heads"] * d, shape["intermediate_size"]
    gen = torch.Generator().manual_seed(seed)

    def randn(*size: int) -> torch.Tensor:
        return (torch.randn(*size, generator=gen) * WEIGHT_STD).to(dtype)

    def norm(size: int) -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(size, generator=gen)).to(dtype)

    tensors = {"model.embed_tokens.weight": randn(v, h), "model.norm.weight": norm(h)}
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": norm(h), p + "post_attention_layernorm.weight": norm(h),
            p + "self_attn.q_proj.weight": randn(q, h), p + "self_attn.k_proj.weight": randn(kv, h),
            p + "self_attn.v_proj.weight": randn(kv, h), p + "self_attn.o_proj.weight": randn(h, q),
            p + "mlp.gate_proj.weight": randn(inter, h), p + "mlp.up_proj.weight": randn(inter, h),
            p + "mlp.down_proj.weight": randn(h, inter),
        }
        if not llama:
            tensors |= {p + "self_attn.q_norm.weight": norm(d), p + "self_attn.k_norm.weight": norm(d)}
    family = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", rope_theta=1000000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=True)
    if llama:
        tensors["lm_head.weight"] = randn(v, h)
        family = dict(architectures=["LlamaForCausalLM"], model_type="llama", rope_theta=500000.0, rms_norm_eps=1e-5,
                      tie_word_embeddings=False)
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    config = dict(max_position_embeddings=4096, hidden_act="silu", torch_dtype=str(dtype).removeprefix("torch."),
                  eos_token_id=shape["vocab_size"] - 1, **family, **shape)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


def write_tokenizer(folder: str, vocab_size: int) -> None:
    """A word-level tokenizer "t0" .. "t{V-1}": requests carry input_ids, the detokenizer needs names."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    config = dict(tokenizer_class="PreTrainedTokenizerFast", unk_token="t0", eos_token=f"t{vocab_size - 1}",
                  model_max_length=4096)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)


# ------------------------------------------------------------------ requests


def build_requests(vocab_size: int, max_new_tokens: int, logprobs: bool, seed: int = 0) -> tuple[list[dict], int]:
    """(request bodies, how many leading ones are comparable with TP=1): greedy and seeded
    penalised requests over four prompts, then one unseeded request."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab_size - 1, (n,), generator=gen).tolist() for n in (7, 19, 33, 61)]
    common = dict(max_new_tokens=max_new_tokens, ignore_eos=True)
    bodies = [{"input_ids": p, "sampling_params": {"temperature": 0.0, **common}} for p in prompts]
    bodies += [
        {"input_ids": p, "sampling_params": {**SEEDED, "sampling_seed": 1000 + i, **common}}
        for i, p in enumerate(prompts)
    ]
    comparable = len(bodies)
    bodies.append({"input_ids": prompts[0], "sampling_params": {"temperature": 1.0, **common}})
    for body in bodies:
        body["return_logprob"] = logprobs
    return bodies, comparable


def post_json(url: str, body: dict, timeout: float = 600) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


# ------------------------------------------------------------------ one server


def serve_and_generate(args: argparse.Namespace, model: str, tp: int, flags: list[str], bodies: list[dict],
                       log_path: str) -> dict[str, Any]:
    """Start the server, send every body at once, stop it; tokens and timings."""
    port = free_port()
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--tp-size", str(tp),
               "--device", args.device, "--dtype", args.dtype, "--port", str(port), "--context-length", "1024",
               "--max-running-requests", "16", "--max-total-tokens", "16384", *flags]
    env = {**os.environ, "SGLANG_TP_CHECK_TOKEN_AGREEMENT": "1"}
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_healthy(proc, f"http://127.0.0.1:{port}", log_path)
            ready_s = time.perf_counter() - start
            start = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
                url = f"http://127.0.0.1:{port}/generate"
                results = list(pool.map(lambda body: post_json(url, body), bodies))
            generate_s = time.perf_counter() - start
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    return {"command": " ".join(command[1:]), "ready_s": round(ready_s, 1), "generate_s": round(generate_s, 2),
            "output_ids": [r["output_ids"] for r in results], "texts": [r.get("text") for r in results],
            "logprobs": [[e[0] for e in r["meta_info"].get("output_token_logprobs", [])] for r in results],
            "finish_reasons": [r["meta_info"]["finish_reason"] for r in results],
            "cached_tokens": [r["meta_info"].get("cached_tokens", 0) for r in results], "exit_code": proc.returncode}


def wait_healthy(proc: subprocess.Popen, url: str, log_path: str) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}:\n{open(log_path).read()[-5000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=10) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # still loading, or its first generation still compiling kernels
        time.sleep(0.5)  # polling a server that is still loading
    raise RuntimeError(f"server not healthy after {HEALTH_TIMEOUT_S} s")


# ------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--shape", default="qwen3-0.6b", choices=list(SHAPES))
    parser.add_argument("--dtype", default="float32", help="Serving dtype (float32: TP=2 sums in another order only).")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--tp-size", type=int, default=2)
    parser.add_argument("--dp-size", type=int, default=1, help="also serve as this many data-parallel replicas")
    parser.add_argument("--logprob-tolerance", type=float, default=0.05,
                        help="bfloat16: largest |logprob(TP=1) - logprob(TP=N)| allowed on the common token prefix")
    parser.add_argument("--out-dir", default=None, help="Where server logs and results.json go.")
    parser.add_argument("--graphs-vs-eager", action="store_true",
                        help="compare TP=--tp-size with CUDA graphs against TP=--tp-size eager (not against TP=1)")
    args = parser.parse_args()
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="gpu_tp_check_")
    os.makedirs(out_dir, exist_ok=True)
    model = tempfile.mkdtemp(prefix="qwen3_random_")
    shape = SHAPES[args.shape]

    start = time.perf_counter()
    write_checkpoint(model, shape, torch.bfloat16 if args.shape == "qwen3-0.6b" else torch.float32,
                     llama=args.shape in LLAMA_SHAPES)
    write_tokenizer(model, shape["vocab_size"])
    print(f"checkpoint {args.shape} {shape} written to {model} in {time.perf_counter() - start:.1f} s", flush=True)

    exact = args.dtype == "float32"
    bodies, comparable = build_requests(shape["vocab_size"], args.max_new_tokens, logprobs=not exact)
    reference_name = f"tp{args.tp_size}-eager" if args.graphs_vs_eager else "tp1"
    runs = {reference_name: (args.tp_size, ["--disable-cuda-graph"]) if args.graphs_vs_eager else (1, [])}
    if args.graphs_vs_eager:
        runs[f"tp{args.tp_size}-graphs"] = (args.tp_size, [])
    elif args.tp_size > 1:
        runs[f"tp{args.tp_size}-overlap"] = (args.tp_size, [])
        runs[f"tp{args.tp_size}-no-overlap"] = (args.tp_size, ["--disable-overlap-schedule"])
    if args.dp_size > 1 and not args.graphs_vs_eager:
        share = args.device == "cuda" and torch.cuda.device_count() < args.dp_size * args.tp_size
        runs[f"dp{args.dp_size}-tp{args.tp_size}"] = (
            args.tp_size, ["--dp-size", str(args.dp_size), *(["--gpu-id-step", "0"] if share else [])])
    results = {}
    for name, (tp, flags) in runs.items():
        results[name] = serve_and_generate(args, model, tp, flags, bodies, os.path.join(out_dir, f"server-{name}.log"))
        r = results[name]
        print(f"{name}: ready in {r['ready_s']} s, {len(bodies)} requests x {args.max_new_tokens} tokens in "
              f"{r['generate_s']} s, server exit code {r['exit_code']}", flush=True)

    reference = results[reference_name]
    failures = 0
    for name, r in results.items():
        if name == reference_name:
            continue
        for i in range(comparable):
            kind = "greedy" if i < comparable // 2 else "seeded+penalties"
            ok, verdict = (compare_tokens if exact else compare_logprobs)(reference, r, i, args.logprob_tolerance)
            failures += not ok
            print(f"{name} request {i} ({kind}): {verdict}")
        print(f"{name} unseeded request: {len(r['output_ids'][comparable])} tokens, ranks agreed at every step")
    print(f"first greedy request, {reference_name} tokens: {reference['output_ids'][0][:16]} ...")
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"shape": args.shape, "device": args.device, "dtype": args.dtype, "runs": results}, f)
    what = f"outputs equal {reference_name}" if exact else f"logprobs within {args.logprob_tolerance} of {reference_name}"
    print("RESULT:", f"PASS, {what}" if failures == 0 else f"FAIL, {failures} requests differ")
    return 1 if failures else 0


def compare_tokens(reference: dict, run: dict, i: int, tolerance: float) -> tuple[bool, str]:
    ref, got = reference["output_ids"][i], run["output_ids"][i]
    return ref == got, "== reference" if ref == got else f"DIFFERS from the reference\n  ref: {ref}\n  got: {got}"


def compare_logprobs(reference: dict, run: dict, i: int, tolerance: float) -> tuple[bool, str]:
    """The logprobs of the tokens both runs drew, up to the first token where they part."""
    ref_ids, got_ids = reference["output_ids"][i], run["output_ids"][i]
    common = next((k for k, (a, b) in enumerate(zip(ref_ids, got_ids)) if a != b), min(len(ref_ids), len(got_ids)))
    diffs = [abs(a - b) for a, b in zip(reference["logprobs"][i][:common], run["logprobs"][i][:common])]
    worst = max(diffs, default=0.0)
    ok = worst <= tolerance
    return ok, f"{common}/{len(ref_ids)} tokens equal, max |dlogprob| {worst:.4f} {'<=' if ok else '>'} {tolerance}"


if __name__ == "__main__":
    sys.exit(main())
