"""Random-weight safetensors checkpoints of real model shapes, for GPU checks that need the
shape of a model but not its weights (no registry on the GPU machines).

    python benchmark/random_checkpoint.py /tmp/qwen3-0.6b --tokenizer .carry_engine/tokenizer
    python benchmark/random_checkpoint.py /tmp/qwen3-30b-a3b --preset qwen3-30b-a3b --tokenizer .carry_engine/tokenizer
    python benchmark/random_checkpoint.py /tmp/qwen3-8b-fp8 --preset qwen3-8b --fp8-block \
        --dequantized-twin /tmp/qwen3-8b-bf16 --tokenizer .carry_engine/tokenizer

--fp8-block stores every linear (q/k/v/o, gate/up/down) as FP8 e4m3 codes with 128x128
`weight_scale_inv` blocks and the quantization_config of Qwen3-8B-FP8; --dequantized-twin also
writes the same model with those linears dequantised to bf16 (codes x scales), unquantised.
    python benchmark/random_checkpoint.py /tmp/qwen3-next-4l --preset qwen3-next-80b-a3b --layers 4 --tokenizer .carry_engine/tokenizer
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from typing import Callable, Optional

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


# Qwen3-30B-A3B's config.json values: 48 layers of 128 experts (top-8, intermediate 768).
QWEN3_30B_A3B = dict(
    QWEN3_0_6B,
    architectures=["Qwen3MoeForCausalLM"],
    model_type="qwen3_moe",
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    max_position_embeddings=40960,
    tie_word_embeddings=False,
    num_experts=128,
    num_experts_per_tok=8,
    moe_intermediate_size=768,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
)


def qwen3_moe_layer_tensors(config: dict, layer: int, generator: torch.Generator, device: str) -> dict[str, torch.Tensor]:
    """One Qwen3-MoE layer's HF tensors (attention as Qwen3's, a router, per-expert projections)."""
    h, inter, d = config["hidden_size"], config["moe_intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=generator, device=device) * 0.02).to(torch.bfloat16).cpu()

    def norm(size: int) -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(size, generator=generator, device=device)).to(torch.bfloat16).cpu()

    p = f"model.layers.{layer}."
    tensors = {
        p + "input_layernorm.weight": norm(h),
        p + "post_attention_layernorm.weight": norm(h),
        p + "self_attn.q_proj.weight": normal(q, h),
        p + "self_attn.k_proj.weight": normal(kv, h),
        p + "self_attn.v_proj.weight": normal(kv, h),
        p + "self_attn.o_proj.weight": normal(h, q),
        p + "self_attn.q_norm.weight": norm(d),
        p + "self_attn.k_norm.weight": norm(d),
        p + "mlp.gate.weight": normal(config["num_experts"], h),
    }
    for e in range(config["num_experts"]):
        tensors.update({
            f"{p}mlp.experts.{e}.gate_proj.weight": normal(inter, h),
            f"{p}mlp.experts.{e}.up_proj.weight": normal(inter, h),
            f"{p}mlp.experts.{e}.down_proj.weight": normal(h, inter),
        })
    return tensors


def write_sharded_checkpoint(
    folder: str, config: dict, layer_tensors: Callable[[dict, int, torch.Generator, str], dict[str, torch.Tensor]],
    tokenizer_dir: Optional[str] = None, seed: int = 0, device: str = "cpu", norm_offset: float = 1.0,
) -> str:
    """`config`'s checkpoint in `folder`, one shard per layer (host memory holds one layer at a
    time: `layer_tensors(config, layer, generator, device)`) and a model.safetensors.index.json;
    the final norm's weights are norm_offset + noise (0 for the (1 + w) norms)."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    generator = torch.Generator(device=device).manual_seed(seed)
    h, vocab = config["hidden_size"], config["vocab_size"]
    weight_map: dict[str, str] = {}

    def shard(name: str, tensors: dict[str, torch.Tensor]) -> None:
        save_file(tensors, os.path.join(folder, name))
        weight_map.update(dict.fromkeys(tensors, name))

    embed = (torch.randn(vocab, h, generator=generator, device=device) * 0.02).to(torch.bfloat16).cpu()
    head = (torch.randn(vocab, h, generator=generator, device=device) * 0.02).to(torch.bfloat16).cpu()
    final_norm = (norm_offset + 0.1 * torch.randn(h, generator=generator, device=device)).to(torch.bfloat16).cpu()
    shard("model-embed.safetensors", {"model.embed_tokens.weight": embed, "lm_head.weight": head,
                                      "model.norm.weight": final_norm})
    for layer in range(config["num_hidden_layers"]):
        shard(f"model-layer-{layer:03d}.safetensors", layer_tensors(config, layer, generator, device))
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    if tokenizer_dir:
        for name in os.listdir(tokenizer_dir):
            shutil.copy(os.path.join(tokenizer_dir, name), folder)
    return folder


def write_qwen3_moe_checkpoint(
    folder: str, tokenizer_dir: Optional[str] = None, seed: int = 0, device: str = "cpu", **overrides
) -> str:
    """A Qwen3-30B-A3B-shaped checkpoint (config overrides allowed) in `folder`."""
    config = {**QWEN3_30B_A3B, **overrides}
    return write_sharded_checkpoint(folder, config, qwen3_moe_layer_tensors, tokenizer_dir, seed, device)


# Qwen3-Next-80B-A3B's config.json values: 48 layers, every 4th full attention, the others Gated
# DeltaNet; 512 experts (top-10, intermediate 512) plus a shared expert in every layer.
QWEN3_NEXT_80B_A3B = dict(
    architectures=["Qwen3NextForCausalLM"],
    model_type="qwen3_next",
    hidden_size=2048,
    intermediate_size=5120,
    num_hidden_layers=48,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=256,
    vocab_size=151936,
    max_position_embeddings=262144,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    tie_word_embeddings=False,
    hidden_act="silu",
    torch_dtype="bfloat16",
    bos_token_id=151643,
    eos_token_id=151645,
    full_attention_interval=4,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    num_experts=512,
    num_experts_per_tok=10,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
)


def qwen3_next_layer_tensors(config: dict, layer: int, generator: torch.Generator, device: str) -> dict[str, torch.Tensor]:
    """One Qwen3-Next layer's HF tensors: Gated DeltaNet or gated attention (by
    full_attention_interval), then the MoE block with its shared expert. Norm weights are
    zero-centred (applied as 1 + w)."""
    h, d = config["hidden_size"], config["head_dim"]

    def normal(*shape: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(shape, generator=generator, device=device) * std).to(torch.bfloat16).cpu()

    p = f"model.layers.{layer}."
    tensors = {p + "input_layernorm.weight": normal(h, std=0.1), p + "post_attention_layernorm.weight": normal(h, std=0.1)}
    if (layer + 1) % config["full_attention_interval"] == 0:
        q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
        tensors.update({
            p + "self_attn.q_proj.weight": normal(2 * q, h),  # each head's query, then its output gate
            p + "self_attn.k_proj.weight": normal(kv, h),
            p + "self_attn.v_proj.weight": normal(kv, h),
            p + "self_attn.o_proj.weight": normal(h, q),
            p + "self_attn.q_norm.weight": normal(d, std=0.1),
            p + "self_attn.k_norm.weight": normal(d, std=0.1),
        })
    else:
        hk, hv = config["linear_num_key_heads"], config["linear_num_value_heads"]
        dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
        conv_dim = 2 * hk * dk + hv * dv
        tensors.update({
            p + "linear_attn.in_proj_qkvz.weight": normal(2 * hk * dk + 2 * hv * dv, h),
            p + "linear_attn.in_proj_ba.weight": normal(2 * hv, h),
            p + "linear_attn.conv1d.weight": normal(conv_dim, 1, config["linear_conv_kernel_dim"], std=0.3),
            p + "linear_attn.dt_bias": torch.ones(hv, dtype=torch.bfloat16),
            p + "linear_attn.A_log": torch.linspace(0.0, 2.7, hv).to(torch.bfloat16),  # A in [1, 15]
            p + "linear_attn.norm.weight": (1.0 + normal(dv, std=0.1).float()).to(torch.bfloat16),
            p + "linear_attn.out_proj.weight": normal(h, hv * dv),
        })
    inter, shared = config["moe_intermediate_size"], config["shared_expert_intermediate_size"]
    tensors.update({
        p + "mlp.gate.weight": normal(config["num_experts"], h),
        p + "mlp.shared_expert.gate_proj.weight": normal(shared, h),
        p + "mlp.shared_expert.up_proj.weight": normal(shared, h),
        p + "mlp.shared_expert.down_proj.weight": normal(h, shared),
        p + "mlp.shared_expert_gate.weight": normal(1, h),
    })
    for e in range(config["num_experts"]):
        tensors.update({
            f"{p}mlp.experts.{e}.gate_proj.weight": normal(inter, h),
            f"{p}mlp.experts.{e}.up_proj.weight": normal(inter, h),
            f"{p}mlp.experts.{e}.down_proj.weight": normal(h, inter),
        })
    return tensors


def write_qwen3_next_checkpoint(
    folder: str, tokenizer_dir: Optional[str] = None, seed: int = 0, device: str = "cpu", **overrides
) -> str:
    """A Qwen3-Next-80B-A3B-shaped checkpoint (config overrides allowed, e.g. num_hidden_layers=4:
    3 Gated DeltaNet layers and 1 full-attention layer) in `folder`."""
    config = {**QWEN3_NEXT_80B_A3B, **overrides}
    return write_sharded_checkpoint(folder, config, qwen3_next_layer_tensors, tokenizer_dir, seed, device,
                                    norm_offset=0.0)


def preset_config(preset: str, layers: Optional[int] = None) -> dict:
    """The config.json a preset writes (with `layers` layers when given)."""
    return {**PRESETS[preset], **({"num_hidden_layers": layers} if layers else {})}


def write_preset(folder: str, preset: str, tokenizer_dir: Optional[str] = None, layers: Optional[int] = None,
                 seed: int = 0, device: str = "cpu", fp8_block: bool = False,
                 dequantized_twin: Optional[str] = None) -> None:
    """A random checkpoint of `preset`'s shape in `folder` (MoE presets: bf16 only)."""
    if preset in CONFIG_ONLY_PRESETS:
        raise ValueError(f"{preset} is served with dummy weights only (bench_serving_gpu.py --dummy-weights).")
    config = preset_config(preset, layers)
    sparse_writers = {"Qwen3MoeForCausalLM": write_qwen3_moe_checkpoint, "Qwen3NextForCausalLM": write_qwen3_next_checkpoint}
    writer = sparse_writers.get(config["architectures"][0])
    if writer is not None:
        if fp8_block:
            raise ValueError("--fp8-block writes dense Qwen3 presets only.")
        writer(folder, tokenizer_dir, seed, device, **config)
        return
    overrides = {k: v for k, v in config.items() if QWEN3_0_6B.get(k) != v}
    write_qwen3_checkpoint(folder, tokenizer_dir, seed, device, fp8_block, dequantized_twin, **overrides)


# Llama-3.1-70B's config.json values: served with --load-format dummy (140 GB of weights are
# never written; write_preset refuses it).
LLAMA31_70B = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    hidden_size=8192,
    intermediate_size=28672,
    num_hidden_layers=80,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    tie_word_embeddings=False,
    hidden_act="silu",
    torch_dtype="bfloat16",
    bos_token_id=128000,
    eos_token_id=128009,
)
CONFIG_ONLY_PRESETS = ("llama3.1-70b",)
PRESETS.update({"qwen3-30b-a3b": QWEN3_30B_A3B, "qwen3-next-80b-a3b": QWEN3_NEXT_80B_A3B, "llama3.1-70b": LLAMA31_70B})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder")
    parser.add_argument("--tokenizer", help="folder of tokenizer files to copy in")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="qwen3-0.6b",
                        help="the model shape (qwen3-30b-a3b: 128 experts, top-8, about 61 GB in bf16)")
    parser.add_argument("--layers", type=int, help="fewer layers than the preset's")
    parser.add_argument("--fp8-block", action="store_true", help="linears as block-FP8 codes + 128x128 weight_scale_inv")
    parser.add_argument("--dequantized-twin", metavar="FOLDER", help="with --fp8-block: also write its bf16 twin here")
    args = parser.parse_args()
    write_preset(args.folder, args.preset, args.tokenizer, args.layers, args.seed, args.device, args.fp8_block,
                 args.dequantized_twin)
    print(f"wrote {args.folder}" + (f" and {args.dequantized_twin}" if args.dequantized_twin else ""))


if __name__ == "__main__":
    main()
