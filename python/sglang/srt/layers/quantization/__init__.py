"""Quantised linear layers: the methods a checkpoint's quantization_config or --quantization
names, each parsed in its own module into a QuantConfig that the linear layers read."""

from __future__ import annotations

from typing import Any, Callable, Optional

from sglang.srt.layers.quantization.base import Fp8Scheme, QuantConfig
from sglang.srt.layers.quantization.compressed_tensors import parse_compressed_tensors_config
from sglang.srt.layers.quantization.fp8 import online_fp8_config, parse_fp8_config

# SGLang's --quantization values (its server_args' QUANTIZATION_CHOICES).
QUANTIZATION_CHOICES = (
    "awq", "fp8", "mxfp8", "gptq", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf", "modelopt",
    "modelopt_fp8", "modelopt_fp4", "nvfp4_online", "modelopt_mixed", "petit_nvfp4", "w8a8_int8", "w8a8_fp8",
    "moe_wna16", "w4afp8", "mxfp4", "auto-round", "auto-round-int8", "compressed-tensors", "modelslim",
    "mxfp_w4a8", "quark", "quark_int4fp8_moe", "quark_mxfp4", "mlx_q4", "mlx_q8", "unquant", "humming",
)
# quant_method -> its parser; the methods this engine implements.
CHECKPOINT_METHODS: dict[str, Callable[[dict[str, Any]], QuantConfig]] = {
    "fp8": parse_fp8_config,
    "compressed-tensors": parse_compressed_tensors_config,
}
IMPLEMENTED = tuple(CHECKPOINT_METHODS)

__all__ = ["Fp8Scheme", "QuantConfig", "QUANTIZATION_CHOICES", "IMPLEMENTED", "check_quantization_device", "check_quantization_flag",
           "resolve_quant_config"]


def check_quantization_flag(flag: Optional[str]) -> None:
    """Refuse a --quantization value that is not SGLang's or that this engine does not implement."""
    if flag is None or flag in IMPLEMENTED:
        return
    kind = "is one of SGLang's values that this engine does not implement" if flag in QUANTIZATION_CHOICES \
        else "is not one of SGLang's values"
    raise ValueError(f"--quantization {flag!r} {kind}; supported: {', '.join(IMPLEMENTED)}.")


def resolve_quant_config(hf_config: dict[str, Any], flag: Optional[str], fmt: str = "safetensors") -> Optional[QuantConfig]:
    """The quantisation a model loads with: its config.json's quantization_config (the flag, if
    given, must name the same method), or --quantization fp8 on an unquantised safetensors
    checkpoint; None for neither."""
    check_quantization_flag(flag)
    qc = hf_config.get("quantization_config")
    if qc:
        method = qc.get("quant_method")
        if method not in CHECKPOINT_METHODS:
            raise ValueError(
                f"The checkpoint's quantization_config quant_method {method!r} is not supported; supported: "
                f"{', '.join(IMPLEMENTED)}."
            )
        if flag is not None and flag != method:
            raise ValueError(f"--quantization {flag} contradicts the checkpoint, whose quantization_config is {method!r}.")
        return CHECKPOINT_METHODS[method](qc)
    if flag is None:
        return None
    if flag != "fp8" or fmt != "safetensors":
        raise ValueError(
            f"--quantization {flag} needs a checkpoint quantised that way; this {fmt} checkpoint has no "
            "quantization_config (a bf16 safetensors checkpoint is quantised at load by --quantization fp8 only)."
        )
    return online_fp8_config()


def check_quantization_device(config: Optional[QuantConfig], device: str) -> None:
    """FP8 linears run on CUDA only: the CPU engine refuses them at start-up."""
    if config is not None and device != "cuda":
        what = "--quantization fp8" if not config.scheme.checkpoint_fp8 else f"this FP8 checkpoint ({config.method})"
        raise ValueError(
            f"FP8 weights need a CUDA GPU: {what} cannot be served by the {device} engine. Serve a bf16/fp32 "
            "(or GGUF) checkpoint on the CPU, or use --device cuda."
        )
