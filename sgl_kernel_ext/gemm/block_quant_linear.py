"""Linear layers on CPU from integer codes in blocks of 32 (the C kernel in block_quant_linear.c),
for float32 weights that are exactly such blocks: what GGUF Q4_1 and Q8_0 tensors dequantise to.

`decompose_block_quant` recovers the codes, scales and offsets from the float32 weight and keeps
them only if they rebuild every element bit for bit, so the layer computes with the very weights
it was loaded with; it only reads 5-9 bits per weight instead of 32.

Opt-in (--cpu-int8-activations), the blocks are packed for block_quant_linear_q8.c instead, which
rounds the activations to 8 bits per block of 32 and multiplies in integers, as llama.cpp does:
faster, no longer exact (docs/cpu_kernels.md measures the difference).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Optional

import torch

from sgl_kernel_ext.cpu_build import I64, PTR, load_kernel

TILE_N = 16
Q8_TILE_N = 8  # the int8-activation kernel's tile of output columns
BLOCK_K = 32
# (bits, lowest code, highest code, has an offset): Q4_1's unsigned 4-bit codes with an offset
# (the block's minimum), Q8_0's symmetric 8-bit codes without one (scale = max |w| / 127).
FORMATS = ((4, 0, 15, True), (8, -127, 127, False))

_ARGTYPES = (PTR, I64, I64, PTR, ctypes.c_int, I64, PTR, PTR, ctypes.c_int)


@dataclass
class BlockQuantWeight:
    """W[n, k] = scale[n, k // 32] * code[n, k] + offset[n, k // 32], packed for the kernel."""

    packed: torch.Tensor  # [N / 16, K / 32, block bytes] uint8; int8 activations: [N / 8, K / 32, block bytes]
    bits: int
    out_features: int
    in_features: int
    int8_activations: bool = False  # packed for block_quant_linear_q8.c, which rounds x to 8 bits


# (source, C function, argument types, result type): also built with -DPORTABLE_ONLY by the tests.
_KERNEL = ("gemm/block_quant_linear.c", "block_quant_linear_f32", _ARGTYPES, ctypes.c_int)
_Q8_KERNEL = ("gemm/block_quant_linear_q8.c", "block_quant_linear_q8_f32", _ARGTYPES, ctypes.c_int)


def _kernel() -> Optional[ctypes._CFuncPtr]:
    return load_kernel(*_KERNEL)


def _q8_kernel() -> Optional[ctypes._CFuncPtr]:
    return load_kernel(*_Q8_KERNEL)


def block_quant_kernel_available(int8_activations: bool = False) -> bool:
    return (_q8_kernel() if int8_activations else _kernel()) is not None


def decompose_block_quant(weight: torch.Tensor, int8_activations: bool = False) -> Optional[BlockQuantWeight]:
    """The packed blocks of a float32 CPU weight [N, K], or None unless it is exactly made of them
    (N a multiple of 16, K of 32, float16 scales and offsets). int8_activations: packed for the
    kernel that rounds activations to 8 bits."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
        return None
    n, k = weight.shape
    if n == 0 or n % TILE_N or k % BLOCK_K:
        return None
    blocks = weight.reshape(n, k // BLOCK_K, BLOCK_K)
    for bits, low, high, has_offset in FORMATS:
        # A few rows first: most weights that are not made of these blocks fail there, cheaply.
        if _recover(blocks[:TILE_N], low, high, has_offset) is None:
            continue
        found = _recover(blocks, low, high, has_offset)
        if found is not None:
            pack = _pack_q8 if int8_activations else _pack
            return BlockQuantWeight(pack(*found, bits), bits, n, k, int8_activations)
    return None


def _recover(blocks: torch.Tensor, low: int, high: int, has_offset: bool):
    """(codes [N, B, 32] int, scales [N, B], offsets [N, B]) rebuilding `blocks` exactly, or None."""
    if has_offset:
        offsets = blocks.amin(-1)  # the code-0 element of each block is the offset itself
        estimate = (blocks.amax(-1) - offsets) / high
    else:
        offsets = torch.zeros(blocks.shape[:2])
        estimate = blocks.abs().amax(-1) / high
    if not torch.equal(offsets.half().float(), offsets):
        return None
    scales = estimate.half().float()
    # The float16 scale nearest the estimate, or its neighbours: the estimate went through one
    # rounding of the dequantised values.
    best, best_ok = None, None
    for step in (0, 1, -1):
        candidate = _float16_step(scales, step)
        codes = torch.where(candidate[..., None] > 0, (blocks - offsets[..., None]) / candidate[..., None], 0.0)
        codes = codes.round().clamp(low, high)
        ok = ((candidate[..., None] * codes + offsets[..., None]) == blocks).all(-1)  # [N, B]
        if best is None:
            best, best_ok = (codes, candidate), ok
        else:
            take = ok & ~best_ok
            best = (torch.where(take[..., None], codes, best[0]), torch.where(take, candidate, best[1]))
            best_ok = best_ok | ok
        if bool(best_ok.all()):
            return best[0].to(torch.int16), best[1], offsets
    return None


def _float16_step(values: torch.Tensor, step: int) -> torch.Tensor:
    """float32 values that are float16 numbers, moved `step` float16 ulps away from zero."""
    if step == 0:
        return values
    bits = values.half().view(torch.int16) + step
    return bits.view(torch.float16).float().where(values.abs() > 0, values)


def _pack(codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, bits: int) -> torch.Tensor:
    """The kernel's layout: per tile of 16 columns and block of 32 k, scales[16], offsets[16]
    (float32), then the codes k-major, 16 columns per k (4-bit: two k per byte, even k low)."""
    n, nblocks, _ = codes.shape
    tiles = n // TILE_N
    head = torch.stack([scales, offsets], -1)  # [N, B, 2]
    head = head.view(tiles, TILE_N, nblocks, 2).permute(0, 2, 3, 1).contiguous()  # [T, B, 2, 16]
    codes = codes.view(tiles, TILE_N, nblocks, BLOCK_K).permute(0, 2, 3, 1)  # [T, B, 32, 16]
    if bits == 4:
        codes = codes.to(torch.uint8).view(tiles, nblocks, BLOCK_K // 2, 2, TILE_N)
        body = codes[:, :, :, 0] | (codes[:, :, :, 1] << 4)  # [T, B, 16, 16]
    else:
        body = codes.to(torch.int8).view(torch.uint8)  # [T, B, 32, 16]
    head_bytes = head.view(tiles, nblocks, -1).view(torch.uint8)
    return torch.cat([head_bytes, body.reshape(tiles, nblocks, -1)], dim=-1).contiguous()


def _pack_q8(codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, bits: int) -> torch.Tensor:
    """block_quant_linear_q8.c's layout: per tile of 8 columns and block of 32 k, scales[8] and
    (4-bit) offsets[8] as float16, then the codes by group of 4 k, a column's 4 k together (4-bit:
    columns 0-3 in the low nibbles, 4-7 in the high ones)."""
    n, nblocks, _ = codes.shape
    tiles = n // Q8_TILE_N

    def per_tile(t: torch.Tensor) -> torch.Tensor:  # [N, B] -> [T, B, 8] -> bytes [T, B, 8 x size]
        return t.view(tiles, Q8_TILE_N, nblocks).transpose(1, 2).contiguous().view(torch.uint8)

    heads = [per_tile(scales.half())] + ([per_tile(offsets.half())] if bits == 4 else [])
    groups = codes.view(tiles, Q8_TILE_N, nblocks, BLOCK_K // 4, 4).permute(0, 2, 3, 1, 4)  # [T, B, 8 groups, 8 cols, 4]
    if bits == 4:
        nibbles = groups.to(torch.uint8)
        body = nibbles[:, :, :, :4] | (nibbles[:, :, :, 4:] << 4)  # [T, B, 8, 4, 4]
    else:
        body = groups.to(torch.int8).view(torch.uint8)  # [T, B, 8, 8, 4]
    return torch.cat([*heads, body.reshape(tiles, nblocks, -1)], dim=-1).contiguous()


def _dequantize_q8_layout(weight: BlockQuantWeight) -> torch.Tensor:
    tiles, nblocks, _ = weight.packed.shape
    groups = BLOCK_K // 4

    def head(part: int) -> torch.Tensor:  # -> [T, B, 8] float32
        raw = weight.packed[:, :, 2 * Q8_TILE_N * part : 2 * Q8_TILE_N * (part + 1)]
        return raw.contiguous().view(torch.float16).float()

    scales = head(0)
    body = weight.packed[:, :, 2 * Q8_TILE_N * (2 if weight.bits == 4 else 1) :]
    if weight.bits == 4:
        nibbles = body.reshape(tiles, nblocks, groups, 4, 4)
        codes = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=3).float()  # [T, B, 8 groups, 8 cols, 4]
        offsets = head(1)
    else:
        codes = body.contiguous().view(torch.int8).reshape(tiles, nblocks, groups, Q8_TILE_N, 4).float()
        offsets = torch.zeros_like(scales)
    codes = codes.permute(0, 1, 3, 2, 4).reshape(tiles, nblocks, Q8_TILE_N, BLOCK_K)  # [T, B, 8, 32]
    w = scales[..., None] * codes + offsets[..., None]  # [T, B, 8, 32]
    return w.permute(0, 2, 1, 3).reshape(weight.out_features, weight.in_features)


def dequantize_block_quant(weight: BlockQuantWeight) -> torch.Tensor:
    """The float32 weight [N, K] the blocks stand for."""
    if weight.int8_activations:
        return _dequantize_q8_layout(weight)
    tiles, nblocks, _ = weight.packed.shape
    head = weight.packed[:, :, : 2 * TILE_N * 4].contiguous().view(torch.float32).view(tiles, nblocks, 2, TILE_N)
    body = weight.packed[:, :, 2 * TILE_N * 4 :]
    if weight.bits == 4:
        pairs = body.view(tiles, nblocks, BLOCK_K // 2, 1, TILE_N)
        codes = torch.cat([pairs & 0x0F, pairs >> 4], dim=3).view(tiles, nblocks, BLOCK_K, TILE_N).float()
    else:
        codes = body.view(torch.int8).view(tiles, nblocks, BLOCK_K, TILE_N).float()
    w = head[:, :, 0, None, :] * codes + head[:, :, 1, None, :]  # [T, B, 32, 16]
    return w.permute(0, 3, 1, 2).reshape(weight.out_features, weight.in_features)


def block_quant_linear(x: torch.Tensor, weight: BlockQuantWeight, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [M, K] float32 CPU -> x @ W^T + bias, [M, N] float32."""
    kernel = _q8_kernel() if weight.int8_activations else _kernel()
    if kernel is None:
        raise RuntimeError("The block-quantised linear kernel is not available (see the warning on its build).")
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2 or x.shape[1] != weight.in_features:
        raise ValueError(f"x must be float32 [M, {weight.in_features}] on the CPU, got {x.dtype} {tuple(x.shape)}.")
    if bias is not None and (bias.dtype != torch.float32 or bias.shape != (weight.out_features,)):
        raise ValueError(f"bias must be float32 [{weight.out_features}].")
    x = x.contiguous()
    out = torch.empty((x.shape[0], weight.out_features), dtype=torch.float32)  # [M, N]
    bias_ptr = None if bias is None else bias.contiguous().data_ptr()
    failed = kernel(
        x.data_ptr(), x.shape[0], weight.in_features, weight.packed.data_ptr(), weight.bits, weight.out_features,
        bias_ptr, out.data_ptr(), torch.get_num_threads(),
    )
    if failed:
        raise MemoryError("block_quant_linear could not allocate its buffers")
    return out


def block_quant_linear_reference(
    x: torch.Tensor, weight: BlockQuantWeight, bias: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """The same function in plain torch: dequantise, then one matmul; with int8 activations, of x
    rounded as the kernel rounds it, in float64 (the kernel's integer sums are exact)."""
    if not weight.int8_activations:
        return torch.nn.functional.linear(x, dequantize_block_quant(weight), bias)
    out = torch.nn.functional.linear(quantize_activations_reference(x), dequantize_block_quant(weight).double())
    return (out if bias is None else out + bias.double()).float()


def quantize_activations_reference(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] float32 rounded to 8 bits per block of 32 as block_quant_linear_q8.c rounds it:
    dx = max|x| / 127 (NaN where the block is not finite), q = round(x / dx) to even, clamped to
    [-127, 127] -> dx * q, float64 [M, K]."""
    blocks = x.reshape(x.shape[0], -1, BLOCK_K)  # [M, K / 32, 32]
    dx = blocks.abs().amax(-1, keepdim=True) / 127.0  # float32, as the kernel divides
    dx = torch.where(blocks.isfinite().all(-1, keepdim=True), dx, float("nan"))  # NaN / inf reach the outputs
    q = torch.where(dx > 0, blocks / dx, torch.zeros_like(blocks)).round().clamp(-127, 127)
    return (dx.double() * q.double()).reshape(x.shape)
