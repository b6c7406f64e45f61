"""Triton kernel modules of sgl_kernel_ext, imported on first CUDA use, so that CPU-only
installs never need triton."""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Optional


@functools.cache
def triton_kernels(module: str) -> Optional[ModuleType]:
    """sgl_kernel_ext.<module> (e.g. "gemm.gemv_triton"); None where triton is not importable."""
    try:
        return importlib.import_module(f"sgl_kernel_ext.{module}")
    except ImportError:
        return None
