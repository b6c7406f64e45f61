"""GPU check of the sliding-window and soft-capping families (Gemma2, Gemma3 text, Mistral and
Qwen2 with a window) against transformers on CUDA, through the Triton attention backend with
decode CUDA graphs and piecewise prefill graphs, in float32 and bfloat16, default and
deterministic mode.

Each family is a random checkpoint written by transformers (window 32, prompts of 5 to 150
tokens, so most pass the window), prefilled in 16-token chunks with every prompt in one batch,
then decoded 8 steps on transformers' greedy tokens (teacher forcing). At every step the
log-probabilities of transformers' top-5 ids are compared with transformers' own (eager
attention, no KV cache, same dtype):

    python benchmark/gpu_window_softcap_check.py --out-dir $OUT

Tolerances: float32 1e-3 (Triton's fp32 dots run in IEEE precision), bfloat16 0.1 (the two
sides round differently in every layer).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "test"))

from runner_utils import Driver  # noqa: E402

from sglang.srt.model_executor.model_runner import ModelRunner  # noqa: E402

VOCAB = 32000
CHUNK = 16
NEW_TOKENS = 8
TOP_K = 5
PROMPT_LENS = (5, 31, 33, 70, 150)
TOL = {"float32": 1e-3, "bfloat16": 0.1}
SHAPE = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, head_dim=32, max_position_embeddings=1024, sliding_window=32)
FAMILIES = {
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        query_pre_attn_scalar=24, attn_logit_softcapping=5.0, final_logit_softcapping=3.0)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        query_pre_attn_scalar=24, final_logit_softcapping=3.0, sliding_window_pattern=2,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                         "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000_000.0}})),
    "mistral_window": ("MistralConfig", "MistralForCausalLM", {}),
    "qwen2_window": ("Qwen2Config", "Qwen2ForCausalLM", dict(use_sliding_window=True, max_window_layers=2)),
}


def write_checkpoint(folder: str, config_cls: str, model_cls: str, extra: dict) -> transformers.PreTrainedModel:
    cfg = getattr(transformers, config_cls)(**SHAPE, **extra)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(100, VOCAB, (n,), generator=g).tolist() for n in PROMPT_LENS]


@torch.no_grad()
def hf_steps(model: transformers.PreTrainedModel, prompt: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and each step's log-probabilities [V] by full forwards (no HF cache)."""
    ids, logprobs = list(prompt), []
    for _ in range(NEW_TOKENS):
        logits = model(torch.tensor([ids], device="cuda"), use_cache=False).logits[0, -1].float()
        logprobs.append(torch.log_softmax(logits, dim=-1))
        ids.append(int(logits.argmax()))
    return ids[len(prompt):], logprobs


def served_steps(runner: ModelRunner, prompt_list: list[list[int]], forced: list[list[int]]) -> list[list[torch.Tensor]]:
    """Every prompt in one batch, in CHUNK-token chunks, then NEW_TOKENS - 1 decode steps on the
    forced tokens -> per prompt, each step's log-probabilities [V]."""
    driver = Driver(runner)
    reqs = [driver.new_req() for _ in prompt_list]
    out: list[list[torch.Tensor]] = [[] for _ in prompt_list]
    for start in range(0, max(map(len, prompt_list)), CHUNK):
        live = [i for i, p in enumerate(prompt_list) if start < len(p)]
        logits = driver.extend([reqs[i] for i in live], [prompt_list[i][start:start + CHUNK] for i in live]).next_token_logits
        for row, i in enumerate(live):
            if start + CHUNK >= len(prompt_list[i]):
                out[i].append(torch.log_softmax(logits[row].float(), dim=-1))
    for step in range(NEW_TOKENS - 1):
        logits = driver.decode(reqs, [tokens[step] for tokens in forced])
        for i in range(len(prompt_list)):
            out[i].append(torch.log_softmax(logits[i].float(), dim=-1))
    driver.release()
    return out


def check(name: str, folder: str, model: transformers.PreTrainedModel, dtype: str, deterministic: bool) -> dict:
    model = model.to("cuda", getattr(torch, dtype))
    prompt_list = prompts()
    reference = [hf_steps(model, p) for p in prompt_list]
    runner = ModelRunner(folder, device="cuda", dtype=dtype, max_total_tokens=20000, max_running_requests=16,
                         deterministic=deterministic, cuda_graph_max_bs=16, piecewise_cuda_graph_max_tokens=1024)
    got = served_steps(runner, prompt_list, [tokens for tokens, _ in reference])
    worst, argmax_differs = 0.0, 0
    for (_, ref_steps), our_steps in zip(reference, got):
        for ref, ours in zip(ref_steps, our_steps):
            ids = ref.topk(TOP_K).indices
            worst = max(worst, float((ours[ids] - ref[ids]).abs().max()))
            argmax_differs += int(ours.argmax() != ref.argmax())
    del runner
    gc.collect()
    torch.cuda.empty_cache()
    ok = worst <= TOL[dtype]
    mode = "deterministic" if deterministic else "default"
    print(f"{'PASS' if ok else 'FAIL'} {name} {dtype} {mode}: max |logprob diff| over top-{TOP_K} {worst:.2e} "
          f"(tol {TOL[dtype]}), argmax differs at {argmax_differs} of {len(prompt_list) * NEW_TOKENS} steps")
    return dict(family=name, dtype=dtype, mode=mode, max_logprob_diff=worst, argmax_differs=argmax_differs, ok=ok)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default="/tmp/gpu_window_softcap_check")
    parser.add_argument("--families", nargs="*", default=sorted(FAMILIES))
    args = parser.parse_args()
    results = []
    for name in args.families:
        config_cls, model_cls, extra = FAMILIES[name]
        with tempfile.TemporaryDirectory() as folder:
            model = write_checkpoint(folder, config_cls, model_cls, extra)
            for dtype in ("float32", "bfloat16"):
                for deterministic in (False, True):
                    results.append(check(name, folder, model, dtype, deterministic))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "window_softcap_check.json").write_text(json.dumps(results, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
