"""Small helpers shared across the engine."""

from __future__ import annotations

import os
from typing import Sequence, Union

import torch


def host_to_device(values: Union[Sequence[int], torch.Tensor], device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A host list or CPU tensor on `device` without blocking the host: staged in pinned memory on
    CUDA, so the copy is truly asynchronous (torch.tensor(list, device=cuda) waits for it).
    The caching host allocator keeps the staging buffer until the copy has run."""
    if device.type != "cuda":
        return torch.as_tensor(values, dtype=dtype)
    staged = torch.as_tensor(values, dtype=dtype).pin_memory()
    return staged.to(device, non_blocking=True)


def available_ram_bytes() -> int:
    """RAM a new allocation can take: Linux's MemAvailable (free pages plus reclaimable page
    cache), else the free pages. Free pages alone shrink to little once files fill the cache."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
