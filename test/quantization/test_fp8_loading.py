"""FP8 checkpoints loaded into the linear layers on CPU (load_model; the CPU engine itself
refuses FP8): every quantised linear's codes x scales equal the checkpoint's dequantised weight
split as TP splits it (TP=1 and both ranks of TP=2, block and per-tensor / per-channel scales,
KV heads replicated), --quantization fp8 on a bf16 checkpoint, and the refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sgl_kernel_ext.gemm.fp8_reference import (
    FP8_DTYPE,
    dequantize_weight,
    fp8_linear_reference,
    quantize_weight_rows,
)
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.linear import ColumnParallelLinear
from sglang.srt.layers.quantization import Fp8Scheme
from sglang.srt.layers.quantization.fp8_linear import Fp8LinearMethod
from sglang.srt.model_loader import load_model

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmark"))
from random_checkpoint import QWEN3_0_6B, qwen3_tensors, write_qwen3_checkpoint  # noqa: E402

# 2 q heads and 1 KV head of 128: at TP=2 the KV head is replicated, every slice is 128-aligned.
TINY = dict(hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=128, vocab_size=320, tie_word_embeddings=False)
PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def block_pair(tmp_path_factory) -> tuple[str, str]:
    base = tmp_path_factory.mktemp("fp8")
    fp8, twin = str(base / "fp8"), str(base / "twin")
    write_qwen3_checkpoint(fp8, fp8_block=True, dequantized_twin=twin, **TINY)
    return fp8, twin


def write_scaled_checkpoint(folder: Path, quantization_config: dict, per_channel: bool) -> str:
    """TINY with every linear per-tensor (fp8) or per-channel (compressed-tensors) FP8 and a
    static input_scale per linear (different values, so a fused layer must take their maximum)."""
    config = {**QWEN3_0_6B, **TINY, "quantization_config": quantization_config}
    tensors = qwen3_tensors(config, torch.Generator().manual_seed(1), "cpu")
    for i, name in enumerate([n for n in list(tensors) if n.rsplit(".", 2)[-2] in PARTS]):
        weight = tensors[name].float()
        if per_channel:
            codes, scale = quantize_weight_rows(weight)
            scale = scale.view(-1, 1)  # [N, 1] as llm-compressor writes it
        else:
            scale = weight.abs().max() / 448.0  # []
            codes = (weight / scale).to(FP8_DTYPE)
        prefix = name.removesuffix(".weight")
        tensors[name], tensors[prefix + ".weight_scale"] = codes, scale
        tensors[prefix + ".input_scale"] = torch.tensor(0.01 * (i % 3 + 1))
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def dequantised_checkpoint(folder: str) -> dict[str, torch.Tensor]:
    """HF linear name -> float32 weight: codes x scales as the checkpoint stores them."""
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    out = {}
    for name, t in tensors.items():
        if t.dtype != FP8_DTYPE:
            continue
        prefix = name.removesuffix(".weight")
        if prefix + ".weight_scale_inv" in tensors:
            out[prefix] = dequantize_weight(t, tensors[prefix + ".weight_scale_inv"], (128, 128))
        else:
            scale = tensors[prefix + ".weight_scale"].float().reshape(-1)
            out[prefix] = dequantize_weight(t, scale.expand(t.shape[0]).contiguous(), None)
    return out


def expected_shards(full: dict[str, torch.Tensor], layer: int, rank: int, tp: int) -> dict[str, torch.Tensor]:
    """Our linears' weights on `rank` of `tp`, cut by hand from the full weights."""
    p = f"model.layers.{layer}."

    def rows(name: str, replicated: bool = False) -> torch.Tensor:
        w = full[p + name]
        return w if replicated else w.chunk(tp, 0)[rank]

    def cols(name: str) -> torch.Tensor:
        return full[p + name].chunk(tp, 1)[rank]

    kv_replicated = TINY["num_key_value_heads"] < tp
    return {
        p + "self_attn.qkv_proj": torch.cat([rows("self_attn.q_proj"), rows("self_attn.k_proj", kv_replicated),
                                             rows("self_attn.v_proj", kv_replicated)]),
        p + "self_attn.o_proj": cols("self_attn.o_proj"),
        p + "mlp.gate_up_proj": torch.cat([rows("mlp.gate_proj"), rows("mlp.up_proj")]),
        p + "mlp.down_proj": cols("mlp.down_proj"),
    }


def loaded_weights(model) -> dict[str, torch.Tensor]:
    out = {}
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            scale, block = method.weight_scales(module)
            out[name] = dequantize_weight(module.weight, scale, block)
    return out


def load(folder: str, rank: int = 0, tp: int = 1, quantization=None):
    return load_model(ModelConfig.from_path(folder), folder, torch.float32, "cpu", rank, tp, quantization=quantization)


@pytest.mark.parametrize("tp", [1, 2])
def test_block_fp8_shards_equal_the_split_dequantised_weight(block_pair, tp):
    fp8, _ = block_pair
    full = dequantised_checkpoint(fp8)
    for rank in range(tp):
        model = load(fp8, rank, tp)
        weights = loaded_weights(model)
        assert len(weights) == 4 * TINY["num_hidden_layers"]
        for layer in range(TINY["num_hidden_layers"]):
            for name, expected in expected_shards(full, layer, rank, tp).items():
                assert torch.equal(weights[name], expected), (tp, rank, name)
        # The LM head and the embeddings stay in the model dtype.
        assert model.lm_head.weight.dtype == torch.float32
        assert model.model.embed_tokens.weight.dtype == torch.float32


def test_dequantised_twin_is_the_block_checkpoint_in_bf16(block_pair):
    fp8, twin = block_pair
    twin_tensors = load_file(os.path.join(twin, "model.safetensors"))
    for prefix, weight in dequantised_checkpoint(fp8).items():
        assert torch.equal(twin_tensors[prefix + ".weight"], weight.to(torch.bfloat16)), prefix
    assert "quantization_config" not in json.loads(Path(twin, "config.json").read_text())


@pytest.mark.parametrize("method", ["fp8", "compressed-tensors"])
@pytest.mark.parametrize("tp", [1, 2])
def test_per_tensor_and_per_channel_scales_shard_with_rows(tmp_path, method, tp):
    if method == "fp8":
        qc, per_channel = {"quant_method": "fp8", "activation_scheme": "static"}, False
    else:
        group = {"targets": ["Linear"],
                 "weights": {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": "channel"},
                 "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": "tensor"}}
        qc, per_channel = {"quant_method": "compressed-tensors", "config_groups": {"g": group}, "ignore": ["lm_head"]}, True
    folder = write_scaled_checkpoint(tmp_path / method, qc, per_channel)
    full = dequantised_checkpoint(folder)
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    for rank in range(tp):
        model = load(folder, rank, tp)
        weights = loaded_weights(model)
        for layer in range(TINY["num_hidden_layers"]):
            for name, expected in expected_shards(full, layer, rank, tp).items():
                assert torch.equal(weights[name], expected), (method, tp, rank, name)
        qkv = model.model.layers[0].self_attn.qkv_proj
        inputs = [tensors[f"model.layers.0.self_attn.{p}.input_scale"] for p in ("q_proj", "k_proj", "v_proj")]
        assert qkv.input_scale.item() == max(float(s) for s in inputs)


def test_block_scales_refuse_a_tp_slice_off_the_block_edges(tmp_path):
    folder = str(tmp_path / "fp8")
    write_qwen3_checkpoint(folder, fp8_block=True, **{**TINY, "intermediate_size": 384})
    load(folder)  # TP=1: 384 rows are whole blocks
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.(gate_up|down)_proj cannot be split.*128-wide"):
        load(folder, 0, 2)  # 192 rows per rank


def test_online_fp8_quantises_bf16_checkpoint_per_channel(block_pair):
    _, twin = block_pair
    model = load(twin, quantization="fp8")
    bf16 = load_file(os.path.join(twin, "model.safetensors"))
    down = model.model.layers[1].mlp.down_proj
    assert down.weight.dtype == FP8_DTYPE and down.weight_scale.shape == (TINY["hidden_size"],)
    reference = bf16["model.layers.1.mlp.down_proj.weight"].float()
    dequantised = dequantize_weight(down.weight, down.weight_scale, None)
    assert ((dequantised - reference).abs() <= reference.abs() / 16 + 1e-6).all()
    assert model.lm_head.weight.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp8_linear_apply_off_cuda_is_the_reference(dtype):
    """Activations per token where the rule picks _scaled_mm (bf16), per group of 128 columns
    where it picks the Triton kernel (_scaled_mm's row-wise scales write bf16 only)."""
    layer = ColumnParallelLinear(256, 128, bias=True, params_dtype=dtype)
    layer.weight.data.copy_(torch.randn(128, 256))
    layer.bias.data.normal_()
    layer.quant_method = Fp8LinearMethod(Fp8Scheme(False, "channel"), "probe")
    layer.process_weights_after_loading()
    x = torch.randn(3, 256).to(dtype)
    group = 256 if dtype == torch.bfloat16 else 128
    expected = fp8_linear_reference(x, layer.weight, layer.weight_scale, None, group) + layer.bias
    torch.testing.assert_close(layer(x), expected)


def test_cpu_engine_refuses_fp8_at_start_up(block_pair):
    fp8, twin = block_pair
    from sglang.srt.model_executor.model_runner import ModelRunner

    with pytest.raises(ValueError, match="FP8 weights need a CUDA GPU: this FP8 checkpoint \\(fp8\\) cannot be served by the cpu engine"):
        ModelRunner(fp8, device="cpu")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for argv in (["--model-path", fp8], ["--model-path", twin, "--quantization", "fp8"]):
        proc = subprocess.run([sys.executable, "-m", "sglang.launch_server", *argv, "--device", "cpu"],
                              capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode != 0
        assert "error: FP8 weights need a CUDA GPU" in proc.stderr and "cpu engine" in proc.stderr, proc.stderr[-2000:]
