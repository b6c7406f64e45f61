"""The attention half of a Llama decoder layer at decode in one C call on CPU (decode_layer_cpu.c):
RMSNorm (+ residual), qkv, RoPE + KV store, attention, o + residual, RMSNorm, gate_up. It runs the
separate kernels' C functions in their order, so its results are those of the unfused path bit
for bit; `decode_layer_attention_reference` is the same function from the plain-torch references."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

from sgl_kernel_ext.attention.reference import decode_attention_reference
from sgl_kernel_ext.cpu_build import I64, PTR, load_kernel
from sgl_kernel_ext.gemm.block_quant_linear import BlockQuantWeight, block_quant_linear_reference
from sgl_kernel_ext.norm.rmsnorm_cpu import rmsnorm_reference
from sgl_kernel_ext.rotary.rope_store_cpu import rope_store_reference


class _LayerWeights(ctypes.Structure):
    """layer_weights in decode_layer_cpu.c."""

    _fields_ = [
        ("input_norm", PTR), ("post_norm", PTR), ("eps", ctypes.c_float), ("scale", ctypes.c_float),
        ("hidden", I64), ("q_heads", I64), ("kv_heads", I64), ("head_dim", I64),
        ("qkv", PTR), ("qkv_bias", PTR), ("qkv_out", I64), ("qkv_bits", I64),
        ("o", PTR), ("o_bias", PTR), ("o_bits", I64),
        ("gate_up", PTR), ("gate_up_out", I64), ("gate_up_bits", I64),
    ]


class _DecodeStep(ctypes.Structure):
    """decode_step in decode_layer_cpu.c."""

    _fields_ = [
        ("rows", I64), ("cos", PTR), ("signed_sin", PTR), ("loc", PTR), ("slots", I64),
        ("req_to_token", PTR), ("table_rows", I64), ("table_stride", I64),
        ("req_pool_indices", PTR), ("seq_lens", PTR),
        ("qkv", PTR), ("attn", PTR), ("o", PTR), ("normed", PTR), ("num_threads", I64),
    ]


_ARGTYPES = (PTR, PTR, PTR, PTR, PTR, PTR, PTR)
# (source, C function, argument types, result type): also built with -DPORTABLE_ONLY by the tests.
_KERNEL = ("layer/decode_layer_cpu.c", "decode_layer_attention_f32", _ARGTYPES, ctypes.c_int)
_ERRORS = {
    1: "head_dim must be even and at most 1024",
    2: "out_cache_loc must lie inside the KV cache",
    3: "seq_lens must lie in [1, req_to_token's row length]",
    4: "req_pool_indices must lie inside req_to_token",
}


def _kernel() -> Optional[ctypes._CFuncPtr]:
    return load_kernel(*_KERNEL)


def decode_layer_kernel_available() -> bool:
    return _kernel() is not None


def _ptr(t: Optional[torch.Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def _float32_vector(name: str, t: Optional[torch.Tensor], size: int) -> None:
    if t is not None and (t.dtype != torch.float32 or t.device.type != "cpu" or t.shape != (size,) or not t.is_contiguous()):
        raise ValueError(f"{name} must be a contiguous float32 CPU tensor [{size}].")


@dataclass
class DecodeLayerWeights:
    """One layer's weights as the kernel reads them; holds the tensors the pointers point into."""

    struct: _LayerWeights
    tensors: tuple
    hidden: int
    qkv_out: int
    q_width: int  # q heads * head_dim: the attention output's width
    gate_up_out: int
    kv_shape: tuple[int, int]  # (kv_heads, head_dim) of the cache rows


def decode_layer_weights(
    input_norm: torch.Tensor,
    post_norm: torch.Tensor,
    eps: float,
    qkv: BlockQuantWeight,
    qkv_bias: Optional[torch.Tensor],
    o: BlockQuantWeight,
    o_bias: Optional[torch.Tensor],
    gate_up: BlockQuantWeight,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    scale: float,
) -> DecodeLayerWeights:
    hidden = input_norm.shape[0]
    q_width = q_heads * head_dim
    if qkv.in_features != hidden or qkv.out_features < (q_heads + 2 * kv_heads) * head_dim:
        raise ValueError(f"qkv [{qkv.out_features}, {qkv.in_features}] does not fit hidden {hidden} and the heads.")
    if (o.out_features, o.in_features) != (hidden, q_width) or gate_up.in_features != hidden or q_heads % kv_heads:
        raise ValueError("o and gate_up must map the attention output and the hidden size.")
    for name, t, size in (("input_norm", input_norm, hidden), ("post_norm", post_norm, hidden),
                          ("qkv_bias", qkv_bias, qkv.out_features), ("o_bias", o_bias, hidden)):
        _float32_vector(name, t, size)
    struct = _LayerWeights(
        _ptr(input_norm), _ptr(post_norm), eps, scale, hidden, q_heads, kv_heads, head_dim,
        _ptr(qkv.packed), _ptr(qkv_bias), qkv.out_features, qkv.bits,
        _ptr(o.packed), _ptr(o_bias), o.bits,
        _ptr(gate_up.packed), gate_up.out_features, gate_up.bits,
    )
    tensors = (input_norm, post_norm, qkv.packed, qkv_bias, o.packed, o_bias, gate_up.packed)
    return DecodeLayerWeights(struct, tensors, hidden, qkv.out_features, q_width, gate_up.out_features, (kv_heads, head_dim))


@dataclass
class DecodeLayerStep:
    """What every layer of one decode step reads: RoPE tables, slots, the request table, scratch."""

    struct: _DecodeStep
    tensors: tuple
    rows: int
    slots: int
    widths: tuple[int, int, int]  # (qkv_out, q_width, hidden) its scratch is sized for


def decode_layer_step(
    weights: DecodeLayerWeights,
    cos: torch.Tensor,
    signed_sin: torch.Tensor,
    loc: torch.Tensor,
    slots: int,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
) -> DecodeLayerStep:
    """cos, signed_sin [B, 1, D] or [B, D] float32; loc, req_pool_indices, seq_lens [B] int64;
    req_to_token [R, C] int64; slots: the KV cache's rows."""
    rows, head_dim = loc.shape[0], weights.kv_shape[1]
    cos, signed_sin = cos.reshape(rows, head_dim).contiguous(), signed_sin.reshape(rows, head_dim).contiguous()
    for name, t, dtype, shape in (
        ("cos", cos, torch.float32, (rows, head_dim)), ("signed_sin", signed_sin, torch.float32, (rows, head_dim)),
        ("loc", loc, torch.int64, (rows,)), ("req_pool_indices", req_pool_indices, torch.int64, (rows,)),
        ("seq_lens", seq_lens, torch.int64, (rows,)), ("req_to_token", req_to_token, torch.int64, req_to_token.shape),
    ):
        if t.dtype != dtype or t.device.type != "cpu" or t.shape != shape or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous {dtype} CPU tensor {list(shape)}.")
    widths = (weights.qkv_out, weights.q_width, weights.hidden, weights.hidden)
    scratch = torch.empty((rows, sum(widths)), dtype=torch.float32)  # [B, qkv | attn | o | normed]
    parts = [p.contiguous() for p in scratch.split(widths, dim=1)]
    struct = _DecodeStep(
        rows, _ptr(cos), _ptr(signed_sin), _ptr(loc), slots, _ptr(req_to_token), req_to_token.shape[0],
        req_to_token.stride(0), _ptr(req_pool_indices), _ptr(seq_lens), *(_ptr(p) for p in parts),
        torch.get_num_threads(),
    )
    tensors = (cos, signed_sin, loc, req_to_token, req_pool_indices, seq_lens, *parts)
    return DecodeLayerStep(struct, tensors, rows, slots, widths[:3])


def decode_layer_attention_cpu(
    weights: DecodeLayerWeights,
    step: DecodeLayerStep,
    x: torch.Tensor,
    residual: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
) -> torch.Tensor:
    """x [B, H]: the embedding (pass residual=x) or the previous MLP output; residual [B, H],
    updated in place; k_buf, v_buf [S, Hk, D]. -> gate_up [B, 2 I] float32."""
    if step.widths != (weights.qkv_out, weights.q_width, weights.hidden):
        raise ValueError(f"This layer's widths differ from those the step's scratch holds ({step.widths}).")
    shape = (step.rows, weights.hidden)
    for name, t in (("x", x), ("residual", residual)):
        if t.shape != shape or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous float32 tensor {list(shape)}.")
    kv_shape = (step.slots, *weights.kv_shape)
    for name, t in (("k_buf", k_buf), ("v_buf", v_buf)):
        if t.shape != kv_shape or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous float32 tensor {list(kv_shape)}.")
    gate_up = torch.empty((step.rows, weights.gate_up_out), dtype=torch.float32)  # [B, 2 I]
    failed = _kernel()(
        ctypes.addressof(weights.struct), ctypes.addressof(step.struct), x.data_ptr(), residual.data_ptr(),
        k_buf.data_ptr(), v_buf.data_ptr(), gate_up.data_ptr(),
    )
    if failed in _ERRORS:
        raise ValueError(_ERRORS[failed] + ".")
    if failed:
        raise MemoryError("the decode layer kernel could not allocate its buffers")
    return gate_up


def decode_layer_attention_reference(
    layer: Mapping[str, Any],
    eps: float,
    q_heads: int,
    scale: float,
    x: torch.Tensor,
    residual: torch.Tensor,
    cos: torch.Tensor,
    signed_sin: torch.Tensor,
    loc: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
) -> torch.Tensor:
    """The same function from the plain-torch references. layer: input_norm, post_norm (tensors),
    qkv, o, gate_up (BlockQuantWeight), qkv_bias, o_bias (tensors or None)."""
    rows = x.shape[0]
    if residual is x:
        h = rmsnorm_reference(x, layer["input_norm"], eps)
    else:
        h = rmsnorm_reference(x, layer["input_norm"], eps, residual)
    qkv = block_quant_linear_reference(h, layer["qkv"], layer["qkv_bias"])  # [B, (Hq + 2 Hk) D]
    q = rope_store_reference(qkv, q_heads, cos, signed_sin, loc, k_buf, v_buf)  # [B, Hq, D]
    attn = decode_attention_reference(q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens, scale)
    out = block_quant_linear_reference(attn.reshape(rows, -1), layer["o"])  # [B, H]
    if layer["o_bias"] is not None:
        out = out + layer["o_bias"]
    h = rmsnorm_reference(out, layer["post_norm"], eps, residual)
    return block_quant_linear_reference(h, layer["gate_up"])
