"""Rotary embedding of q/k plus the KV-cache write in one C call on CPU (rope_store_cpu.c), and
its plain-torch reference."""

from __future__ import annotations

import ctypes
from typing import Optional

import torch

from sgl_kernel_ext.cpu_build import I64, PTR, load_kernel

_ARGTYPES = (PTR, I64, I64, I64, I64, I64, PTR, PTR, PTR, I64, PTR, PTR, ctypes.c_int)


# (source, C function, argument types, result type): also built with -DPORTABLE_ONLY by the tests.
_KERNEL = ("rotary/rope_store_cpu.c", "rope_store_f32", _ARGTYPES, ctypes.c_int)


def _kernel() -> Optional[ctypes._CFuncPtr]:
    return load_kernel(*_KERNEL)


def rope_store_cpu_applies(qkv: torch.Tensor, k_buf: torch.Tensor) -> bool:
    """Whether the kernel takes these (float32 CPU, packed rows, contiguous cache) and could be built."""
    return (
        qkv.device.type == "cpu"
        and qkv.dtype == torch.float32
        and k_buf.dtype == torch.float32
        and qkv.dim() == 2
        and qkv.stride(1) == 1
        and k_buf.is_contiguous()
        and _kernel() is not None
    )


def rope_store_cpu(
    qkv: torch.Tensor,
    num_heads: int,
    cos: torch.Tensor,
    signed_sin: torch.Tensor,
    loc: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
) -> torch.Tensor:
    """qkv [N, (Hq + 2 Hk) * D] float32 (q, k, v heads packed); cos, signed_sin [N, 1, D] or
    [N, D]; loc [N] int64 slots; k_buf, v_buf [S, Hk, D]. Rotates q in place, stores rotated k and
    v at loc. -> the rotated q as a view [N, Hq, D] of qkv."""
    tokens = qkv.shape[0]
    num_kv_heads, head_dim = k_buf.shape[1], k_buf.shape[2]
    if not rope_store_cpu_applies(qkv, k_buf) or not v_buf.is_contiguous() or v_buf.shape != k_buf.shape:
        raise ValueError("rope_store_cpu takes float32 CPU tensors: qkv with packed rows, contiguous k_buf/v_buf.")
    if qkv.shape[1] < (num_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(f"qkv rows hold {qkv.shape[1]} values, fewer than the q, k and v heads.")
    cos, signed_sin = cos.reshape(tokens, head_dim).contiguous(), signed_sin.reshape(tokens, head_dim).contiguous()
    if loc.dtype != torch.int64 or loc.shape != (tokens,):
        raise ValueError(f"loc must be int64 [{tokens}].")
    loc = loc.contiguous()
    failed = _kernel()(
        qkv.data_ptr(), tokens, qkv.stride(0), num_heads, num_kv_heads, head_dim, cos.data_ptr(),
        signed_sin.data_ptr(), loc.data_ptr(), k_buf.shape[0], k_buf.data_ptr(), v_buf.data_ptr(), torch.get_num_threads(),
    )
    if failed == 2:  # checked by the kernel: a torch reduction per layer cost more than the rotation
        raise ValueError(f"loc must lie in [0, {k_buf.shape[0]}).")
    if failed:
        raise ValueError(f"head_dim must be even and at most 1024, got {head_dim}.")
    return qkv[:, : num_heads * head_dim].view(tokens, num_heads, head_dim)


def rope_store_reference(
    qkv: torch.Tensor,
    num_heads: int,
    cos: torch.Tensor,
    signed_sin: torch.Tensor,
    loc: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
) -> torch.Tensor:
    """The same function in plain torch."""
    tokens = qkv.shape[0]
    num_kv_heads, head_dim = k_buf.shape[1], k_buf.shape[2]
    q, k, v = qkv[:, : (num_heads + 2 * num_kv_heads) * head_dim].split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1
    )
    cos, signed_sin = cos.reshape(tokens, 1, head_dim), signed_sin.reshape(tokens, 1, head_dim)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([x2, x1], dim=-1) * signed_sin

    k_buf[loc] = rotate(k.reshape(tokens, num_kv_heads, head_dim))
    v_buf[loc] = v.reshape(tokens, num_kv_heads, head_dim)
    q = q.view(tokens, num_heads, head_dim)
    q.copy_(rotate(q))
    return q
