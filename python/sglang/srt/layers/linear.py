"""Linear layers whose weights can be split over tensor-parallel ranks.

Each parameter carries a `weight_loader(param, full_checkpoint_tensor[, shard_id])` that copies
this rank's slice, so loaders always hand over the unsharded checkpoint tensor.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from types import ModuleType
from typing import Callable, Iterator, Optional, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from sgl_kernel_ext.gemm.block_quant_linear import (
    BlockQuantWeight,
    block_quant_kernel_available,
    block_quant_linear,
    decompose_block_quant,
)
from sglang.srt.distributed.custom_all_reduce import custom_all_reduce
from sglang.srt.layers.batch_invariant import is_batch_invariant, row_blocked
from sglang.srt.layers.triton_kernels import triton_kernels

logger = logging.getLogger(__name__)


def make_param(shape: tuple[int, ...], dtype: torch.dtype, loader: Callable) -> nn.Parameter:
    param = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
    param.weight_loader = loader
    return param


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Replicated parameter: the checkpoint tensor must match exactly."""
    if param.shape != loaded.shape:
        raise ValueError(f"Shape mismatch: parameter {tuple(param.shape)}, checkpoint {tuple(loaded.shape)}.")
    param.data.copy_(loaded)


# oneDNN's blocked-weight matmul runs decode-sized batches about twice as fast as the default
# sgemm on CPU. The hint picks the blocking; every batch size stays correct.
CPU_PACK_BATCH_HINT = 16


# Up to this many rows a matmul reads the weight's integer blocks where it has them (GGUF Q4_1 /
# Q8_0 checkpoints): decode batches, bound by streaming the weights, gain ~1.3x at 16 rows;
# oneDNN's float32 kernel wins on prefill-sized inputs.
BLOCK_QUANT_MAX_ROWS = 32


def block_kernel_serves(rows: int) -> bool:
    """Whether a matmul of `rows` rows goes to the block kernel where the weight has blocks."""
    return rows <= BLOCK_QUANT_MAX_ROWS or is_batch_invariant()


# --cpu-int8-activations, while a model's weights are processed after loading: how many weights
# were packed for the int8 kernel so far (None outside such a load).
_int8_packed: Optional[list[int]] = None


@contextmanager
def block_quant_int8_activations(enabled: bool) -> Iterator[None]:
    """Inside the block, find_block_quant packs blocks for the kernel that rounds activations to
    8 bits; at its end, the log says how many linears that is (a warning when none)."""
    global _int8_packed
    previous, _int8_packed = _int8_packed, [0] if enabled else None
    try:
        yield
        if enabled:
            _report_int8_packing(_int8_packed[0])
    finally:
        _int8_packed = previous


def _report_int8_packing(count: int) -> None:
    if not block_quant_kernel_available(int8_activations=True):
        logger.warning("--cpu-int8-activations: its kernel did not build (see the warning above); the linears keep "
                       "the exact block kernel.")
    elif count == 0:
        logger.warning("--cpu-int8-activations has no effect on this model: none of its weights is made of GGUF "
                       "Q4_1 / Q8_0 blocks, so every matmul stays float32.")
    else:
        logger.info("--cpu-int8-activations: %d weights round their inputs to 8 bits.", count)


def find_block_quant(weight: torch.Tensor) -> Optional[BlockQuantWeight]:
    """The integer blocks a float32 CPU weight is exactly made of, if any and if the kernel builds;
    packed for int8 activations inside block_quant_int8_activations(True) when that kernel builds."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return None
    int8 = _int8_packed is not None and block_quant_kernel_available(int8_activations=True)
    if not block_quant_kernel_available(int8):
        return None
    blocks = decompose_block_quant(weight.detach(), int8)
    if blocks is not None and int8:
        _int8_packed[0] += 1
    return blocks


def cpu_pack_supported(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class LinearMethod(Protocol):
    """How a quantised linear holds and multiplies its weight (layers/quantization): it replaces
    the layer's parameters before loading and runs its matmul."""

    def process_weights_after_loading(self, layer: "LinearBase") -> None: ...

    def apply(self, layer: "LinearBase", x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor: ...


class LinearBase(nn.Module):
    """Holds `weight` [out, in]; after loading, a CPU weight is re-laid out for oneDNN, and also
    kept as integer blocks when it is exactly made of them. A quantised layer's `quant_method`
    holds its weight instead.

    `shard_dim` is the weight dim split over TP ranks and `shard_span(shard_id)` where a
    checkpoint tensor's slice lands in it: (offset in the parameter, size, start in the
    checkpoint tensor), so that quantisation scales shard with their weights."""

    weight: nn.Parameter
    block_weight: Optional[BlockQuantWeight] = None
    quant_method: Optional[LinearMethod] = None
    shard_dim: int = 0

    def shard_span(self, shard_id: Optional[object] = None) -> tuple[int, int, int]:
        raise NotImplementedError

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Optional[object] = None) -> None:
        offset, size, start = self.shard_span(shard_id)
        dim = self.shard_dim
        param.data.narrow(dim, offset, size).copy_(loaded.narrow(dim, start, size))

    def process_weights_after_loading(self) -> None:
        if self.quant_method is not None:
            self.quant_method.process_weights_after_loading(self)
            return
        self.block_weight = find_block_quant(self.weight)
        if cpu_pack_supported(self.weight):
            packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), CPU_PACK_BATCH_HINT)
            self.weight = nn.Parameter(packed, requires_grad=False)  # replaces the dense copy: no double memory

    def matmul(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.quant_method is not None:
            return self.quant_method.apply(self, x, bias)
        return dense_matmul(x, self.weight, bias, self.block_weight)


def dense_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    block_weight: Optional[BlockQuantWeight] = None,
) -> torch.Tensor:
    """x [N, in] @ weight^T (+ bias) -> [N, out]; weight dense [out, in] or oneDNN-packed;
    block_weight: the same weight as integer blocks, if it has them."""
    # The block kernel sums every output in one fixed order whatever the row count, so it also
    # serves batch-invariant mode at any size.
    if block_weight is not None and block_kernel_serves(x.shape[0]):
        return block_quant_linear(x, block_weight, bias)
    gemv = _gemv_for(x, weight)
    if gemv is not None:
        return gemv.gemv_triton(x, weight, bias)
    if weight.is_mkldnn:
        def matmul(rows: torch.Tensor) -> torch.Tensor:
            return torch.ops.mkldnn._linear_pointwise(rows, weight, bias, "none", [], "")
    else:
        def matmul(rows: torch.Tensor) -> torch.Tensor:
            return F.linear(rows, weight, bias)
    return row_blocked(matmul, x) if is_batch_invariant() else matmul(x)


def _gemv_for(x: torch.Tensor, weight: torch.Tensor, silu_mul: bool = False) -> Optional[ModuleType]:
    """The skinny-matmul kernel module where it takes x @ weight^T (a CUDA decode batch of a few
    rows in bf16 / fp16); never in batch-invariant mode, whose matmuls block rows in one fixed way."""
    if not x.is_cuda or is_batch_invariant():
        return None
    gemv = triton_kernels("gemm.gemv_triton")
    return gemv if gemv is not None and gemv.gemv_applies(x, weight, silu_mul) else None


def linear_gemv(linear: LinearBase, x: torch.Tensor, silu_mul: bool = False) -> Optional[ModuleType]:
    """The skinny-matmul kernel module where it takes `linear`'s matmul of x, else None: a dense
    weight (no quant_method, no integer blocks) under _gemv_for's rule. With silu_mul, the weight
    must be a gate | up pair of equal halves, whose silu(gate) * up the kernel then writes."""
    if linear.quant_method is not None or linear.block_weight is not None:
        return None
    if silu_mul and not (isinstance(linear, MergedColumnParallelLinear) and linear.equal_halves()):
        return None
    return _gemv_for(x, linear.weight, silu_mul)


def tp_all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum of every rank's `x`. In batch-invariant mode the ranks' partial sums are added in
    rank order: a ring all-reduce adds them in an order set by where an element falls among the
    ring's chunks, whose bounds move with the batch's size (with 3+ ranks that changes bits).
    Small CUDA messages take the one-shot kernel, rank-ordered too."""
    summed = custom_all_reduce(x)
    if summed is not None:
        return summed
    if not is_batch_invariant():
        torch.distributed.all_reduce(x)
        return x
    parts = [torch.empty_like(x) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(parts, x)
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def _divide(total: int, tp_size: int, what: str) -> int:
    if total % tp_size:
        raise ValueError(f"{what} ({total}) is not divisible by the TP size {tp_size}.")
    return total // tp_size


class ColumnParallelLinear(LinearBase):
    """y = x W^T + b with W split along the output dim: each rank computes its output slice."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        *,
        params_dtype: torch.dtype = torch.float32,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.output_size_per_partition = _divide(output_size, tp_size, "output size")
        out = self.output_size_per_partition
        self.weight = make_param((out, input_size), params_dtype, self.weight_loader)
        self.bias = make_param((out,), params_dtype, self.weight_loader) if bias else None

    def shard_span(self, shard_id: Optional[object] = None) -> tuple[int, int, int]:
        size = self.output_size_per_partition
        return 0, size, self.tp_rank * size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input in one matmul (gate_proj + up_proj)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False, **kwargs) -> None:
        super().__init__(input_size, sum(output_sizes), bias, **kwargs)
        self.output_sizes = output_sizes

    def fused_silu_mul(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        """silu(gate) * up [N, I / tp] of a gate | up projection in one skinny-matmul launch, with
        the rounding of the matmul followed by the separate activation; None where that kernel
        does not take this input (then the caller runs the two steps)."""
        gemv = linear_gemv(self, x, silu_mul=True)
        return None if gemv is None else gemv.gemv_triton(x, self.weight, self.bias, silu_mul=True)

    def equal_halves(self) -> bool:
        """Whether the projection is two halves of one size (gate | up)."""
        return len(self.output_sizes) == 2 and self.output_sizes[0] == self.output_sizes[1]

    def shard_span(self, shard_id: Optional[object] = None) -> tuple[int, int, int]:
        size = self.output_sizes[shard_id] // self.tp_size
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        return offset, size, self.tp_rank * size


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matmul; heads split over ranks, KV heads replicated when
    there are fewer of them than ranks."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        total_num_heads: int,
        total_num_kv_heads: int,
        bias: bool = False,
        *,
        params_dtype: torch.dtype = torch.float32,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        num_heads = _divide(total_num_heads, tp_size, "attention heads")
        if total_num_kv_heads >= tp_size:
            num_kv_heads = _divide(total_num_kv_heads, tp_size, "KV heads")
            kv_head_start = tp_rank * num_kv_heads
        elif tp_size % total_num_kv_heads == 0:
            num_kv_heads, kv_head_start = 1, tp_rank * total_num_kv_heads // tp_size
        else:
            raise ValueError(f"TP size {tp_size} must divide or be a multiple of the KV heads ({total_num_kv_heads}).")
        out = (num_heads + 2 * num_kv_heads) * head_dim * tp_size
        super().__init__(hidden_size, out, bias, params_dtype=params_dtype, tp_rank=tp_rank, tp_size=tp_size)
        self.head_dim, self.num_heads, self.num_kv_heads = head_dim, num_heads, num_kv_heads
        self.kv_head_start = kv_head_start

    def shard_span(self, shard_id: Optional[object] = None) -> tuple[int, int, int]:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if shard_id == "q":
            return 0, q_size, self.tp_rank * q_size
        offset = q_size if shard_id == "k" else q_size + kv_size
        return offset, kv_size, self.kv_head_start * self.head_dim


class RowParallelLinear(LinearBase):
    """y = x W^T + b with W split along the input dim: partial sums are all-reduced over ranks."""

    shard_dim = 1

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        *,
        params_dtype: torch.dtype = torch.float32,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.input_size_per_partition = _divide(input_size, tp_size, "input size")
        self.weight = make_param((output_size, self.input_size_per_partition), params_dtype, self.weight_loader)
        self.bias = make_param((output_size,), params_dtype, default_weight_loader) if bias else None

    def shard_span(self, shard_id: Optional[object] = None) -> tuple[int, int, int]:
        size = self.input_size_per_partition
        return 0, size, self.tp_rank * size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.matmul(x)
        if self.tp_size > 1:
            out = tp_all_reduce_sum(out)
        # The bias joins after the reduction so it is added once, not once per rank.
        return out if self.bias is None else out + self.bias
