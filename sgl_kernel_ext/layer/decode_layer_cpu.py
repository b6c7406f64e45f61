"""A Llama decoder layer at decode in one C call on CPU (decode_layer_cpu.c), all but its SiLU:
the previous layer's down projection, RMSNorm (+ residual), qkv, RoPE + KV store, attention,
o + residual, RMSNorm, gate_up. It runs the separate kernels' C functions in their order, so its
results are those of the op-by-op path bit for bit; `decode_layer_reference` is the same function
from the plain-torch references."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from sgl_kernel_ext.attention.decode_attention_cpu import kv_slot_error
from sgl_kernel_ext.attention.reference import decode_attention_reference
from sgl_kernel_ext.cpu_build import I64, PTR, load_kernel
from sgl_kernel_ext.gemm.block_quant_linear import BlockQuantWeight, block_quant_linear_reference
from sgl_kernel_ext.norm.rmsnorm_cpu import rmsnorm_reference
from sgl_kernel_ext.rotary.rope_store_cpu import rope_store_reference

class _LayerWeights(ctypes.Structure):
    """layer_weights in decode_layer_cpu.c."""

    _fields_ = [
        ("input_norm", PTR), ("post_norm", PTR), ("input_eps", ctypes.c_float), ("post_eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("hidden", I64), ("q_heads", I64), ("kv_heads", I64), ("head_dim", I64),
        ("qkv", PTR), ("qkv_bias", PTR), ("qkv_out", I64), ("qkv_bits", I64),
        ("o", PTR), ("o_bias", PTR), ("o_bits", I64),
        ("gate_up", PTR), ("gate_up_out", I64), ("gate_up_bits", I64),
        ("down", PTR), ("down_bias", PTR), ("down_in", I64), ("down_bits", I64),
        ("int8_activations", I64),
    ]


class _DecodeStep(ctypes.Structure):
    """decode_step in decode_layer_cpu.c."""

    _fields_ = [
        ("rows", I64), ("cos", PTR), ("signed_sin", PTR), ("loc", PTR), ("slots", I64),
        ("req_to_token", PTR), ("table_rows", I64), ("table_stride", I64),
        ("req_pool_indices", PTR), ("seq_lens", PTR),
        ("qkv", PTR), ("attn", PTR), ("o", PTR), ("normed", PTR), ("gate_up", PTR), ("num_threads", I64),
    ]


_ARGTYPES = (PTR, PTR, PTR, PTR, PTR, PTR, PTR)
# (source, C function, argument types, result type): also built with -DPORTABLE_ONLY by the tests.
_KERNEL = ("layer/decode_layer_cpu.c", "decode_layer_f32", _ARGTYPES, ctypes.c_int)
_LAYERS_KERNEL = ("layer/decode_layer_cpu.c", "decode_layers_f32", (PTR, I64, PTR, PTR, PTR, PTR, PTR), ctypes.c_int)
_ERRORS = {
    1: "head_dim must be even and at most 1024",
    2: "out_cache_loc must lie inside the KV cache",
    3: "seq_lens must lie in [1, req_to_token's row length]",
    4: "req_pool_indices must lie inside req_to_token",
}
_BAD_TABLE_SLOT = 6  # a req_to_token entry a request reads lies outside the KV cache


def _kernel() -> Optional[ctypes._CFuncPtr]:
    return load_kernel(*_KERNEL)


def _layers_kernel() -> Optional[ctypes._CFuncPtr]:
    return load_kernel(*_LAYERS_KERNEL)


def decode_layer_kernel_available() -> bool:
    return _kernel() is not None


def _ptr(t: Optional[torch.Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def _check(name: str, t: Optional[torch.Tensor], dtype: torch.dtype, shape: tuple) -> None:
    if t is not None and (t.dtype != dtype or t.device.type != "cpu" or tuple(t.shape) != shape or not t.is_contiguous()):
        raise ValueError(f"{name} must be a contiguous {dtype} CPU tensor {list(shape)}.")


@dataclass
class DecodeLayerWeights:
    """One layer's weights as the kernel reads them; holds the tensors the pointers point into."""

    struct: _LayerWeights
    tensors: tuple
    widths: tuple[int, int, int, int]  # (hidden, qkv_out, q_width, gate_up_out): what a step's scratch must hold
    kv_shape: tuple[int, int]  # (kv_heads, head_dim) of the cache rows
    down_in: int


def decode_layer_weights(
    norms: tuple[torch.Tensor, torch.Tensor],
    eps: tuple[float, float],
    projections: Mapping[str, BlockQuantWeight],
    biases: Mapping[str, Optional[torch.Tensor]],
    heads: tuple[int, int, int],
    scale: float,
) -> DecodeLayerWeights:
    """norms, eps: the (input, post-attention) RMSNorms' weights [H] and epsilons; projections: qkv, o, gate_up, down;
    biases: qkv, o, down (tensors or None); heads: (q heads, KV heads, head_dim)."""
    (input_norm, post_norm), (q_heads, kv_heads, head_dim) = norms, heads
    qkv, o, gate_up, down = (projections[name] for name in ("qkv", "o", "gate_up", "down"))
    hidden, q_width = input_norm.shape[0], q_heads * head_dim
    if qkv.in_features != hidden or qkv.out_features < (q_heads + 2 * kv_heads) * head_dim or q_heads % kv_heads:
        raise ValueError(f"qkv [{qkv.out_features}, {qkv.in_features}] does not fit hidden {hidden} and the heads.")
    if (o.out_features, o.in_features) != (hidden, q_width) or gate_up.in_features != hidden or down.out_features != hidden:
        raise ValueError("o, gate_up and down must map the attention output and the hidden size.")
    int8_activations = {p.int8_activations for p in (qkv, o, gate_up, down)}
    if len(int8_activations) != 1:
        raise ValueError("qkv, o, gate_up and down must all be packed for int8 activations, or none.")
    if gate_up.out_features != 2 * down.in_features:
        raise ValueError(f"gate_up's {gate_up.out_features} outputs must be gate and up for down's {down.in_features} inputs.")
    for name, t, size in (("input_norm", input_norm, hidden), ("post_norm", post_norm, hidden),
                          ("qkv_bias", biases["qkv"], qkv.out_features), ("o_bias", biases["o"], hidden),
                          ("down_bias", biases["down"], hidden)):
        _check(name, t, torch.float32, (size,))
    struct = _LayerWeights(
        _ptr(input_norm), _ptr(post_norm), *eps, scale, hidden, q_heads, kv_heads, head_dim,
        _ptr(qkv.packed), _ptr(biases["qkv"]), qkv.out_features, qkv.bits,
        _ptr(o.packed), _ptr(biases["o"]), o.bits,
        _ptr(gate_up.packed), gate_up.out_features, gate_up.bits,
        _ptr(down.packed), _ptr(biases["down"]), down.in_features, down.bits, int(down.int8_activations),
    )
    tensors = (input_norm, post_norm, qkv.packed, o.packed, gate_up.packed, down.packed, *biases.values())
    widths = (hidden, qkv.out_features, q_width, gate_up.out_features)
    return DecodeLayerWeights(struct, tensors, widths, (kv_heads, head_dim), down.in_features)


@dataclass
class DecodeLayerStep:
    """What every layer of one decode step reads: RoPE tables, slots, the request table, scratch."""

    struct: _DecodeStep
    tensors: tuple  # (cos, signed_sin, loc, req_to_token, req_pool_indices, seq_lens, scratch)
    rows: int
    slots: int
    widths: tuple[int, int, int, int]  # as DecodeLayerWeights.widths
    head_dim: int  # of its RoPE rows
    gate_up: torch.Tensor  # [B, 2 I]: each call's output


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
    req_to_token [R, C] int64; slots: the KV cache's rows. Scratch sized for `weights`' widths."""
    rows, head_dim = loc.shape[0], weights.kv_shape[1]
    cos, signed_sin = cos.reshape(rows, head_dim).contiguous(), signed_sin.reshape(rows, head_dim).contiguous()
    for name, t, dtype, shape in (
        ("cos", cos, torch.float32, (rows, head_dim)), ("signed_sin", signed_sin, torch.float32, (rows, head_dim)),
        ("loc", loc, torch.int64, (rows,)), ("req_pool_indices", req_pool_indices, torch.int64, (rows,)),
        ("seq_lens", seq_lens, torch.int64, (rows,)), ("req_to_token", req_to_token, torch.int64, tuple(req_to_token.shape)),
    ):
        _check(name, t, dtype, shape)
    hidden, qkv_out, q_width, gate_up_out = weights.widths
    sizes = (qkv_out, q_width, hidden, hidden, gate_up_out)
    scratch = torch.empty((sum(sizes) * rows,), dtype=torch.float32)
    qkv, attn, o, normed, gate_up = (part.view(rows, -1) for part in scratch.split([n * rows for n in sizes]))
    struct = _DecodeStep(
        rows, _ptr(cos), _ptr(signed_sin), _ptr(loc), slots, _ptr(req_to_token), req_to_token.shape[0],
        req_to_token.stride(0), _ptr(req_pool_indices), _ptr(seq_lens),
        _ptr(qkv), _ptr(attn), _ptr(o), _ptr(normed), _ptr(gate_up), torch.get_num_threads(),
    )
    tensors = (cos, signed_sin, loc, req_to_token, req_pool_indices, seq_lens, scratch)
    return DecodeLayerStep(struct, tensors, rows, slots, weights.widths, head_dim, gate_up)


def decode_layer_cpu(
    weights: DecodeLayerWeights,
    step: DecodeLayerStep,
    residual: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    prev: Optional[DecodeLayerWeights] = None,
    act: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One layer. residual [B, H]: the embedding for the first layer (prev None), else the residual
    stream, to which prev's down projection of act [B, I] is added first; updated in place.
    k_buf, v_buf [S, Hk, D]: this layer's cache. -> gate_up [B, 2 I] (step.gate_up, overwritten by
    the next call)."""
    _check_call(weights, step, residual, k_buf, v_buf, prev, act)
    return _run(weights, step, residual, k_buf, v_buf, prev, act)


class DecodeLayers:
    """A model's layers for the one-call decode, checked against each other once. The KV buffers
    a step passes are checked when they are not the tensors (and storage) of the last step (the
    cache's own buffers, the same at every step), so a step costs no per-layer Python checks."""

    def __init__(self, weights: Sequence[DecodeLayerWeights]) -> None:
        self.weights = list(weights)
        if not self.weights:
            raise ValueError("DecodeLayers takes at least one layer.")
        first = self.weights[0]
        for w in self.weights[1:]:
            if (w.widths, w.kv_shape, w.down_in) != (first.widths, first.kv_shape, first.down_in):
                raise ValueError(f"Every layer must have the first one's widths {first.widths}, KV rows {first.kv_shape} "
                                 f"and MLP width {first.down_in}; one has {w.widths}, {w.kv_shape}, {w.down_in}.")
        # Packing is per model: int8-activation layers run with the C SiLU, all in one call.
        self.int8_activations = bool(first.struct.int8_activations)
        if any(bool(w.struct.int8_activations) != self.int8_activations for w in self.weights):
            raise ValueError("Every layer must be packed for int8 activations, or none.")
        self._structs = (PTR * len(self.weights))(*(ctypes.addressof(w.struct) for w in self.weights))
        self._kv: Optional[tuple[list, ctypes.Array, ctypes.Array]] = None  # (buffers, k pointers, v pointers)

    def run(
        self, step: DecodeLayerStep, embedding: torch.Tensor, kv_buffers: Sequence[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As decode_layers_cpu."""
        first = self.weights[0]
        _check_call(first, step, embedding, *kv_buffers[0], None, None)
        k_ptrs, v_ptrs = self._kv_pointers(step, kv_buffers)
        if self.int8_activations:
            act = torch.empty(step.rows, first.down_in, dtype=torch.float32)  # [B, I]
            failed = _layers_kernel()(
                self._structs, len(self.weights), ctypes.addressof(step.struct), embedding.data_ptr(), k_ptrs, v_ptrs,
                act.data_ptr(),
            )
            _raise_on(failed, step)
            return act, embedding
        act, prev = None, None
        gate, up = step.gate_up.chunk(2, dim=-1)  # [B, I] each: views of the buffer every call writes
        for w, (k_buf, v_buf) in zip(self.weights, kv_buffers):
            _run(w, step, embedding, k_buf, v_buf, prev, act)
            act, prev = F.silu(gate).mul_(up), w
        return act, embedding

    def _kv_pointers(self, step: DecodeLayerStep, kv_buffers) -> tuple[ctypes.Array, ctypes.Array]:
        cached = self._kv
        if cached is not None and len(cached[0]) == len(kv_buffers) and all(
            k is ck and v is cv and k.data_ptr() == kp and v.data_ptr() == vp
            for (k, v), (ck, cv), kp, vp in zip(kv_buffers, cached[0], cached[1], cached[2])
        ):
            return cached[1], cached[2]
        if len(kv_buffers) != len(self.weights):
            raise ValueError(f"{len(kv_buffers)} KV buffer pairs for {len(self.weights)} layers.")
        kv_shape = (step.slots, *self.weights[0].kv_shape)
        for k_buf, v_buf in kv_buffers:
            _check("k_buf", k_buf, torch.float32, kv_shape)
            _check("v_buf", v_buf, torch.float32, kv_shape)
        buffers = [tuple(pair) for pair in kv_buffers]
        k_ptrs = (PTR * len(buffers))(*(k.data_ptr() for k, _ in buffers))
        v_ptrs = (PTR * len(buffers))(*(v.data_ptr() for _, v in buffers))
        self._kv = (buffers, k_ptrs, v_ptrs)
        return k_ptrs, v_ptrs


def decode_layers_cpu(
    layers: Union[DecodeLayers, Sequence[DecodeLayerWeights]],
    step: DecodeLayerStep,
    embedding: torch.Tensor,
    kv_buffers: Sequence[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer in turn, SiLU(gate) * up between them: torch's SiLU, as the op-by-op path, for
    exact packing; all layers in one C call with the C SiLU (silu_mul_cpu.c) for int8 activations.
    embedding [B, H] becomes the residual stream (in place). -> (the last layer's MLP activation
    [B, I], for its down projection; the residual stream before that projection is added)."""
    layers = layers if isinstance(layers, DecodeLayers) else DecodeLayers(layers)
    return layers.run(step, embedding, kv_buffers)


def _check_call(weights, step, residual, k_buf, v_buf, prev, act) -> None:
    """The kernel walks raw pointers: every buffer it reads or writes must have the shape it assumes."""
    if step.widths != weights.widths or step.head_dim != weights.kv_shape[1]:
        raise ValueError(f"This layer's widths {weights.widths} and head_dim {weights.kv_shape[1]} differ from those "
                         f"the step holds ({step.widths}, {step.head_dim}).")
    _check("residual", residual, torch.float32, (step.rows, weights.widths[0]))
    kv_shape = (step.slots, *weights.kv_shape)
    _check("k_buf", k_buf, torch.float32, kv_shape)
    _check("v_buf", v_buf, torch.float32, kv_shape)
    if (prev is None) != (act is None):
        raise ValueError("prev and act go together: the previous layer's down projection of act.")
    if prev is not None:
        if prev.widths[0] != weights.widths[0]:
            raise ValueError(f"prev's down projection gives {prev.widths[0]} values, this layer takes {weights.widths[0]}.")
        _check("act", act, torch.float32, (step.rows, prev.down_in))


def _run(weights, step, residual, k_buf, v_buf, prev, act) -> torch.Tensor:
    failed = _kernel()(
        ctypes.addressof(weights.struct), ctypes.addressof(step.struct), None if prev is None else ctypes.addressof(prev.struct),
        _ptr(act), residual.data_ptr(), k_buf.data_ptr(), v_buf.data_ptr(),
    )
    _raise_on(failed, step)
    return step.gate_up


def _raise_on(failed: int, step: DecodeLayerStep) -> None:
    if failed == _BAD_TABLE_SLOT:
        req_to_token, req_pool_indices, seq_lens = step.tensors[3:6]
        raise kv_slot_error(req_to_token, req_pool_indices, seq_lens, step.slots)
    if failed in _ERRORS:
        raise ValueError(_ERRORS[failed] + ".")
    if failed:
        raise MemoryError("the decode layer kernel could not allocate its buffers")


def decode_layer_reference(
    layer: Mapping[str, Any],
    eps: tuple[float, float],
    q_heads: int,
    scale: float,
    residual: torch.Tensor,
    step: Mapping[str, torch.Tensor],
    prev: Optional[Mapping[str, Any]] = None,
    act: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The same function from the plain-torch references. eps: (input, post-attention) RMSNorms';
    layer, prev: input_norm, post_norm
    (tensors), qkv, o, gate_up, down (BlockQuantWeight), qkv_bias, o_bias, down_bias (tensors or
    None); step: cos, signed_sin, loc, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens."""
    rows = residual.shape[0]
    if prev is None:
        h = rmsnorm_reference(residual, layer["input_norm"], eps[0])
    else:
        h = rmsnorm_reference(_project(act, prev["down"], prev["down_bias"]), layer["input_norm"], eps[0], residual)
    qkv = block_quant_linear_reference(h, layer["qkv"], layer["qkv_bias"])  # [B, (Hq + 2 Hk) D]
    q = rope_store_reference(qkv, q_heads, step["cos"], step["signed_sin"], step["loc"], step["k_buf"], step["v_buf"])
    attn = decode_attention_reference(
        q, step["k_buf"], step["v_buf"], step["req_to_token"], step["req_pool_indices"], step["seq_lens"], scale
    )  # [B, Hq, D]
    h = rmsnorm_reference(_project(attn.reshape(rows, -1), layer["o"], layer["o_bias"]), layer["post_norm"], eps[1], residual)
    return block_quant_linear_reference(h, layer["gate_up"])


def _project(x: torch.Tensor, weight: BlockQuantWeight, bias: Optional[torch.Tensor]) -> torch.Tensor:
    out = block_quant_linear_reference(x, weight)
    return out if bias is None else out + bias
