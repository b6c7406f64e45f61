"""Activation kernels: the MLP's silu(gate) * up as one Triton kernel for CUDA
(silu_mul_triton) and its plain-torch reference (reference.silu_mul_reference)."""
