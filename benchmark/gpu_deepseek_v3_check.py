"""GPU check of DeepSeek-V3 (MLA over the compressed KV cache, YaRN, dense + MoE layers) in bf16
against transformers in float32, at the ModelRunner level (run through the device tool):

    python benchmark/gpu_deepseek_v3_check.py --out $OUT      (or: bash benchmark/gpu_engine_check.sh deepseek)

Cases: `tiny` (latent row 96 + 32 = 128 values) and `v3_attention` (DeepSeek-V3's attention dimensions: q LoRA 1536,
kv LoRA 512 + rope 64 = 576 values per cached row, 16 heads, YaRN factor 40). Each: four prompts
(5 to 300 tokens) prefilled in one batch, then 8 decode steps fed transformers' greedy tokens;
per step, the bf16 log-probabilities of transformers' top-5 tokens against float32 transformers,
and whether our argmax agrees, with CUDA graphs on, off, and (tiny) in deterministic mode.

The modes split what CUDA graphs add: `graphs` (decode graphs and piecewise prefill graphs),
`decode_graphs` (decode graphs, eager prefill), `eager`, `deterministic` (decode graphs, eager
batch-invariant prefill) and `eager_deterministic` (no graphs); the V3-shaped case runs eager,
graphs and deterministic (CASE_MODES). Each mode
also reports, per step (step 0: the prefill's last token), its max |logprob difference| to the
eager mode's own output: 0 up to rounding where a mode computes what eager computes.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

DEVICE = "cuda"  # --device cpu runs the same comparison on the CPU (a dry run of this script)
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "test"))

from runner_utils import Driver  # noqa: E402

from sglang.srt.model_executor.model_runner import ModelRunner  # noqa: E402

VOCAB = 4096
PROMPT_LENS = (5, 40, 100, 300)
DECODE_STEPS = 8
# bf16 against float32 transformers: rounding moves logprobs, and where it flips an expert choice,
# by more. A case passes when our bf16 error is within this, or within twice transformers' own
# bf16 error on the same checkpoint (measured in the same run).
LOGPROB_TOL = 0.15
MOE = dict(moe_intermediate_size=128, n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=4,
           n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5)
CASES = {
    "tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=8,
                 num_key_value_heads=8, q_lora_rank=128, kv_lora_rank=96, qk_nope_head_dim=32, qk_rope_head_dim=32,
                 v_head_dim=48, max_position_embeddings=512,
                 rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                  "original_max_position_embeddings": 128, "mscale": 1.0, "mscale_all_dim": 0.8},
                 **MOE),
    "v3_attention": dict(hidden_size=1024, intermediate_size=2048, num_hidden_layers=3, num_attention_heads=16,
                         num_key_value_heads=16, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                         qk_rope_head_dim=64, v_head_dim=128, max_position_embeddings=163840,
                         rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                                          "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                                          "mscale": 1.0, "mscale_all_dim": 1.0},
                         **MOE),
}


def write_checkpoint(folder: str, shape: dict) -> transformers.PreTrainedModel:
    cfg = transformers.DeepseekV3Config(vocab_size=VOCAB, **shape)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(1.0, 0.05)  # norms
            else:
                p.normal_(0.0, 0.5 * p.shape[-1] ** -0.5)
        for layer in model.model.layers[shape["first_k_dense_replace"]:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return model


@torch.no_grad()
def hf_reference(model, prompts: list[list[int]]) -> list[tuple[list[int], torch.Tensor]]:
    """Per prompt: transformers' greedy tokens and the log-softmax [steps, V] at each position that
    predicts one of them (the prompt's last token, then each fed token)."""
    out = []
    for prompt in prompts:
        ids = list(prompt)
        for _ in range(DECODE_STEPS):
            logits = model(torch.tensor([ids], device=DEVICE), use_cache=False).logits[0, -1]
            ids.append(int(logits.argmax()))
        logits = model(torch.tensor([ids], device=DEVICE), use_cache=False).logits[0].float()
        out.append((ids[len(prompt):], torch.log_softmax(logits[len(prompt) - 1 : len(ids) - 1], dim=-1)))
    return out


@dataclass(frozen=True)
class Mode:
    graphs: bool  # decode CUDA graphs
    piecewise: bool  # piecewise CUDA graphs for prefill (with graphs only)
    deterministic: bool


MODES = {
    "eager": Mode(False, False, False),
    "graphs": Mode(True, True, False),
    "decode_graphs": Mode(True, False, False),
    "deterministic": Mode(True, False, True),
    "eager_deterministic": Mode(False, False, True),
}
# The tiny case isolates graphs' part in its mismatch; the V3-shaped one checks the MLA kernels.
CASE_MODES = {"tiny": list(MODES), "v3_attention": ["eager", "graphs", "deterministic"]}


@torch.no_grad()
def ours(folder: str, prompts, forced, mode: Mode) -> list[torch.Tensor]:
    runner = ModelRunner(folder, device=DEVICE, dtype="bfloat16", max_total_tokens=8192, max_running_requests=8,
                         disable_cuda_graph=not mode.graphs, disable_piecewise_cuda_graph=not mode.piecewise,
                         deterministic=mode.deterministic)
    driver = Driver(runner)
    reqs = [driver.new_req() for _ in prompts]
    steps = [driver.extend(reqs, prompts).next_token_logits.float()]  # [B, V]
    for i in range(DECODE_STEPS - 1):  # feeds all but the last greedy token
        steps.append(driver.decode(reqs, [tokens[i] for tokens, _ in forced]).float())
    del runner, driver
    gc.collect()
    return [torch.log_softmax(torch.stack([s[b] for s in steps]), dim=-1) for b in range(len(prompts))]  # [steps, V]


def per_step_diff(mine: list[torch.Tensor], eager: list[torch.Tensor]) -> list[float]:
    """Max |logprob difference| over the batch and the vocabulary at each step."""
    return [max((a[s] - b[s]).abs().max().item() for a, b in zip(mine, eager)) for s in range(eager[0].shape[0])]


def compare(mine: list[torch.Tensor], forced, hf_bf16_diff: float = 0.0) -> dict:
    worst, agree, total = 0.0, 0, 0
    for logprobs, (tokens, ref) in zip(mine, forced):
        top = ref.topk(5, dim=-1).indices  # [steps, 5]
        worst = max(worst, (logprobs.gather(1, top) - ref.gather(1, top)).abs().max().item())
        agree += int((logprobs.argmax(-1) == ref.argmax(-1)).sum())
        total += ref.shape[0]
    ok = worst < max(LOGPROB_TOL, 2 * hf_bf16_diff)
    return {"max_top5_logprob_diff": worst, "argmax_agree": f"{agree}/{total}", "ok": ok}


def run_case(name: str, shape: dict) -> dict:
    folder = tempfile.mkdtemp(prefix=f"dsv3_{name}_")
    model = write_checkpoint(folder, shape).to(DEVICE)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    forced = hf_reference(model, prompts)
    hf_bf16 = compare([logprobs for _, logprobs in hf_reference(model.to(torch.bfloat16), prompts)], forced)
    print(name, "transformers bf16", hf_bf16, flush=True)
    del model
    gc.collect()
    results, eager = {"transformers_bf16": hf_bf16}, None
    for mode in CASE_MODES[name]:
        try:
            mine = ours(folder, prompts, forced, MODES[mode])
            results[mode] = compare(mine, forced, hf_bf16["max_top5_logprob_diff"])
            if mode == "eager":
                eager = mine
            elif eager is not None:
                results[mode]["vs_eager_per_step"] = per_step_diff(mine, eager)
        except Exception as exc:  # one mode's failure is reported, the others still run
            results[mode] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        print(name, mode, results[mode], flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/gpu_deepseek_v3")
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    print("device", torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE, "torch", torch.__version__, "transformers", transformers.__version__)
    results = {name: run_case(name, CASES[name]) for name in args.cases}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_deepseek_v3_check.json").write_text(json.dumps(results, indent=2))
    ok = all(r["ok"] for case in results.values() for mode, r in case.items() if mode != "transformers_bf16")
    print("ALL OK" if ok else "FAILURES", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
