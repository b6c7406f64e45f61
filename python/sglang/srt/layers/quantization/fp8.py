"""quant_method "fp8" checkpoints (per-tensor scales, or block scales as DeepSeek-V3 and
Qwen3-*-FP8 ship them), and --quantization fp8 on a bf16 checkpoint."""

from __future__ import annotations

from typing import Any

from sglang.srt.layers.quantization.base import Fp8Scheme, QuantConfig

ACTIVATION_SCHEMES = ("dynamic", "static")
# The Triton kernel's K tile: block scales must cover whole tiles along K.
BLOCK_K_MULTIPLE = 128


def parse_fp8_config(qc: dict[str, Any]) -> QuantConfig:
    """config.json's quantization_config with quant_method "fp8"."""
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme not in ACTIVATION_SCHEMES:
        raise ValueError(f"fp8 quantization_config: activation_scheme {scheme!r} is not one of {ACTIVATION_SCHEMES}.")
    ignored = tuple(qc.get("ignored_layers") or qc.get("modules_to_not_convert") or ())
    block = qc.get("weight_block_size")
    if block is None:
        return QuantConfig("fp8", Fp8Scheme(True, "tensor", static_input=scheme == "static"), ignored)
    if len(block) != 2 or block[1] % BLOCK_K_MULTIPLE or block[0] < 1:
        raise ValueError(
            f"fp8 quantization_config: weight_block_size {block} is not supported (blocks of [N, K] with K a "
            f"multiple of {BLOCK_K_MULTIPLE}, e.g. [128, 128])."
        )
    if scheme == "static":
        raise ValueError("fp8 quantization_config: block scales with activation_scheme static are not supported.")
    return QuantConfig("fp8", Fp8Scheme(True, "block", block=(int(block[0]), int(block[1]))), ignored)


def online_fp8_config() -> QuantConfig:
    """--quantization fp8 on a bf16 checkpoint: every linear quantised at load, one scale per
    output channel; activations per token at run time."""
    return QuantConfig("fp8", Fp8Scheme(False, "channel"))
