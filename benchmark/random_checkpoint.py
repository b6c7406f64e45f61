"""Random-weight safetensors checkpoints of real model shapes, for GPU checks that need the
shape of a model but not its weights (no registry on the GPU machines).

    python benchmark/random_checkpoint.py /tmp/qwen3-0.6b --tokenizer .carry_engine/tokenizer
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from typing import Optional

import torch

# Qwen3-0.6B's config.json values.
QWEN3_0_6B = dict(
    architectures=["Qwen3ForCausalLM"],
    model_type="qwen3",
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
    hidden_act="silu",
    torch_dtype="bfloat16",
    bos_token_id=151643,
    eos_token_id=151645,
)


def qwen3_tensors(config: dict, generator: torch.Generator, device: str) -> dict[str, torch.Tensor]:
    """HF parameter names -> random bf16 tensors (norm weights near 1, the rest N(0, 0.02))."""
    h, inter, d = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=generator, device=device) * 0.02).to(torch.bfloat16).cpu()

    def norm(size: int) -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(size, generator=generator, device=device)).to(torch.bfloat16).cpu()

    tensors = {"model.embed_tokens.weight": normal(config["vocab_size"], h), "model.norm.weight": norm(h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": norm(h),
            p + "post_attention_layernorm.weight": norm(h),
            p + "self_attn.q_proj.weight": normal(q, h),
            p + "self_attn.k_proj.weight": normal(kv, h),
            p + "self_attn.v_proj.weight": normal(kv, h),
            p + "self_attn.o_proj.weight": normal(h, q),
            p + "self_attn.q_norm.weight": norm(d),
            p + "self_attn.k_norm.weight": norm(d),
            p + "mlp.gate_proj.weight": normal(inter, h),
            p + "mlp.up_proj.weight": normal(inter, h),
            p + "mlp.down_proj.weight": normal(h, inter),
        })
    return tensors


def write_qwen3_checkpoint(
    folder: str, tokenizer_dir: Optional[str] = None, seed: int = 0, device: str = "cpu", **overrides
) -> str:
    """A Qwen3-0.6B-shaped checkpoint (config overrides allowed) in `folder`; the tokenizer
    files are copied from `tokenizer_dir` (ids past its vocabulary decode to nothing)."""
    from safetensors.torch import save_file

    config = {**QWEN3_0_6B, **overrides}
    os.makedirs(folder, exist_ok=True)
    generator = torch.Generator(device=device).manual_seed(seed)
    save_file(qwen3_tensors(config, generator, device), os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    if tokenizer_dir:
        for name in os.listdir(tokenizer_dir):
            shutil.copy(os.path.join(tokenizer_dir, name), folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder")
    parser.add_argument("--tokenizer", help="folder of tokenizer files to copy in")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    write_qwen3_checkpoint(args.folder, args.tokenizer, args.seed, args.device)
    print(f"wrote {args.folder}")


if __name__ == "__main__":
    main()
