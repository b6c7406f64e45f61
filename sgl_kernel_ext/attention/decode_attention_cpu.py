"""Decode attention on the CPU with the C kernel in decode_attention_cpu.c: each request's K/V rows
are read where they sit in the paged cache, so no per-layer gather into a padded batch, and each
row's result is independent of its batch-mates. Same function as reference.decode_attention_reference."""

from __future__ import annotations

import ctypes
from typing import Optional

import torch

from sgl_kernel_ext.cpu_build import I64, PTR, load_kernel

_ARGTYPES = (
    PTR, I64,  # q, its row stride
    PTR, PTR, I64,  # k_buf, v_buf, their rows (the cache's slots)
    PTR, I64, I64,  # req_to_token, its rows, its row stride
    PTR, PTR,  # req_pool_indices, seq_lens
    I64, I64, I64, I64,  # batch, KV heads, query heads per KV head, head_dim
    ctypes.c_float,  # scale
    I64, ctypes.c_float,  # sliding window (0: none), logit cap (0: none)
    PTR,  # out
    ctypes.c_int,  # OpenMP threads
)


# (source, C function, argument types, result type): also built with -DPORTABLE_ONLY by the tests.
_KERNEL = ("attention/decode_attention_cpu.c", "decode_attention_f32", _ARGTYPES, ctypes.c_int)
# The kernel's codes for a row whose length or table row lies outside req_to_token, and for a
# table entry naming a slot outside the KV cache.
_BAD_SEQ_LEN, _BAD_REQ_INDEX, _BAD_KV_SLOT = -1, -2, -3


def _kernel() -> Optional[ctypes._CFuncPtr]:
    return load_kernel(*_KERNEL)


def cpu_decode_attention_available() -> bool:
    """Whether the kernel could be built here (builds it on the first call)."""
    return _kernel() is not None


def decode_attention_cpu(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    sliding_window: Optional[int] = None,
    logit_cap: Optional[float] = None,
) -> torch.Tensor:
    """q [B, Hq, D] float32 (rows may be strided); k_buf, v_buf [S, Hk, D] float32; req_to_token
    [R, C], req_pool_indices [B], seq_lens [B] int64, all on the CPU -> [B, Hq, D] float32.
    sliding_window and logit_cap as in reference.decode_attention_reference."""
    kernel = _kernel()
    if kernel is None:
        raise RuntimeError("The CPU decode-attention kernel is not available (see the warning on its build).")
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_buf.shape[1]
    _check(q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens)
    out = torch.empty((batch, num_heads, head_dim), dtype=torch.float32)  # [B, Hq, D]
    failed = kernel(
        q.data_ptr(), q.stride(0), k_buf.data_ptr(), v_buf.data_ptr(), k_buf.shape[0],
        req_to_token.data_ptr(), req_to_token.shape[0], req_to_token.stride(0), req_pool_indices.data_ptr(),
        seq_lens.data_ptr(),
        batch, num_kv_heads, num_heads // num_kv_heads, head_dim, scale, sliding_window or 0, logit_cap or 0.0,
        out.data_ptr(), torch.get_num_threads(),
    )
    if failed == _BAD_SEQ_LEN:
        raise ValueError(f"seq_lens must lie in [1, {req_to_token.shape[1]}].")
    if failed == _BAD_REQ_INDEX:
        raise ValueError(f"req_pool_indices must lie in [0, {req_to_token.shape[0]}).")
    if failed == _BAD_KV_SLOT:
        raise kv_slot_error(req_to_token, req_pool_indices, seq_lens, k_buf.shape[0])
    if failed:
        raise MemoryError("decode attention could not allocate its score buffers")
    return out


def kv_slot_error(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, cache_rows: int
) -> ValueError:
    """The error naming the first table entry a request reads that lies outside a KV cache of
    cache_rows slots. Built only once the kernel has refused the batch, so the search costs nothing
    on the normal path."""
    for pool_index, seq_len in zip(req_pool_indices.tolist(), seq_lens.tolist()):
        row = req_to_token[pool_index, :seq_len]  # [seq_len]
        outside = ((row < 0) | (row >= cache_rows)).nonzero()
        if outside.numel():
            position = int(outside[0, 0])
            return ValueError(
                f"req_to_token[{pool_index}, {position}] holds KV slot {int(row[position])}, outside the KV cache "
                f"of {cache_rows} slots."
            )
    return ValueError(f"req_to_token holds a KV slot outside the KV cache of {cache_rows} slots.")


def _check(q, k_buf, v_buf, req_to_token, req_pool_indices, seq_lens) -> None:
    """The kernel walks raw pointers, so layouts and bounds are checked here."""
    for name, t, dtype in (
        ("q", q, torch.float32), ("k_buf", k_buf, torch.float32), ("v_buf", v_buf, torch.float32),
        ("req_to_token", req_to_token, torch.int64), ("req_pool_indices", req_pool_indices, torch.int64),
        ("seq_lens", seq_lens, torch.int64),
    ):
        if t.device.type != "cpu" or t.dtype != dtype:
            raise ValueError(f"{name} must be a {dtype} CPU tensor, got {t.dtype} on {t.device}.")
    if q.stride(2) != 1 or q.stride(1) != q.shape[2]:
        raise ValueError("q's heads and head_dim must be packed (only its rows may be strided).")
    if not (k_buf.is_contiguous() and v_buf.is_contiguous() and req_to_token.is_contiguous()):
        raise ValueError("k_buf, v_buf and req_to_token must be contiguous.")
    if not (req_pool_indices.is_contiguous() and seq_lens.is_contiguous()):
        raise ValueError("req_pool_indices and seq_lens must be contiguous.")
    if q.shape[1] % k_buf.shape[1] or k_buf.shape != v_buf.shape or k_buf.shape[2] != q.shape[2]:
        raise ValueError(f"Shapes do not fit: q {tuple(q.shape)}, k_buf {tuple(k_buf.shape)}, v_buf {tuple(v_buf.shape)}.")
    if seq_lens.shape != req_pool_indices.shape or seq_lens.shape[0] != q.shape[0]:
        raise ValueError("q, req_pool_indices and seq_lens must have one row per request.")
    # The kernel checks seq_lens and req_pool_indices against the table itself (_BAD_*).
