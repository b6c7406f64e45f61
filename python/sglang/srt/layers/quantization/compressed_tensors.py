"""quant_method "compressed-tensors" checkpoints (llm-compressor) with FP8 weights: per-channel
or per-tensor `weight_scale`, dynamic per-token activations (or a static per-tensor
`input_scale`)."""

from __future__ import annotations

from typing import Any, Optional

from sglang.srt.layers.quantization.base import Fp8Scheme, QuantConfig

FORMATS = ("float-quantized", "naive-quantized")
WEIGHT_STRATEGIES = ("tensor", "channel")


def parse_compressed_tensors_config(qc: dict[str, Any]) -> QuantConfig:
    fmt = qc.get("format", "float-quantized")
    if fmt not in FORMATS:
        raise ValueError(f"compressed-tensors format {fmt!r} is not supported (FP8 only: {', '.join(FORMATS)}).")
    if qc.get("kv_cache_scheme"):
        raise ValueError("compressed-tensors kv_cache_scheme (an FP8 KV cache) is not supported.")
    groups = list((qc.get("config_groups") or {}).values())
    if len(groups) != 1:
        raise ValueError(f"compressed-tensors: exactly one config group is supported, got {len(groups)}.")
    group = groups[0]
    targets = group.get("targets") or []
    if targets != ["Linear"]:
        raise ValueError(f"compressed-tensors: targets {targets} are not supported (only [\"Linear\"]).")
    return QuantConfig("compressed-tensors", _scheme(group.get("weights") or {}, group.get("input_activations")),
                       tuple(qc.get("ignore") or ()))


def _scheme(weights: dict[str, Any], inputs: Optional[dict[str, Any]]) -> Fp8Scheme:
    _check_fp8("weights", weights)
    strategy = weights.get("strategy")
    if strategy not in WEIGHT_STRATEGIES or weights.get("dynamic"):
        raise ValueError(
            f"compressed-tensors: weight strategy {strategy!r} (dynamic={weights.get('dynamic')}) is not supported "
            f"(static {' or '.join(WEIGHT_STRATEGIES)} scales)."
        )
    if inputs is None:
        raise ValueError("compressed-tensors: weight-only FP8 (no input_activations, W8A16) is not supported.")
    _check_fp8("input_activations", inputs)
    dynamic_token = inputs.get("dynamic") and inputs.get("strategy") == "token"
    static_tensor = not inputs.get("dynamic") and inputs.get("strategy") == "tensor"
    if not (dynamic_token or static_tensor):
        raise ValueError(
            f"compressed-tensors: input_activations strategy {inputs.get('strategy')!r} with dynamic="
            f"{inputs.get('dynamic')} is not supported (dynamic per token, or a static per-tensor scale)."
        )
    return Fp8Scheme(True, strategy, static_input=static_tensor)


def _check_fp8(what: str, args: dict[str, Any]) -> None:
    if args.get("num_bits") != 8 or args.get("type") != "float" or args.get("symmetric") is False:
        raise ValueError(
            f"compressed-tensors: {what} {{num_bits: {args.get('num_bits')}, type: {args.get('type')!r}}} is not "
            "supported (symmetric 8-bit float only)."
        )
