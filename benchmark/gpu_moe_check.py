"""GPU checks of the MoE layer and families (run through the device tool; see gpu_moe_check.sh).

1. kernel: the grouped-GEMM Triton kernels against the plain-torch reference at Qwen3-30B-A3B's
   expert shapes (128 experts, top-8, hidden 2048, intermediate 768) in bf16, decode- and
   prefill-sized N, with a quarter of the experts foreign (EP); their time against the torch
   expert loop; a CUDA graph of the whole MoE block (router, routing, alignment, kernels)
   replayed on new inputs equals the eager block.
2. families: tiny Qwen3-MoE and Mixtral checkpoints written by transformers, served by our
   server in bf16 on CUDA (CUDA graphs on) against transformers in bf16 on CUDA: the first
   token wherever transformers' top-2 margin exceeds bf16 noise, its logprob, whole greedy runs.

    python benchmark/gpu_moe_check.py --out $OUT --tokenizer .carry_engine/tokenizer
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "test"))

from family_utils import prompts, save_tiny, served, serving  # noqa: E402
from sgl_kernel_ext.moe.fused_moe_triton import fused_experts_triton  # noqa: E402
from sgl_kernel_ext.moe.reference import fused_experts_reference  # noqa: E402
from sglang.srt.layers.moe.fused_moe import experts_torch  # noqa: E402
from sglang.srt.layers.moe.sparse_block import SparseMoeBlock  # noqa: E402
from sglang.srt.layers.moe.topk import TopKConfig  # noqa: E402

EXPERTS, TOP_K, HIDDEN, INTER = 128, 8, 2048, 768
KERNEL_NS = (1, 7, 64, 256, 1024)
BF16_ATOL = 2e-2  # outputs of |x| ~ 1; the kernel rounds each weighted expert output to bf16
MARGIN = 0.1  # transformers' top-2 logprob gap above which the first token must agree in bf16
LOGPROB_TOL = 0.15


def _time_ms(fn, iters: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iters


def _chunked_reference(x, w13, w2, weights, ids, chunk: int = 8) -> torch.Tensor:
    """The reference gathers [chunk, k, 2I, H] weights: run it a few tokens at a time."""
    return torch.cat([fused_experts_reference(x[i : i + chunk], w13, w2, weights[i : i + chunk], ids[i : i + chunk])
                      for i in range(0, x.shape[0], chunk)])


def check_kernel(results: dict) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    w13 = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=g, device="cuda") * HIDDEN**-0.5).bfloat16()
    w2 = (torch.randn(EXPERTS, HIDDEN, INTER, generator=g, device="cuda") * INTER**-0.5).bfloat16()
    rows = []
    for n in KERNEL_NS:
        x = torch.randn(n, HIDDEN, generator=g, device="cuda").bfloat16()
        logits = torch.randn(n, EXPERTS, generator=g, device="cuda")
        weights, ids = torch.softmax(logits, -1).topk(TOP_K, dim=-1)
        ids = ids.int() - EXPERTS // 4  # global experts 0..31 belong to another EP rank: local ids < 0
        local_w13, local_w2 = w13[: EXPERTS * 3 // 4], w2[: EXPERTS * 3 // 4]
        got = fused_experts_triton(x, local_w13, local_w2, weights, ids)
        expected = _chunked_reference(x, local_w13, local_w2, weights, ids)
        err = (got.float() - expected.float()).abs().max().item()
        triton_ms = _time_ms(lambda: fused_experts_triton(x, local_w13, local_w2, weights, ids))
        torch_ms = _time_ms(lambda: experts_torch(x, local_w13, local_w2, weights, ids), iters=3)
        rows.append({"N": n, "max_abs_err": err, "triton_ms": triton_ms, "torch_loop_ms": torch_ms})
        print(f"  N={n:5d}: max |triton - reference| {err:.2e}; triton {triton_ms:.3f} ms, torch loop {torch_ms:.3f} ms",
              flush=True)
        assert err < BF16_ATOL, f"N={n}: {err}"
    results["kernel"] = rows
    results["graph_max_abs_diff"] = check_block_graph()


def check_block_graph(n: int = 64) -> float:
    """A CUDA graph of SparseMoeBlock.forward, replayed on new inputs, against eager."""
    torch.manual_seed(1)
    with torch.device("cuda"):
        block = SparseMoeBlock(HIDDEN, EXPERTS, INTER, TopKConfig(TOP_K, True), params_dtype=torch.bfloat16)
    for p in block.parameters():
        p.data.normal_(0.0, 0.02)
    static_x = torch.randn(n, HIDDEN, device="cuda").bfloat16()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        block(static_x)  # compiles the kernels outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = block(static_x)
    worst = 0.0
    for seed in range(3):
        static_x.copy_(torch.randn(n, HIDDEN, generator=torch.Generator(device="cuda").manual_seed(seed), device="cuda"))
        graph.replay()
        worst = max(worst, (static_out.float() - block(static_x).float()).abs().max().item())
    print(f"  CUDA graph of the MoE block (N={n}) vs eager on new inputs: max |diff| {worst:.2e}", flush=True)
    assert worst == 0.0, worst
    return worst


FAMILIES = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=32, num_experts=16, num_experts_per_tok=4,
                       moe_intermediate_size=64, norm_topk_prob=True, mlp_only_layers=[1], max_position_embeddings=512)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(hidden_size=128, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=512)),
}


@torch.no_grad()
def _hf_greedy(model, prompt: list[int], new_tokens: int) -> tuple[list[int], torch.Tensor]:
    ids, first = list(prompt), None
    for _ in range(new_tokens):
        logits = model(torch.tensor([ids], device="cuda"), use_cache=False).logits[0, -1].float()
        first = torch.log_softmax(logits, -1) if first is None else first
        ids.append(int(logits.argmax()))
    return ids[len(prompt):], first


def check_family(name: str, tokenizer: str, results: dict, new_tokens: int = 8) -> None:
    config_cls, model_cls, shape = FAMILIES[name]
    with tempfile.TemporaryDirectory() as folder:
        model = save_tiny(folder, config_cls, model_cls, std=0.1, **shape).to("cuda", torch.bfloat16)
        with serving(folder, tokenizer, "--dtype", "bfloat16", "--device", "cuda") as server:
            outputs = [served(server, p, new_tokens) for p in prompts()]
    row = {"prompts": len(outputs), "same_greedy_runs": 0, "first_token_checked": 0, "max_first_logprob_diff": 0.0}
    for prompt, out in zip(prompts(), outputs):
        ref_ids, ref_logprobs = _hf_greedy(model, prompt, new_tokens)
        row["same_greedy_runs"] += out["output_ids"] == ref_ids
        top2 = ref_logprobs.topk(2).values
        ours_first = out["meta_info"]["output_top_logprobs"][0][0]  # [logprob, id, text]
        diff = abs(ours_first[0] - ref_logprobs[ours_first[1]].item())
        row["max_first_logprob_diff"] = max(row["max_first_logprob_diff"], diff)
        if (top2[0] - top2[1]).item() > MARGIN:
            row["first_token_checked"] += 1
            assert out["output_ids"][0] == ref_ids[0], f"{name}: prompt of {len(prompt)} tokens"
    print(f"  {name}: {row}", flush=True)
    assert row["max_first_logprob_diff"] < LOGPROB_TOL, row
    results[name] = row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("/tmp/moe_check"))
    parser.add_argument("--tokenizer", default=".carry_engine/tokenizer", help="tokenizer the tiny checkpoints are served with")
    parser.add_argument("--checks", nargs="+", default=["kernel", "qwen3_moe", "mixtral"])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"device": torch.cuda.get_device_name()}
    for name in args.checks:
        started = time.perf_counter()
        if name == "kernel":
            check_kernel(results)
        else:
            check_family(name, args.tokenizer, results)
        print(f"[{name}: {time.perf_counter() - started:.0f} s]", flush=True)
        (args.out / "moe_check.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
