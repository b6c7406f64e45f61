"""How far the int8-activation mode's answers lie from the exact mode's, beside how far llama.cpp's
lie from the same exact computation, on the embedded model (SmolLM2-135M-Instruct, GGUF Q4_1).

The exact mode (`ModelRunner(cpu_int8_activations=False)`: the GGUF blocks dequantised to float32,
float32 sums) is the reference. For each prompt (chat template applied) it decodes greedily; then
each other system is fed the exact mode's tokens one decode step at a time (teacher forcing), so
that every system is scored at the same positions of the same text:

  int8        `ModelRunner(cpu_int8_activations=True)`: each linear's input rounded to 8 bits per
              block of 32, integer dot products (block_quant_linear_q8.c)
  llama.cpp   the `llama_cpp` package's `Llama` (its vendored llama.cpp: q8_1 activations for the
              Q4_1 weights, q8_0 for the Q8_0 LM head, float16 KV cache; see LlamaCppSystem), fed
              the same token ids; skipped with a message when the package does not import

Per position (log-softmax in float64): |logprob difference| of the exact mode's greedy token and
of the exact mode's top-k tokens, KL(exact || other), and whether the other's argmax is the exact
token. Per prompt: the first position where the argmax differs (its own greedy answer agrees
with the exact one token for token up to there; --new-tokens when it never differs).

    .venv/bin/python benchmark/compare_int8_activations.py [--prompts 40] [--new-tokens 64]

Writes benchmark/results/int8_vs_exact/int8_vs_exact.json (and .png when matplotlib imports).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

from bench_serving import PROMPTS, OutsideLoad, header_line, run_header  # this folder is on sys.path
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.utils.embedded_model import embedded_model_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))
from runner_utils import Driver  # noqa: E402  (the tests' stand-in for the scheduler's part of a step)

try:
    from tqdm import tqdm
except ImportError:  # progress bars are optional
    def tqdm(iterable, **_: Any):  # type: ignore[no-redef]
        return iterable

OUT_DIR = Path(__file__).resolve().parent / "results" / "int8_vs_exact"
INT8, LLAMA = "int8", "llama.cpp"

# With the serving benchmark's 16 prompts: 40 short chat requests of varied kinds.
MORE_PROMPTS = [
    "Translate 'Where is the train station?' into French, Spanish and German.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Explain what a hash table is and when you would use one.",
    "Give three arguments for and three against working from home.",
    "How many minutes are there in a week? Show your reasoning.",
    "Write a haiku about an old bridge in the rain.",
    "What causes the seasons on Earth?",
    "Suggest a weekend itinerary for a first visit to Rome.",
    "Explain the difference between weather and climate in two sentences.",
    "Write a limerick about a cat who learns to play the piano.",
    "What is photosynthesis? Explain it to a ten-year-old.",
    "List the planets of the solar system in order from the Sun.",
    "How do I politely decline a meeting invitation from my manager?",
    "Describe how to make a paper airplane that flies far.",
    "What are the benefits of drinking enough water every day?",
    "Write a SQL query that counts the orders per customer in a table called orders.",
    "Why is the ocean salty but rivers are not?",
    "Give me a short motivational message for a student before an exam.",
    "Explain what inflation is and how it affects savings.",
    "Write the opening paragraph of a science fiction story set on Mars.",
    "What is the difference between a simile and a metaphor? Give examples.",
    "How do vaccines train the immune system?",
    "Recommend three board games for a family with young children and say why.",
]


class LlamaCppSystem:
    """llama.cpp through the `llama_cpp` package: a prompt's ids evaluated at once, then one token a
    step, the logits of the last position read after each.

    Without llama.cpp's extra weight buffer types (its `--no-repack`): they hold repacked copies of
    the same blocks for other kernels (AMX tiles, interleaved rows), which crash on CPUs whose AMX
    the OS does not enable; the plain path multiplies the same Q4_1 / Q8_0 blocks by the same 8-bit
    activations, as llama.cpp does on CPUs without those kernels."""

    def __init__(self, model_path: str, threads: int) -> None:
        import llama_cpp.llama_cpp as lib
        from llama_cpp import Llama

        default_params = lib.llama_model_default_params

        def plain_buffers() -> Any:
            params = default_params()
            params.use_extra_bufts = False
            return params

        lib.llama_model_default_params = plain_buffers  # read once, by the constructor below
        try:
            self.llm = Llama(model_path=model_path, n_ctx=512, n_threads=threads, n_threads_batch=threads,
                             logits_all=True, verbose=False)
        finally:
            lib.llama_model_default_params = default_params

    def teacher_forced(self, prompt: list[int], tokens: list[int]) -> torch.Tensor:
        """Logits after the prompt and after each of tokens[:-1]: [len(tokens), V] float32."""
        self.llm.reset()
        rows = []
        for chunk in [prompt, *[[t] for t in tokens[:-1]]]:
            self.llm.eval(chunk)
            rows.append(torch.from_numpy(self.llm.scores[self.llm.n_tokens - 1].copy()))
        return torch.stack(rows)  # [T, V]


def load_llama_cpp(threads: int) -> Optional[LlamaCppSystem]:
    try:
        return LlamaCppSystem(embedded_model_path(), threads)
    except ImportError as err:
        print(f"llama.cpp skipped: the llama_cpp package does not import ({err})")
        return None


def prompt_ids(count: int) -> list[list[int]]:
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    tokenizer = get_tokenizer(embedded_model_path(), False)
    texts = (PROMPTS + MORE_PROMPTS)[:count]
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
             for t in texts]
    return [tokenizer.encode(chat, add_special_tokens=False) for chat in chats]


def runner(int8: bool, batch: int) -> ModelRunner:
    return ModelRunner(embedded_model_path(), max_running_requests=batch, max_total_tokens=8192, cpu_int8_activations=int8)


def greedy(driver: Driver, prompts: list[list[int]], new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decode of a batch: tokens [B, T] and the logits that chose them [B, T, V]."""
    reqs = [driver.new_req() for _ in prompts]
    logits = [driver.extend(reqs, prompts).next_token_logits]  # [B, V] each
    tokens = [logits[-1].argmax(-1)]
    for _ in range(new_tokens - 1):
        logits.append(driver.decode(reqs, tokens[-1].tolist()))
        tokens.append(logits[-1].argmax(-1))
    driver.release()
    return torch.stack(tokens, 1), torch.stack(logits, 1)


def teacher_forced(driver: Driver, prompts: list[list[int]], tokens: torch.Tensor) -> torch.Tensor:
    """The logits after each prompt and after each of tokens[:, :-1], one decode step a token: [B, T, V]."""
    reqs = [driver.new_req() for _ in prompts]
    logits = [driver.extend(reqs, prompts).next_token_logits]
    for i in range(tokens.shape[1] - 1):
        logits.append(driver.decode(reqs, tokens[:, i].tolist()))
    driver.release()
    return torch.stack(logits, 1)


def distance(exact: torch.Tensor, other: torch.Tensor, chosen: torch.Tensor, top: int) -> dict[str, torch.Tensor]:
    """Per position of one prompt (exact, other: [T, V] logits; chosen: [T] the exact greedy tokens)."""
    ref, oth = torch.log_softmax(exact.double(), -1), torch.log_softmax(other.double(), -1)  # [T, V]
    top_ids = ref.topk(top, -1).indices  # [T, top]
    return {
        "chosen_abs": (ref.gather(1, chosen[:, None]) - oth.gather(1, chosen[:, None])).abs()[:, 0],  # [T]
        "top_abs": (ref.gather(1, top_ids) - oth.gather(1, top_ids)).abs(),  # [T, top]
        "kl": (ref.exp() * (ref - oth)).sum(-1).clamp_min(0.0),  # [T]
        "agree": other.argmax(-1) == chosen,  # [T]
    }


def per_prompt(d: dict[str, torch.Tensor], prompt_len: int) -> dict[str, Any]:
    disagree = (~d["agree"]).nonzero()
    return {
        "prompt_tokens": prompt_len,
        "first_divergence": int(disagree[0, 0]) if len(disagree) else len(d["agree"]),
        "kl": [float(f"{v:.3g}") for v in d["kl"].tolist()],
        "chosen_abs_max": round(float(d["chosen_abs"].max()), 5),
        "top_abs_max": round(float(d["top_abs"].max()), 5),
    }


def summary(parts: list[dict[str, torch.Tensor]], records: list[dict[str, Any]], new_tokens: int) -> dict[str, Any]:
    cat = {key: torch.cat([p[key].flatten() for p in parts]) for key in parts[0]}
    kl = cat["kl"]
    firsts = [r["first_divergence"] for r in records]
    return {
        "chosen_logprob_abs_diff": {"max": cat["chosen_abs"].max().item(), "mean": cat["chosen_abs"].mean().item()},
        "top_logprob_abs_diff": {"max": cat["top_abs"].max().item(), "mean": cat["top_abs"].mean().item()},
        "kl_exact_other": {"mean": kl.mean().item(), "median": kl.median().item(),
                           "p99": kl.quantile(0.99).item(), "max": kl.max().item()},
        "argmax_agreement_teacher_forced": cat["agree"].double().mean().item(),
        "greedy_full_agreement": sum(f == new_tokens for f in firsts),
        "first_divergence": firsts,
        "first_divergence_median": statistics.median(firsts),
    }


def batches(items: list, size: int) -> Iterator[tuple[int, list]]:
    for start in range(0, len(items), size):
        yield start, items[start:start + size]


def measure(prompts: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    exact_runner, int8_runner = runner(False, args.batch), runner(True, args.batch)
    llama_cpp = None if args.no_llama_cpp else load_llama_cpp(args.llama_cpp_threads)
    systems = [INT8] + ([LLAMA] if llama_cpp else [])
    parts: dict[str, list] = {s: [] for s in systems}
    records: dict[str, list] = {s: [] for s in systems}
    greedy_tokens: list[list[int]] = []
    with torch.inference_mode(), OutsideLoad() as outside:
        for _, group in tqdm(list(batches(prompts, args.batch)), desc="prompt batches", unit="batch"):
            tokens, exact = greedy(Driver(exact_runner), group, args.new_tokens)  # [B, T], [B, T, V]
            others = {INT8: teacher_forced(Driver(int8_runner), group, tokens)}
            if llama_cpp:
                others[LLAMA] = torch.stack([llama_cpp.teacher_forced(p, t.tolist()) for p, t in zip(group, tokens)])
            for name, logits in others.items():
                for b, prompt in enumerate(group):
                    d = distance(exact[b], logits[b], tokens[b], args.top)
                    parts[name].append(d)
                    records[name].append(per_prompt(d, len(prompt)))
            greedy_tokens += tokens.tolist()
    return {
        "outside_load_cpu_s": round(outside.cpu_s, 2),
        "summary": {s: summary(parts[s], records[s], args.new_tokens) for s in systems},
        "per_prompt": records,
        "exact_greedy_tokens": greedy_tokens,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for (name, records), colour in zip(result["per_prompt"].items(), ("tab:blue", "tab:orange")):
        kl = torch.tensor([r["kl"] for r in records])  # [P, T]
        axes[0].semilogy(kl.mean(0).tolist(), color=colour, label=f"{name}: mean over prompts")
        axes[1].hist([r["first_divergence"] for r in records], bins=16, range=(0, result["new_tokens"]),
                     alpha=0.6, color=colour, label=name)
    axes[0].set_xlabel("position of the generated token")
    axes[0].set_ylabel("KL(exact || system), nats")
    axes[1].set_xlabel("first position where the greedy token differs from exact's")
    axes[1].set_ylabel("prompts")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.suptitle("Against the exact float32 mode, embedded SmolLM2-135M (Q4_1)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write(result: dict[str, Any], plotter: Callable[[dict, Path], None]) -> Path:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    out = OUT_DIR / "int8_vs_exact.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    try:
        plotter(result, out.with_suffix(".png"))
    except ImportError:
        print("no plot: matplotlib does not import")
    return out


def table(summaries: dict[str, dict[str, Any]], top: int) -> str:
    lines = [
        f"| against exact | chosen token |dlogprob| max / mean | top-{top} |dlogprob| max / mean "
        "| KL(exact || it) mean / median / p99 / max | argmax agrees (teacher-forced) | greedy: prompts fully equal "
        "| greedy: first divergence, median |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in summaries.items():
        c, t, kl = s["chosen_logprob_abs_diff"], s["top_logprob_abs_diff"], s["kl_exact_other"]
        lines.append(
            f"| {name} | {c['max']:.3f} / {c['mean']:.4f} | {t['max']:.3f} / {t['mean']:.4f} | "
            f"{kl['mean']:.2e} / {kl['median']:.2e} / {kl['p99']:.2e} / {kl['max']:.2e} | "
            f"{100 * s['argmax_agreement_teacher_forced']:.2f}% | {s['greedy_full_agreement']} of {len(s['first_divergence'])} | "
            f"{s['first_divergence_median']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=40, choices=range(1, len(PROMPTS) + len(MORE_PROMPTS) + 1),
                        metavar=f"1..{len(PROMPTS) + len(MORE_PROMPTS)}")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--top", type=int, default=20, help="The exact mode's top-k tokens whose logprobs are compared.")
    parser.add_argument("--batch", type=int, default=8, help="Prompts decoded together (at most 32: the block kernels' rows).")
    parser.add_argument("--no-llama-cpp", action="store_true", help="Only the int8 mode against the exact one.")
    parser.add_argument("--llama-cpp-threads", type=int, default=1,
                        help="llama.cpp's threads (its numbers do not depend on them; one spins least on a busy machine).")
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    prompts = prompt_ids(args.prompts)
    result = {**run_header(started), "torch_threads": torch.get_num_threads(), "prompts": len(prompts),
              "new_tokens": args.new_tokens, "top": args.top, **measure(prompts, args)}
    if LLAMA in result["summary"]:
        import llama_cpp

        result["llama_cpp_python"] = llama_cpp.__version__
    out = write(result, plot)
    print(header_line(result))
    print(table(result["summary"], args.top))
    for name, s in result["summary"].items():
        print(f"{name}: first divergence per prompt {s['first_divergence']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
