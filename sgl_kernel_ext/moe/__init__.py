"""Mixture-of-experts kernels: the grouped-GEMM experts as Triton kernels for CUDA
(fused_moe_triton) and their plain-torch reference (reference.fused_experts_reference)."""
