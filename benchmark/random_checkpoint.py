"""Random-weight safetensors checkpoints of real model shapes, for GPU checks that need the
shape of a model but not its weights (no registry on the GPU machines).

    python benchmark/random_checkpoint.py /tmp/qwen3-0.6b --tokenizer .carry_engine/tokenizer
    python benchmark/random_checkpoint.py /tmp/qwen3-8b-fp8 --preset qwen3-8b --fp8-block \
        --dequantized-twin /tmp/qwen3-8b-bf16 --tokenizer .carry_engine/tokenizer

--fp8-block stores every linear (q/k/v/o, gate/up/down) as FP8 e4m3 codes with 128x128
`weight_scale_inv` blocks and the quantization_config of Qwen3-8B-FP8; --dequantized-twin also
writes the same model with those linears dequantised to bf16 (codes x scales), unquantised.
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
# Qwen3-8B's config.json values (the shape of Qwen3-8B-FP8 too).
QWEN3_8B = dict(
    QWEN3_0_6B,
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    tie_word_embeddings=False,
)
PRESETS = {"qwen3-0.6b": QWEN3_0_6B, "qwen3-8b": QWEN3_8B}
FP8_BLOCK = (128, 128)
# Qwen3-8B-FP8's quantization_config.
FP8_BLOCK_QUANTIZATION_CONFIG = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": list(FP8_BLOCK),
}
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


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
    if not config["tie_word_embeddings"]:
        tensors["lm_head.weight"] = normal(config["vocab_size"], h)
    return tensors


def fp8_block_twins(tensors: dict[str, torch.Tensor], device: str) -> tuple[dict, dict]:
    """(block-FP8 tensors, their dequantised bf16 twin): every linear weight becomes codes and a
    `weight_scale_inv`; the rest is shared."""
    from sgl_kernel_ext.gemm.fp8_reference import dequantize_weight, quantize_weight_blocks

    fp8, twin = {}, {}
    for name, tensor in tensors.items():
        if name.rsplit(".", 2)[-2] not in LINEARS:
            fp8[name] = twin[name] = tensor
            continue
        codes, scale = quantize_weight_blocks(tensor.to(device), FP8_BLOCK)
        fp8[name], fp8[name + "_scale_inv"] = codes.cpu(), scale.cpu()
        twin[name] = dequantize_weight(codes, scale, FP8_BLOCK, torch.bfloat16).cpu()
    return fp8, twin


def write_qwen3_checkpoint(
    folder: str,
    tokenizer_dir: Optional[str] = None,
    seed: int = 0,
    device: str = "cpu",
    fp8_block: bool = False,
    dequantized_twin: Optional[str] = None,
    **overrides,
) -> str:
    """A Qwen3-0.6B-shaped checkpoint (config overrides allowed) in `folder`; the tokenizer
    files are copied from `tokenizer_dir` (ids past its vocabulary decode to nothing).
    fp8_block: linears in block FP8; dequantized_twin: a folder for its bf16 twin."""
    config = {**QWEN3_0_6B, **overrides}
    generator = torch.Generator(device=device).manual_seed(seed)
    tensors = qwen3_tensors(config, generator, device)
    if not fp8_block:
        _write(folder, tensors, config, tokenizer_dir)
        return folder
    fp8, twin = fp8_block_twins(tensors, device)
    _write(folder, fp8, {**config, "quantization_config": FP8_BLOCK_QUANTIZATION_CONFIG}, tokenizer_dir)
    if dequantized_twin:
        _write(dequantized_twin, twin, config, tokenizer_dir)
    return folder


def _write(folder: str, tensors: dict[str, torch.Tensor], config: dict, tokenizer_dir: Optional[str]) -> None:
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    if tokenizer_dir:
        for name in os.listdir(tokenizer_dir):
            shutil.copy(os.path.join(tokenizer_dir, name), folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder")
    parser.add_argument("--tokenizer", help="folder of tokenizer files to copy in")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="qwen3-0.6b", help="the model shape")
    parser.add_argument("--layers", type=int, help="fewer layers than the preset's")
    parser.add_argument("--fp8-block", action="store_true", help="linears as block-FP8 codes + 128x128 weight_scale_inv")
    parser.add_argument("--dequantized-twin", metavar="FOLDER", help="with --fp8-block: also write its bf16 twin here")
    args = parser.parse_args()
    overrides = {k: v for k, v in PRESETS[args.preset].items() if QWEN3_0_6B.get(k) != v}
    if args.layers:
        overrides["num_hidden_layers"] = args.layers
    write_qwen3_checkpoint(args.folder, args.tokenizer, args.seed, args.device, args.fp8_block, args.dequantized_twin,
                           **overrides)
    print(f"wrote {args.folder}" + (f" and {args.dequantized_twin}" if args.dequantized_twin else ""))


if __name__ == "__main__":
    main()
