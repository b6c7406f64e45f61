"""The sampling step replayed from CUDA graphs against eager sampling, through the real server.

Serves a random-weight Qwen3-0.6B-shaped fp32 checkpoint twice with `--sampling-backend triton`:
with CUDA graphs (decode and sampling replayed) and with `--disable-cuda-graph` (both eager), and
compares every request's tokens: greedy, seeded with top-k / top-p / min-p and every penalty,
min_new_tokens and logit_bias, unseeded (the same step noise in both runs when the scheduler
forms the same steps), and a short request asking for logprobs, whose steps sample eagerly in
both runs (the rest of the run replays). Exit status 1 on a difference in a comparable request.
With --guidance every prompt also runs guided (sampling_params.guidance with a guide context on the
served model: cfg, mixture with a fixed alpha and with kl_symmetry, contrastive, cfg with weight 1),
greedy and seeded, whose decode steps mix inside the captured sampling graph.

  python benchmark/gpu_sampling_graph_check.py [--guidance] --out-dir OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_tp_check import SEEDED, SHAPES, serve_and_generate, write_checkpoint, write_tokenizer  # noqa: E402


def guided_variants(guide: list[int], i: int) -> dict[str, dict]:
    """Guided sampling params of prompt `i` with the guide context `guide`."""
    return {
        "guided cfg greedy": {"temperature": 0.0, "guidance": {"method": "cfg", "input_ids": guide, "weight": 2.5}},
        "guided cfg w=1 seeded": {**SEEDED, "sampling_seed": 4000 + i, "guidance": {"method": "cfg", "input_ids": guide, "weight": 1.0}},
        "guided mixture seeded": {**SEEDED, "sampling_seed": 5000 + i, "guidance": {"method": "mixture", "input_ids": guide, "alpha": 0.3}},
        "guided kl_symmetry seeded": {**SEEDED, "sampling_seed": 6000 + i,
                                      "guidance": {"method": "mixture", "input_ids": guide, "alpha": "kl_symmetry"}},
        "guided contrastive greedy+penalties": {"temperature": 0.0, "frequency_penalty": 0.5,
                                                "guidance": {"method": "contrastive", "input_ids": guide, "weight": 0.5}},
    }


def build_requests(vocab_size: int, max_new_tokens: int, guidance: bool = False) -> tuple[list[dict], list[str]]:
    """(bodies, kind of each)."""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, vocab_size - 1, (n,), generator=gen).tolist() for n in (5, 17, 40, 90, 130, 11)]
    common = dict(max_new_tokens=max_new_tokens, ignore_eos=True)
    bodies, kinds = [], []
    for i, prompt in enumerate(prompts):
        variants = {
            "greedy": {"temperature": 0.0},
            "greedy+penalties": {"temperature": 0.0, "frequency_penalty": 0.8, "repetition_penalty": 1.3},
            "seeded+penalties": {**SEEDED, "sampling_seed": 2000 + i},
            "seeded+min_new_tokens+logit_bias": {"temperature": 0.9, "top_k": 40, "sampling_seed": 3000 + i,
                                                 "min_new_tokens": 4, "logit_bias": {str(7 + i): 4.0}},
            "unseeded": {"temperature": 1.0, "top_p": 0.9},
        }
        if guidance:
            variants.update(guided_variants(prompts[(i + 1) % len(prompts)][:24], i))
        for kind, params in variants.items():
            bodies.append({"input_ids": prompt, "sampling_params": {**params, **common}})
            kinds.append(kind)
    bodies.append({"input_ids": prompts[0], "sampling_params": {**SEEDED, "sampling_seed": 5, "max_new_tokens": 6,
                                                                 "ignore_eos": True},
                   "return_logprob": True, "top_logprobs_num": 2})
    kinds.append("seeded+logprobs (eager steps)")
    return bodies, kinds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--guidance", action="store_true", help="add guided requests (mixed inside the sampling graph)")
    args = parser.parse_args()
    args.device, args.dtype = "cuda", "float32"
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="gpu_sampling_graph_")
    os.makedirs(out_dir, exist_ok=True)
    model = tempfile.mkdtemp(prefix="qwen3_random_")
    shape = SHAPES["qwen3-0.6b"]
    write_checkpoint(model, shape, torch.bfloat16)
    write_tokenizer(model, shape["vocab_size"])
    bodies, kinds = build_requests(shape["vocab_size"], args.max_new_tokens, args.guidance)
    flags = ["--sampling-backend", "triton", "--max-running-requests", "64"]
    runs = {}
    for name, extra in (("graphs", []), ("eager", ["--disable-cuda-graph"])):
        started = time.perf_counter()
        runs[name] = serve_and_generate(args, model, 1, flags + extra, bodies, os.path.join(out_dir, f"server-{name}.log"))
        print(f"{name}: ready {runs[name]['ready_s']} s, {len(bodies)} requests in {runs[name]['generate_s']} s "
              f"(total {time.perf_counter() - started:.0f} s), exit {runs[name]['exit_code']}", flush=True)
    failures = 0
    summary: dict[str, list[int]] = {}
    for i, kind in enumerate(kinds):
        same = runs["graphs"]["output_ids"][i] == runs["eager"]["output_ids"][i]
        summary.setdefault(kind, [0, 0])[0 if same else 1] += 1
        if not same and kind != "unseeded":
            failures += 1
            print(f"request {i} ({kind}) DIFFERS\n  graphs: {runs['graphs']['output_ids'][i]}\n  eager:  {runs['eager']['output_ids'][i]}")
    for kind, (same, differ) in summary.items():
        print(f"{kind}: {same} equal, {differ} differ")
    with open(os.path.join(out_dir, "sampling_graph_check.json"), "w") as f:
        json.dump({"kinds": kinds, "runs": runs, "summary": summary}, f)
    print("RESULT:", "PASS, sampling graphs equal eager sampling" if failures == 0 else f"FAIL, {failures} requests differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
