"""quantization_config parsing (fp8 per-tensor and block, compressed-tensors FP8) and the
--quantization flag: what each format becomes, and the refusals, each naming what it refuses."""

from __future__ import annotations

import pytest

from sglang.srt.layers.quantization import (
    QUANTIZATION_CHOICES,
    Fp8Scheme,
    check_quantization_device,
    check_quantization_flag,
    resolve_quant_config,
)
from sglang.srt.server_args import ServerArgs, prepare_server_args

FP8_BLOCK = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
FP8_TENSOR_STATIC = {"activation_scheme": "static", "quant_method": "fp8", "ignored_layers": ["model.layers.1.mlp.down_proj"]}


def compressed_tensors(weights: dict, inputs=None, **extra) -> dict:
    group = {"targets": ["Linear"], "weights": weights}
    if inputs is not None:
        group["input_activations"] = inputs
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": group},
            "ignore": ["lm_head", "re:.*layers\\.0\\.self_attn\\.[qkv]_proj"], **extra}


FP8_CHANNEL = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": "channel"}
TOKEN_DYNAMIC = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": True, "strategy": "token"}
TENSOR_STATIC = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": "tensor"}


def resolve(qc, flag=None):
    return resolve_quant_config({"quantization_config": qc} if qc else {}, flag)


def test_fp8_block_config():
    config = resolve(FP8_BLOCK)
    assert config.method == "fp8"
    assert config.scheme == Fp8Scheme(True, "block", block=(128, 128))
    assert config.scheme_for("model.layers.0.self_attn.qkv_proj") == config.scheme


def test_fp8_per_tensor_static_config_and_ignored_layers():
    config = resolve(FP8_TENSOR_STATIC)
    assert config.scheme == Fp8Scheme(True, "tensor", static_input=True)
    assert config.scheme_for("model.layers.1.mlp.down_proj") is None
    assert config.scheme_for("model.layers.0.mlp.down_proj") is not None
    # modules_to_not_convert is the other name of the list, matched without the "model." prefix too.
    other = resolve({"quant_method": "fp8", "activation_scheme": "dynamic", "modules_to_not_convert": ["layers.0.mlp.gate_proj", "layers.0.mlp.up_proj"]})
    assert other.scheme_for("model.layers.0.mlp.gate_up_proj") is None
    assert other.scheme_for("model.layers.1.mlp.gate_up_proj") is not None


def test_fused_projection_partly_ignored_is_refused():
    config = resolve({"quant_method": "fp8", "activation_scheme": "dynamic", "ignored_layers": ["model.layers.0.self_attn.q_proj"]})
    with pytest.raises(ValueError, match="model.layers.0.self_attn.qkv_proj"):
        config.scheme_for("model.layers.0.self_attn.qkv_proj")


def test_compressed_tensors_configs():
    channel = resolve(compressed_tensors(FP8_CHANNEL, TOKEN_DYNAMIC))
    assert channel.method == "compressed-tensors"
    assert channel.scheme == Fp8Scheme(True, "channel")
    assert channel.scheme_for("model.layers.0.self_attn.qkv_proj") is None  # the "re:" entry
    assert channel.scheme_for("model.layers.1.self_attn.qkv_proj") == channel.scheme
    tensor = resolve(compressed_tensors({**FP8_CHANNEL, "strategy": "tensor"}, TENSOR_STATIC))
    assert tensor.scheme == Fp8Scheme(True, "tensor", static_input=True)


@pytest.mark.parametrize(
    "qc, match",
    [
        ({**FP8_BLOCK, "activation_scheme": "weird"}, "activation_scheme 'weird'"),
        ({**FP8_BLOCK, "weight_block_size": [64, 64]}, r"weight_block_size \[64, 64\]"),
        ({**FP8_BLOCK, "activation_scheme": "static"}, "block scales with activation_scheme static"),
        ({"quant_method": "awq", "bits": 4}, "quant_method 'awq' is not supported"),
        (compressed_tensors(FP8_CHANNEL), "W8A16"),
        (compressed_tensors({**FP8_CHANNEL, "type": "int"}, TOKEN_DYNAMIC), "symmetric 8-bit float"),
        (compressed_tensors({**FP8_CHANNEL, "strategy": "group"}, TOKEN_DYNAMIC), "weight strategy 'group'"),
        (compressed_tensors(FP8_CHANNEL, {**TOKEN_DYNAMIC, "strategy": "tensor"}), "input_activations strategy"),
        (compressed_tensors(FP8_CHANNEL, TOKEN_DYNAMIC, kv_cache_scheme={"num_bits": 8}), "kv_cache_scheme"),
        ({**compressed_tensors(FP8_CHANNEL, TOKEN_DYNAMIC), "format": "pack-quantized"}, "format 'pack-quantized'"),
    ],
)
def test_unsupported_checkpoint_configs_are_refused(qc, match):
    with pytest.raises(ValueError, match=match):
        resolve(qc)


def test_flag_online_fp8_and_contradictions():
    assert resolve(None) is None
    online = resolve(None, "fp8")
    assert online.scheme == Fp8Scheme(False, "channel")
    assert resolve(FP8_BLOCK, "fp8").scheme.block == (128, 128)  # the flag may name the checkpoint's method
    with pytest.raises(ValueError, match="--quantization fp8 contradicts the checkpoint.*compressed-tensors"):
        resolve(compressed_tensors(FP8_CHANNEL, TOKEN_DYNAMIC), "fp8")
    with pytest.raises(ValueError, match="--quantization compressed-tensors needs a checkpoint quantised that way"):
        resolve(None, "compressed-tensors")
    with pytest.raises(ValueError, match="gguf"):
        resolve_quant_config({}, "fp8", "gguf")


@pytest.mark.parametrize("value", ["awq", "gptq", "w8a8_int8", "bitsandbytes"])
def test_unimplemented_sglang_values_are_refused_naming_flag_and_value(value):
    assert value in QUANTIZATION_CHOICES
    with pytest.raises(ValueError, match=f"--quantization '{value}' is one of SGLang's values that this engine does not implement"):
        check_quantization_flag(value)
    with pytest.raises(ValueError, match=f"--quantization '{value}'"):
        prepare_server_args(["--quantization", value]).validate()


def test_unknown_value_is_refused():
    with pytest.raises(ValueError, match="--quantization 'int3' is not one of SGLang's values"):
        check_quantization_flag("int3")


def test_cpu_engine_refuses_fp8():
    with pytest.raises(ValueError, match="FP8 weights need a CUDA GPU: --quantization fp8 cannot be served by the cpu engine"):
        check_quantization_device(resolve(None, "fp8"), "cpu")
    with pytest.raises(ValueError, match="this FP8 checkpoint \\(fp8\\) cannot be served by the cpu engine"):
        check_quantization_device(resolve(FP8_BLOCK), "cpu")
    check_quantization_device(resolve(FP8_BLOCK), "cuda")


def test_flag_is_ours_not_an_ignored_compat_flag():
    args = prepare_server_args(["--quantization", "fp8"])
    assert args.quantization == "fp8"
    assert "--quantization" not in args.ignored_flags
    assert ServerArgs().quantization is None
