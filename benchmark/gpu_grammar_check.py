"""Structured outputs on the GPU engine, through the real server (CUDA graphs, sampling graphs,
overlap schedule), on a random-weight Qwen3-0.6B-shaped fp32 checkpoint with the embedded
SmolLM2 tokenizer (so JSON is expressible in its tokens; random weights make the grammar do all
the work). One concurrent batch mixes grammar rows (json_schema / regex / ebnf, greedy and
seeded) with unconstrained greedy, penalised, biased and seeded rows:
- every grammar row's text validates (jsonschema / re.fullmatch / the EBNF's language);
- every non-grammar row equals its run in a batch without grammar rows (rows independent);
- overlap on equals overlap off for every row; llguidance and the pytorch sampling backend give
  valid grammar outputs and the same non-grammar rows;
- tok/s of 64 concurrent requests: unconstrained, a permissive regex, a JSON schema.
Exit status 1 on any failure.

  python benchmark/gpu_grammar_check.py --tokenizer .carry_engine/tokenizer --out-dir OUT
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile

import jsonschema
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_tp_check import SEEDED, SHAPES, serve_and_generate, write_checkpoint  # noqa: E402

# Strings by pattern, not maxLength: xgrammar 0.2.8's bounded-length strings admit raw control
# characters (invalid JSON; docs/structured_outputs.md). Closed objects: llguidance, like JSON
# Schema, allows extra keys unless told otherwise; xgrammar closes objects by default.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z ]{0,12}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,6}$"}, "maxItems": 3},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "tags", "active"],
    "additionalProperties": False,
}
DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
CHOICE = "(yes|no|maybe)"
EBNF = 'root ::= "The answer is " ("A" | "B" | "C") "."'
MAX_NEW = 96


def grammar_rows(prompts: list[list[int]]) -> list[tuple[dict, str]]:
    """(body, kind) of the constrained requests."""
    rows = []
    for i, prompt in enumerate(prompts):
        for kind, grammar, params in [
            ("json greedy", {"json_schema": json.dumps(SCHEMA)}, {"temperature": 0.0}),
            ("json seeded", {"json_schema": json.dumps(SCHEMA)}, {**SEEDED, "sampling_seed": 10 + i}),
            ("regex date seeded", {"regex": DATE}, {"temperature": 1.0, "sampling_seed": 20 + i}),
            ("regex choice greedy", {"regex": CHOICE}, {"temperature": 0.0}),
            ("ebnf seeded", {"ebnf": EBNF}, {"temperature": 1.0, "sampling_seed": 30 + i}),
        ]:
            rows.append(({"input_ids": prompt, "sampling_params": {**grammar, **params, "max_new_tokens": MAX_NEW}}, kind))
    return rows


def plain_rows(prompts: list[list[int]]) -> list[tuple[dict, str]]:
    rows = []
    for i, prompt in enumerate(prompts):
        for kind, params in [
            ("plain greedy", {"temperature": 0.0}),
            ("plain seeded+penalties", {**SEEDED, "sampling_seed": 40 + i}),
            ("plain biased", {"temperature": 0.0, "logit_bias": {str(100 + i): 8.0}, "frequency_penalty": 0.5}),
        ]:
            rows.append(({"input_ids": prompt, "sampling_params": {**params, "max_new_tokens": 32, "ignore_eos": True}}, kind))
    return rows


def valid(kind: str, text: str, finish: dict) -> bool:
    if finish.get("type") != "stop":
        return False
    try:
        if kind.startswith("json"):
            jsonschema.validate(json.loads(text), SCHEMA)
            return True
    except (ValueError, jsonschema.ValidationError):
        return False
    if kind.startswith("regex date"):
        return re.fullmatch(DATE, text) is not None
    if kind.startswith("regex choice"):
        return re.fullmatch(CHOICE, text) is not None
    return re.fullmatch(r"The answer is [ABC]\.", text) is not None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True, help="The embedded SmolLM2 tokenizer's folder.")
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--device", default="cuda", help="cpu with --shape tiny: a quick dry run of the script")
    parser.add_argument("--shape", default="qwen3-0.6b", choices=list(SHAPES))
    args = parser.parse_args()
    args.dtype = "float32"
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="gpu_grammar_")
    os.makedirs(out_dir, exist_ok=True)
    model = tempfile.mkdtemp(prefix="qwen3_random_")
    shape = {**SHAPES[args.shape], "vocab_size": 49152}
    write_checkpoint(model, shape, torch.float32)
    for name in os.listdir(args.tokenizer):
        shutil.copy(os.path.join(args.tokenizer, name), model)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 49151, (n,), generator=gen).tolist() for n in (6, 23, 51)]
    mixed = grammar_rows(prompts) + plain_rows(prompts)
    bodies, kinds = [b for b, _ in mixed], [k for _, k in mixed]
    plain = [b for b, k in mixed if k.startswith("plain")]
    # Random weights would fill max_new_tokens with JSON's free whitespace.
    flags = ["--max-running-requests", "64", "--constrained-json-disable-any-whitespace"]
    runs = {}
    for name, extra, batch in [
        ("default", [], bodies),
        ("plain-only", [], plain),
        ("no-overlap", ["--disable-overlap-schedule"], bodies),
        ("llguidance", ["--grammar-backend", "llguidance"], bodies),
        ("pytorch-sampler", ["--sampling-backend", "pytorch"], bodies),
    ]:
        runs[name] = serve_and_generate(args, model, 1, flags + extra, batch, os.path.join(out_dir, f"server-{name}.log"))
        print(f"{name}: ready {runs[name]['ready_s']} s, {len(batch)} requests in {runs[name]['generate_s']} s", flush=True)
    time_mask_kernels()
    failures = check(runs, kinds)
    failures += throughput(args, model, prompts, out_dir, runs)
    with open(os.path.join(out_dir, "grammar_check.json"), "w") as f:
        json.dump({"kinds": kinds, "runs": runs}, f)
    print("RESULT:", "PASS" if failures == 0 else f"FAIL, {failures} failures")
    return 1 if failures else 0


def time_mask_kernels(vocab: int = 151936) -> None:
    """Applying a JSON-like mask (~2% of tokens allowed) to [B, V] float32 logits: ours, xgrammar's
    Triton kernel, the torch reference. GPU time per call from CUDA events over a replayed graph of
    20 calls (no launch gaps), and host time per eagerly launched call (what an eager step pays)."""
    import time

    import xgrammar

    from sgl_kernel_ext.sampling.bitmask import apply_token_bitmask_reference
    from sgl_kernel_ext.sampling.bitmask_triton import apply_token_bitmask_triton

    kernels = {
        "ours (triton)": apply_token_bitmask_triton,
        "xgrammar triton": lambda l, m: xgrammar.apply_token_bitmask_inplace(l, m, vocab_size=vocab, backend="triton"),
        "torch reference": apply_token_bitmask_reference,
    }
    gen = torch.Generator().manual_seed(0)
    for batch in (1, 16, 64):
        logits = torch.randn(batch, vocab, generator=gen).cuda()
        mask = (torch.rand(batch, (vocab + 31) // 32, generator=gen) < 0.02).to(torch.int32).mul(-1).cuda()
        line = []
        for name, kernel in kernels.items():
            work = logits.clone()
            for _ in range(5):
                kernel(work, mask)
            torch.cuda.synchronize()
            host = time.perf_counter()
            for _ in range(200):
                kernel(work, mask)
            host = (time.perf_counter() - host) / 200
            graph = torch.cuda.CUDAGraph()  # 20 calls replayed: GPU time without launch gaps
            with torch.cuda.graph(graph):
                for _ in range(20):
                    kernel(work, mask)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            line.append(f"{name} {start.elapsed_time(end) / 200 * 1e3:.1f} us GPU, {host * 1e6:.1f} us host")
        print(f"mask apply B={batch} V={vocab}: " + "; ".join(line), flush=True)


def check(runs: dict, kinds: list[str]) -> int:
    failures = 0
    plain_index = [i for i, k in enumerate(kinds) if k.startswith("plain")]
    for name in ("default", "no-overlap", "llguidance", "pytorch-sampler"):
        run = runs[name]
        bad = [i for i, k in enumerate(kinds) if not k.startswith("plain") and not valid(k, run["texts"][i], run["finish_reasons"][i])]
        differ = [i for j, i in enumerate(plain_index) if run["output_ids"][i] != runs["plain-only"]["output_ids"][j]]
        print(f"{name}: grammar rows invalid {len(bad)}/{len(kinds) - len(plain_index)}; "
              f"non-grammar rows differing from the grammar-free batch {len(differ)}/{len(plain_index)}")
        for i in bad:
            print(f"  invalid {kinds[i]}: {run['texts'][i]!r} {run['finish_reasons'][i]}")
        failures += len(bad) + len(differ)
    overlap_differ = [i for i in range(len(kinds)) if runs["default"]["output_ids"][i] != runs["no-overlap"]["output_ids"][i]]
    print(f"overlap on vs off: {len(overlap_differ)} of {len(kinds)} rows differ")
    failures += len(overlap_differ)
    examples = {k: runs["default"]["texts"][kinds.index(k)] for k in dict.fromkeys(kinds) if not k.startswith("plain")}
    print("examples:", json.dumps(examples)[:1500])
    return failures


def throughput(args, model: str, prompts: list[list[int]], out_dir: str, runs: dict) -> int:
    """64 concurrent requests of 128 tokens: unconstrained, a permissive word regex (the grammar
    path's fixed cost: eager sampling, mask fill, delayed sampling) and the JSON schema (tokens
    until each document ends). Whole-run tok/s and the median steady decode rate of the log lines."""
    n, new_tokens = 64, 128
    # Unbounded repetition: a bounded one ({0,300}) expands xgrammar's automaton and measured
    # 32 tok/s here (the fill of every step pays for it).
    words = "[a-z]+( [a-z]+)*"
    variants = {
        "plain": {"ignore_eos": True},
        "regex-words": {"regex": words},
        "json": {"json_schema": json.dumps(SCHEMA)},
    }
    flags = ["--max-running-requests", "64", "--constrained-json-disable-any-whitespace", "--decode-log-interval", "16"]
    invalid = 0
    for name, extra in variants.items():
        bodies = [{"input_ids": prompts[i % 3], "sampling_params": {**SEEDED, "sampling_seed": i, "max_new_tokens": new_tokens,
                   **extra}} for i in range(n)]
        log = os.path.join(out_dir, f"server-tput-{name}.log")
        run = serve_and_generate(args, model, 1, flags, bodies, log)
        runs[f"tput-{name}"] = run
        tokens = sum(len(ids) for ids in run["output_ids"])
        rates = [float(m) for m in re.findall(r"gen throughput \(token/s\): ([0-9.]+)", open(log).read())]
        steady = sorted(rates)[len(rates) // 2] if rates else float("nan")
        print(f"64 concurrent {name}: {tokens} tokens in {run['generate_s']} s = {tokens / run['generate_s']:.0f} tok/s; "
              f"median decode-log rate {steady:.0f} tok/s over {len(rates)} lines", flush=True)
        if name == "json":
            invalid += sum(1 for text, fin in zip(run["texts"], run["finish_reasons"]) if not valid("json", text, fin))
        if name == "regex-words":
            invalid += sum(1 for text in run["texts"] if re.fullmatch(words, text) is None)
    return invalid


if __name__ == "__main__":
    sys.exit(main())
