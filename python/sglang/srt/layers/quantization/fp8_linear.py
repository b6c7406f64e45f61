"""Fp8LinearMethod: a linear layer (layers/linear.py) holding FP8 weights and their scales.

Before loading, `attach_fp8` gives the layer its FP8 parameters, each with a weight_loader that
takes the full checkpoint tensor and copies this TP rank's slice, as the layer's own weight
does: per-row scales follow the weight's rows, block scales the weight's blocks (a TP or fused
slice must then start and end on block edges, or loading fails naming the layer). After
loading, per-tensor scales are already per row and a bf16 weight (--quantization fp8) is
quantised per output channel. The LM head and the embeddings are not linears and stay as loaded.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch import nn

from sgl_kernel_ext.gemm.fp8_reference import FP8_DTYPE, GROUP, fp8_linear_reference, quantize_weight_rows
from sglang.srt.layers.linear import LinearBase
from sglang.srt.layers.quantization.base import Fp8Scheme, QuantConfig
from sglang.srt.layers.quantization.fp8_gemm import (
    rowwise_backend,
    scaled_mm_blockwise,
    scaled_mm_blockwise_applies,
    scaled_mm_rowwise,
    triton_fp8_linear,
)

def _param(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, loader: Callable, fill: Optional[float] = None
) -> nn.Parameter:
    if fill is None:
        data = torch.empty(shape, dtype=dtype, device=device)
    else:
        data = torch.full(shape, fill, dtype=dtype, device=device)
    param = nn.Parameter(data, requires_grad=False)
    param.weight_loader = loader
    return param


def _max_scale_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: Optional[object] = None) -> None:
    """A static input_scale: the parts of a fused linear read the same input, so the largest of
    their scales serves all without clipping."""
    param.data.copy_(torch.maximum(param.data, loaded.float().reshape(1)))


class Fp8LinearMethod:
    """The FP8 weight of one linear (`prefix` names it in errors)."""

    def __init__(self, scheme: Fp8Scheme, prefix: str) -> None:
        self.scheme = scheme
        self.prefix = prefix

    def create_weights(self, layer: LinearBase) -> None:
        """Replace the layer's weight by FP8 codes (checkpoint FP8) and add its scale parameters,
        under the checkpoint's tensor names."""
        if not self.scheme.checkpoint_fp8:
            return  # the bf16 weight loads as usual and is quantised after loading
        shape, device = tuple(layer.weight.shape), layer.weight.device
        layer.weight = _param(shape, FP8_DTYPE, device, layer.weight_loader)  # [out, in] fp8
        if self.scheme.weight_scale == "block":
            bn, bk = self.scheme.block
            grid = (math.ceil(shape[0] / bn), math.ceil(shape[1] / bk))
            layer.weight_scale_inv = _param(grid, torch.float32, device, self._block_scale_loader(layer))
        else:
            layer.weight_scale = _param((shape[0],), torch.float32, device, self._row_scale_loader(layer))
        if self.scheme.static_input:
            layer.input_scale = _param((1,), torch.float32, device, _max_scale_loader, fill=0.0)

    def _row_scale_loader(self, layer: LinearBase) -> Callable:
        def load(param: nn.Parameter, loaded: torch.Tensor, shard_id: Optional[object] = None) -> None:
            values = loaded.float().reshape(-1)  # [1] per tensor or [N] per channel
            if layer.shard_dim == 1:  # the output rows are not split
                param.data.copy_(values.expand(param.shape[0]) if values.numel() == 1 else values)
                return
            offset, size, start = layer.shard_span(shard_id)
            part = values.expand(size) if values.numel() == 1 else values.narrow(0, start, size)
            param.data.narrow(0, offset, size).copy_(part)

        return load

    def _block_scale_loader(self, layer: LinearBase) -> Callable:
        def load(param: nn.Parameter, loaded: torch.Tensor, shard_id: Optional[object] = None) -> None:
            dim = layer.shard_dim
            block = self.scheme.block[dim]
            offset, size, start = layer.shard_span(shard_id)
            tail = offset + size == layer.weight.shape[dim] and math.ceil((start + size) / block) == loaded.shape[dim]
            if offset % block or start % block or (size % block and not tail):
                what = "output rows" if dim == 0 else "input columns"
                part = "" if shard_id is None else f" (part {shard_id})"
                raise ValueError(
                    f"FP8 block scales of {self.prefix} cannot be split: this rank's {what} [{start}, {start + size})"
                    f"{part} do not start and end on {block}-wide scale blocks; choose a TP size whose shards "
                    f"are multiples of {block}."
                )
            blocks = math.ceil(size / block)
            param.data.narrow(dim, offset // block, blocks).copy_(loaded.float().narrow(dim, start // block, blocks))

        return load

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        if not self.scheme.checkpoint_fp8:
            codes, scale = quantize_weight_rows(layer.weight.data)  # [out, in] fp8, [out]
            layer.weight = nn.Parameter(codes, requires_grad=False)
            layer.weight_scale = nn.Parameter(scale, requires_grad=False)

    def weight_scales(self, layer: LinearBase) -> tuple[torch.Tensor, Optional[tuple[int, int]]]:
        """(scales, block): [ceil(N / bn), ceil(K / bk)] with block (bn, bk), or [N] with None."""
        if self.scheme.weight_scale == "block":
            return layer.weight_scale_inv, self.scheme.block
        return layer.weight_scale, None

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """x [..., K] -> [..., N] in x's dtype. Off CUDA (the tests; the CPU engine refuses FP8)
        the torch reference computes the same quantised product."""
        rows = x.reshape(-1, x.shape[-1]).contiguous()  # [M, K]; the kernels read unit column strides
        out = self._matmul(layer, rows)  # [M, N]
        if bias is not None:
            out = out + bias
        return out.view(*x.shape[:-1], out.shape[-1])

    def _matmul(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        scale, block = self.weight_scales(layer)
        input_scale = getattr(layer, "input_scale", None)
        m, k = x.shape
        n = layer.weight.shape[0]
        backend = "triton" if block is not None else rowwise_backend(m, n, k, x.dtype)
        if not x.is_cuda:
            group = GROUP if backend == "triton" else k
            return fp8_linear_reference(x, layer.weight, scale, block, group, input_scale=input_scale)
        if backend == "scaled_mm":
            return scaled_mm_rowwise(x, layer.weight, scale, input_scale)
        if block is not None and input_scale is None and scaled_mm_blockwise_applies(m, n, k, block, x.dtype):
            return scaled_mm_blockwise(x, layer.weight, scale)
        if block is None:
            scale, block = scale.view(-1, 1), (1, math.ceil(k / GROUP) * GROUP)  # per row: one block per row
        return triton_fp8_linear(x, layer.weight, scale, block, input_scale)


def attach_fp8(model: nn.Module, config: QuantConfig) -> int:
    """Give every linear of `model` that `config` quantises its FP8 method and parameters;
    returns how many."""
    count = 0
    for name, module in model.named_modules():
        if isinstance(module, LinearBase):
            scheme = config.scheme_for(name)
            if scheme is not None:
                module.quant_method = Fp8LinearMethod(scheme, name)
                module.quant_method.create_weights(module)
                count += 1
    return count
