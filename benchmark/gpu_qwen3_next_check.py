"""GPU checks of Qwen3-Next (Gated DeltaNet + gated attention + MoE) at the ModelRunner level.

1. correctness: a small random Qwen3-Next checkpoint written by transformers, our ModelRunner on
   CUDA vs transformers on CUDA (full forwards, no HF cache) in float32 and bfloat16: prompts of
   5..300 tokens prefilled together in 64-token chunks (the recurrent state carried across
   chunks), then greedy decode steps, batched. Reports the first token's max |logprob diff|
   over transformers' top-5 and the greedy token agreement; float32 must agree exactly.
2. throughput: a checkpoint of Qwen3-Next-80B-A3B's layer shapes (random_checkpoint.py --preset
   qwen3-next-80b-a3b: hidden 2048, 512 experts top-10, Gated DeltaNet 16 key / 32 value heads of 128,
   full attention 16 x 256 with 2 KV heads) with a few layers (3 linear + 1 full by default),
   random bf16 weights; decode tok/s of the ModelRunner at N = 1 and 64 (prompts of 128 tokens
   prefilled, then timed greedy decode steps), eager or with CUDA graphs captured for those sizes. The served numbers
   (HTTP, scheduler included) come from bench_serving_gpu.py --preset qwen3-next-80b-a3b.

Whether flash-linear-attention (fla-core) was importable is recorded: without it the torch
reference of the delta rule runs.

    python benchmark/gpu_qwen3_next_check.py --out $OUT [--cuda-graphs]

The checkpoints go to --work (default /tmp/qwen3_next_ckpt, not under --out: the real-shape one is
about 14 GB); the results JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "test"))
sys.path.insert(0, str(ROOT / "benchmark"))

from random_checkpoint import write_qwen3_next_checkpoint  # noqa: E402
from runner_utils import Driver  # noqa: E402

from sglang.srt.layers.gated_delta_net import fla_ops  # noqa: E402
from sglang.srt.model_executor.model_runner import ModelRunner  # noqa: E402

SMALL = dict(
    vocab_size=4096, hidden_size=256, intermediate_size=512, num_attention_heads=4,
    num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, linear_num_key_heads=4,
    linear_num_value_heads=8, linear_key_head_dim=32, linear_value_head_dim=32, num_experts=8,
    num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=256,
)
PROMPT_LENS = (5, 40, 100, 300)
CHUNK = 64
DEVICE = "cuda"  # --device cpu: a dry run of this script


def write_checkpoint(folder: str, shape: dict, layers: int, dtype: torch.dtype, std: float) -> torch.nn.Module:
    """A random Qwen3NextForCausalLM (every 4th layer full attention) saved by transformers in
    `dtype`; returns the model on DEVICE."""
    import transformers

    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    cfg = transformers.Qwen3NextConfig(num_hidden_layers=layers, layer_types=types, **shape)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(DEVICE):
            model = transformers.Qwen3NextForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.uniform_(-1.0, 1.0)
            elif "norm" in name or name.endswith("dt_bias"):
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, std)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def greedy_ours(runner: ModelRunner, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], torch.Tensor]:
    """Chunked batched prefill then batched greedy decode -> (tokens, first-token logprobs [B, V])."""
    driver = Driver(runner)
    reqs = [driver.new_req() for _ in prompts]
    first = [None] * len(prompts)
    done = [0] * len(prompts)
    while any(d < len(p) for d, p in zip(done, prompts)):
        live = [i for i, p in enumerate(prompts) if done[i] < len(p)]
        chunks = [prompts[i][done[i] : done[i] + CHUNK] for i in live]
        logits = driver.extend([reqs[i] for i in live], chunks).next_token_logits
        for row, i in enumerate(live):
            done[i] += len(chunks[row])
            if done[i] == len(prompts[i]):
                first[i] = torch.log_softmax(logits[row].float(), dim=-1)
    tokens = [[int(f.argmax())] for f in first]
    for _ in range(steps - 1):
        logits = driver.decode(reqs, [t[-1] for t in tokens])
        for row, t in enumerate(tokens):
            t.append(int(logits[row].argmax()))
    driver.release()
    return tokens, torch.stack(first)


@torch.no_grad()
def greedy_hf(model: torch.nn.Module, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    ids, first = list(prompt), None
    for _ in range(steps):
        logits = model(torch.tensor([ids], device=DEVICE), use_cache=False).logits[0, -1].float()
        if first is None:
            first = torch.log_softmax(logits, dim=-1)
        ids.append(int(logits.argmax()))
    return ids[len(prompt):], first


def correctness(work: Path, dtype: torch.dtype, graphs: bool) -> dict:
    folder = str(work / f"qwen3_next_small_{str(dtype)[6:]}")
    model = write_checkpoint(folder, SMALL, 4, dtype, std=0.05)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, SMALL["vocab_size"], (n,), generator=gen).tolist() for n in PROMPT_LENS]
    runner = ModelRunner(folder, dtype=str(dtype)[6:], device=DEVICE, max_total_tokens=8192, max_running_requests=8,
                         disable_cuda_graph=not graphs)
    ours, ours_first = greedy_ours(runner, prompts, 8)
    agree, max_diff = 0, 0.0
    for i, prompt in enumerate(prompts):
        ref, ref_first = greedy_hf(model, prompt, 8)
        agree += sum(a == b for a, b in zip(ours[i], ref))
        top = ref_first.topk(5).indices
        max_diff = max(max_diff, (ours_first[i][top] - ref_first[top]).abs().max().item())
    record = {"dtype": str(dtype), "cuda_graphs": graphs, "token_agreement": agree / (8 * len(prompts)),
              "first_token_top5_max_abs_logprob_diff": max_diff}
    del runner, model
    _free()
    return record


def throughput(folder: str, layers: int, graphs: bool, ns: list[int], steps: int) -> list[dict]:
    """folder: the real-shape checkpoint, written there when missing."""
    if not (Path(folder) / "config.json").exists():
        write_qwen3_next_checkpoint(folder, device=DEVICE, num_hidden_layers=layers)
    # Graphs are captured for the measured batch sizes only: each capture runs the forward
    # (and compiles its kernels) three times.
    runner = ModelRunner(folder, dtype="bfloat16", device=DEVICE, max_total_tokens=max(ns) * 512,
                         max_running_requests=max(ns), disable_cuda_graph=not graphs, cuda_graph_bs=sorted(set(ns)))
    records = []
    for n in ns:
        driver = Driver(runner)
        reqs = [driver.new_req() for _ in range(n)]
        gen = torch.Generator().manual_seed(n)
        prompts = [torch.randint(10, 150000, (128,), generator=gen).tolist() for _ in range(n)]
        logits = driver.extend(reqs, prompts).next_token_logits
        tokens = logits.argmax(-1).tolist()
        for _ in range(5):  # warm-up
            tokens = driver.decode(reqs, tokens).argmax(-1).tolist()
        _sync()
        start = time.perf_counter()
        for _ in range(steps):
            tokens = driver.decode(reqs, tokens).argmax(-1).tolist()
        _sync()
        wall = time.perf_counter() - start
        records.append({"n": n, "cuda_graphs": graphs, "decode_steps": steps, "ms_per_step": 1e3 * wall / steps,
                        "decode_tok_s": n * steps / wall})
        print(json.dumps(records[-1]), flush=True)
        driver.release()
    del runner
    _free()
    return records


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _free() -> None:
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def main() -> None:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("/tmp/qwen3_next_gpu"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/qwen3_next_ckpt"), help="checkpoint folder")
    parser.add_argument("--phase", choices=["correctness", "throughput", "all"], default="all")
    parser.add_argument("--layers", type=int, default=4, help="layers of the real-shape checkpoint")
    parser.add_argument("--checkpoint", help="the real-shape checkpoint (default WORK/qwen3_next_real_shape_<layers>l)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--steps", type=int, default=64, help="timed decode steps")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script")
    parser.add_argument("--cuda-graphs", action="store_true", help="capture decode graphs (default eager)")
    args = parser.parse_args()
    DEVICE = args.device
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE,
              "fla": DEVICE == "cuda" and fla_ops() is not None, "cuda_graphs": args.cuda_graphs}
    print(json.dumps(result), flush=True)
    if args.phase in ("correctness", "all"):
        result["correctness"] = [correctness(args.work, dt, args.cuda_graphs) for dt in (torch.float32, torch.bfloat16)]
        print(json.dumps(result["correctness"], indent=1), flush=True)
    if args.phase in ("throughput", "all"):
        result["throughput"] = throughput(args.checkpoint or str(args.work / f"qwen3_next_real_shape_{args.layers}l"), args.layers, args.cuda_graphs, args.concurrency, args.steps)
        result["checkpoint"] = {"shape": "Qwen3-Next-80B-A3B layer shapes", "layers": args.layers, "dtype": "bfloat16"}
    name = f"qwen3_next_gpu{'_graphs' if args.cuda_graphs else ''}.json"
    (args.out / name).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out / name}", flush=True)


if __name__ == "__main__":
    main()
