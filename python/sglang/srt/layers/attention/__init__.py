"""Attention over the paged KV cache: the layer, and one backend per file behind one interface,
chosen by --attention-backend (default triton on CUDA, cpu on CPU)."""

from __future__ import annotations

import torch

from sglang.srt.layers.attention.attention_layer import Attention
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES, default_attention_backend


def create_attention_backend(
    name: str, req_to_token: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> AttentionBackend:
    """The backend for this model's (TP-local) head counts; imports only the one chosen, so a CPU
    install never needs Triton."""
    device = req_to_token.device.type
    if name == "triton":
        if device != "cuda":
            raise ValueError("--attention-backend triton needs a CUDA device; use cpu or torch_native on CPU.")
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        return TritonAttnBackend(req_to_token, num_heads, num_kv_heads, head_dim)
    if name == "cpu":
        if device != "cpu":
            raise ValueError("--attention-backend cpu runs on the CPU only; use triton or torch_native on CUDA.")
        from sglang.srt.layers.attention.cpu_backend import CpuAttnBackend

        return CpuAttnBackend(req_to_token, num_kv_heads, head_dim, dtype)
    if name == "torch_native":
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

        return TorchNativeAttnBackend(req_to_token, num_kv_heads, head_dim, dtype)
    if name == "flashinfer":
        raise ValueError(
            "--attention-backend flashinfer is not available in this build (FlashInfer's attention kernels are "
            "not shipped); choose triton or torch_native on CUDA."
        )
    raise ValueError(f"--attention-backend must be one of {', '.join(ATTENTION_BACKEND_CHOICES)}, got {name!r}.")


__all__ = ["Attention", "AttentionBackend", "ATTENTION_BACKEND_CHOICES", "create_attention_backend", "default_attention_backend"]
