"""The dense families of issue 34 (Mistral, Phi-3 with LongRoPE and partial rotary, OLMo 2,
GLM-4, a Llama with dynamic NTK RoPE) against transformers on the same random checkpoint: our
ModelRunner (CUDA graphs, piecewise graphs, Triton attention on CUDA) in bf16 against
transformers' eager forward in bf16 on the same device.

Per family, four prompts of 3, 17, 40 and 75 tokens (the RoPE-scaled ones have their original
length at 32, so they cover both sides of it) are prefilled in one batch and decoded together
for 8 steps, teacher-forced on transformers' greedy tokens; transformers runs each prompt alone
with its KV cache (which for length-dependent RoPE is the rule ours follows). Reported per family:
the largest |logprob difference| over transformers' top-5 tokens at every step, and the steps
whose argmax differs with a top-2 margin above the tolerance.

    python benchmark/gpu_dense_families_check.py --out-dir $OUT          # CUDA, bf16
    python benchmark/gpu_dense_families_check.py --device cpu --dtype float32 --tol 1e-4
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
import transformers

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "test"))

from runner_utils import Driver  # noqa: E402

from sglang.srt.model_executor.model_runner import ModelRunner  # noqa: E402

VOCAB = 32000
SHAPE = dict(vocab_size=VOCAB, hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, max_position_embeddings=4096, pad_token_id=0)
PROMPT_LENS = (3, 17, 40, 75)
NEW_TOKENS = 8
# The bf16 tolerance of benchmark/gpu_engine_check.py (graphs vs eager): rounding moves a
# logprob by less than this.
BF16_LOGPROB_TOL = 0.05


def _longrope(rotary_dim: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    short, long = (1 + torch.rand(rotary_dim // 2, generator=g) * k for k in (0.5, 8.0))
    return {"rope_type": "longrope", "short_factor": short.tolist(), "long_factor": long.tolist(),
            "rope_theta": 10000.0, "partial_rotary_factor": 0.5}


# name -> (config class, model class, config overrides)
FAMILIES: dict[str, tuple[str, str, Callable[[], dict[str, Any]]]] = {
    "mistral": ("MistralConfig", "MistralForCausalLM", lambda: dict(head_dim=128, sliding_window=None)),
    "phi3_longrope": ("Phi3Config", "Phi3ForCausalLM", lambda: dict(
        original_max_position_embeddings=32, sliding_window=2048, rope_parameters=_longrope(32))),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", lambda: dict(head_dim=64)),
    "llama_dynamic": ("LlamaConfig", "LlamaForCausalLM", lambda: dict(
        max_position_embeddings=32, rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0})),
}


def write_checkpoint(folder: str, family: str, dtype: torch.dtype) -> transformers.PreTrainedModel:
    config_cls, model_cls, overrides = FAMILIES[family]
    cfg = getattr(transformers, config_cls)(**(SHAPE | overrides()))
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
    model.save_pretrained(folder, safe_serialization=True)
    return model.to(dtype)


@torch.no_grad()
def hf_steps(model: transformers.PreTrainedModel, prompt: list[int], device: str
             ) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and the log-softmax [V] before each, with transformers' KV cache."""
    out = model(torch.tensor([prompt], device=device), use_cache=True)
    tokens, logprobs = [], []
    for _ in range(NEW_TOKENS):
        row = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
        logprobs.append(row.cpu())
        tokens.append(int(row.argmax()))
        out = model(torch.tensor([[tokens[-1]]], device=device), past_key_values=out.past_key_values, use_cache=True)
    return tokens, logprobs


@torch.no_grad()
def our_steps(runner: ModelRunner, prompts: list[list[int]], forced: list[list[int]]) -> list[list[torch.Tensor]]:
    """Log-softmax rows per prompt per step: one batched prefill, then decode steps fed the forced tokens."""
    driver = Driver(runner)
    reqs = [driver.new_req() for _ in prompts]
    logits = driver.extend(reqs, prompts).next_token_logits
    rows: list[list[torch.Tensor]] = [[] for _ in prompts]
    for step in range(NEW_TOKENS):
        for i in range(len(prompts)):
            rows[i].append(torch.log_softmax(logits[i, :VOCAB].float(), dim=-1).cpu())
        if step + 1 < NEW_TOKENS:
            logits = driver.decode(reqs, [f[step] for f in forced])
    return rows


def check_family(family: str, device: str, dtype: str, tol: float) -> dict[str, Any]:
    torch_dtype = getattr(torch, dtype)
    g = torch.Generator().manual_seed(7)
    # Ascending lengths: transformers' dynamic RoPE keeps its stretched frequencies between calls
    # until a sequence shorter than the original length resets them.
    prompts = [torch.randint(100, VOCAB, (n,), generator=g).tolist() for n in PROMPT_LENS]
    with tempfile.TemporaryDirectory() as folder:
        model = write_checkpoint(folder, family, torch_dtype).to(device)
        reference = [hf_steps(model, p, device) for p in prompts]
        del model
        runner = ModelRunner(folder, device=device, dtype=dtype, max_total_tokens=4096, max_running_requests=8)
        ours = our_steps(runner, prompts, [tokens for tokens, _ in reference])
        del runner
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    worst, flips = 0.0, []
    for i, ((_, ref_rows), our_rows) in enumerate(zip(reference, ours)):
        for step, (ref, got) in enumerate(zip(ref_rows, our_rows)):
            top = ref.topk(5).indices
            worst = max(worst, float((ref[top] - got[top]).abs().max()))
            top2 = got.topk(2).values
            if int(got.argmax()) != int(ref.argmax()) and float(top2[0] - top2[1]) > tol:
                flips.append((PROMPT_LENS[i], step))
    ok = worst <= tol and not flips
    print(f"{'PASS' if ok else 'FAIL'} {family}: max |logprob diff| over HF top-5 {worst:.2e} (tolerance {tol}); "
          f"argmax flips beyond the margin {flips}", flush=True)
    return {"family": family, "device": device, "dtype": dtype, "max_logprob_diff": worst, "flips": flips, "pass": ok}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tol", type=float, default=BF16_LOGPROB_TOL)
    parser.add_argument("--families", nargs="*", default=list(FAMILIES))
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args()
    results = [check_family(f, args.device, args.dtype, args.tol) for f in args.families]
    if args.out_dir:
        Path(args.out_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.out_dir) / "dense_families.json").write_text(json.dumps(results, indent=1))
    sys.exit(0 if all(r["pass"] for r in results) else 1)


if __name__ == "__main__":
    main()
