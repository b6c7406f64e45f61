"""Speculative decoding against plain decoding, in the same run: tokens/s of N concurrent requests
(sglang.Engine, greedy) and the mean accepted length (meta_info spec_accept_length).

CPU (the embedded SmolLM2, N = 1): a copy/edit task, whose answer repeats the prompt's text, and
free text; spec off and NGRAM.

    python benchmark/bench_speculative.py --out-dir benchmark/results/spec

GPU (a Qwen3-0.6B-shaped random checkpoint, benchmark/random_checkpoint.py): spec off, STANDALONE
with the target itself as draft (every draft accepted at greedy: the verify path's cost), with a
2-layer draft of the same shape, and NGRAM on repetitive text; N = 1, 16, 64. Random weights
write no copy of the prompt by themselves, so the GPU prompts are repetitive token sequences
whose continuation NGRAM's runs are steered to repeat (logit_bias on the sequence's tokens:
"repetitive"; on one token: "constant", where every draft is accepted); the draft models' runs
are unbiased, since a draft proposes its own argmax.

    bash -c 'pip install -q --no-index --no-deps --target /tmp/site .carry_engine/whl/*.whl; \
      PYTHONPATH=/tmp/site:python:. python3 benchmark/bench_speculative.py --gpu --tokenizer .carry_engine/tokenizer \
      --out-dir $OUT'   (device tool, carry [".carry_engine"])

Each record: {"spec": algorithm or null, "draft", "task", "n", "tok_per_s", "accept_length", "speedup"}.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any, Optional

import sglang as sgl

COPY_TEXT = (
    "The committee met on Tuesday to review the budget for the new library. After a long discussion, "
    "the members agreed to fund the reading room, the children's corner and a small café near the entrance."
)
# SmolLM2's chat format: asked as a chat turn, the model copies the paragraph nearly verbatim.
COPY_PROMPT = f"<|im_start|>user\nRepeat this paragraph word for word:\n\n{COPY_TEXT}<|im_end|>\n<|im_start|>assistant\n"
FREE_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def generate(llm: Any, prompts: list, params: dict) -> list[dict]:
    """Text prompts, or token-id prompts (lists of ids)."""
    if isinstance(prompts[0], str):
        return llm.generate(prompts, params)
    return llm.generate(input_ids=prompts, sampling_params=params)


def run_case(llm: Any, prompts: list, params: dict, repeats: int) -> tuple[float, Optional[float]]:
    """tokens/s over `repeats` rounds of all prompts at once, and the mean accepted length."""
    generate(llm, prompts[:1], {**params, "max_new_tokens": 4})  # warm-up
    tokens, elapsed, lengths = 0, 0.0, []
    for _ in range(repeats):
        start = time.perf_counter()
        outs = generate(llm, prompts, params)
        elapsed += time.perf_counter() - start
        for out in outs:
            tokens += out["meta_info"]["completion_tokens"]
            if "spec_accept_length" in out["meta_info"]:
                lengths.append(out["meta_info"]["spec_accept_length"])
    return tokens / elapsed, (sum(lengths) / len(lengths) if lengths else None)


def cpu_cases(args) -> list[dict]:
    params = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens, "ignore_eos": True}
    records = []
    for spec in (None, "NGRAM"):
        kw = {"speculative_algorithm": spec} if spec else {}
        with sgl.Engine(log_level="warning", **kw) as llm:
            for task, prompt in (("copy", COPY_PROMPT), ("free", FREE_PROMPT)):
                tps, accept = run_case(llm, [prompt], params, args.repeats)
                records.append({"spec": spec, "draft": None, "task": task, "n": 1, "tok_per_s": round(tps, 2),
                                "accept_length": accept})
                print(records[-1], flush=True)
    return records


def gpu_cases(args) -> list[dict]:
    from random_checkpoint import write_preset

    root = tempfile.mkdtemp(prefix="spec_bench_")
    target, draft2 = os.path.join(root, "target"), os.path.join(root, "draft2")
    write_preset(target, "qwen3-0.6b", args.tokenizer, device="cuda")
    write_preset(draft2, "qwen3-0.6b", args.tokenizer, layers=2, device="cuda")
    cycle = list(range(1000, 1016))
    tasks = {
        "repetitive": {"logit_bias": {str(t): 30.0 for t in cycle}},  # random weights: steered to repeat
        # One token repeated: every NGRAM draft is accepted (the verify path at full acceptance).
        "constant": {"logit_bias": {str(cycle[0]): 100.0}},
        "plain": {},  # the draft models' greedy tokens are the target's unbiased argmax
    }
    configs = [
        (None, None, {}, ("repetitive", "constant", "plain")),
        ("STANDALONE", "self", {"speculative_draft_model_path": target, "speculative_num_steps": 4}, ("plain",)),
        ("STANDALONE", "2-layer", {"speculative_draft_model_path": draft2, "speculative_num_steps": 4}, ("plain",)),
        ("NGRAM", None, {"speculative_num_draft_tokens": 8}, ("repetitive", "constant")),
    ]
    records = []
    for spec, draft, kw, names in configs:
        if spec is not None:
            kw = {"speculative_algorithm": spec, "speculative_disable_batch_size": max(args.concurrency), **kw}
        with sgl.Engine(model_path=target, log_level="warning", **kw) as llm:
            for task in names:
                for n in args.concurrency:
                    prompts = [cycle * 8 for _ in range(n)]
                    params = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens, "ignore_eos": True, **tasks[task]}
                    tps, accept = run_case(llm, prompts, params, args.repeats)
                    records.append({"spec": spec, "draft": draft, "task": task, "n": n, "tok_per_s": round(tps, 2),
                                    "accept_length": accept})
                    print(records[-1], flush=True)
    return records


def add_speedups(records: list[dict]) -> None:
    base = {(r["task"], r["n"]): r["tok_per_s"] for r in records if r["spec"] is None}
    for r in records:
        r["speedup"] = round(r["tok_per_s"] / base[(r["task"], r["n"])], 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--tokenizer", help="GPU: tokenizer files for the random checkpoint")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out-dir", default="benchmark/results/spec")
    args = parser.parse_args()
    args.max_new_tokens = args.max_new_tokens or (256 if args.gpu else 48)  # CPU: about the paragraph's length
    args.repeats = args.repeats or (3 if args.gpu else 2)
    records = gpu_cases(args) if args.gpu else cpu_cases(args)
    add_speedups(records)
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "gpu.json" if args.gpu else "cpu.json")
    with open(path, "w") as f:
        json.dump({"device": "cuda" if args.gpu else "cpu", "records": records}, f, indent=1)
    print(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
