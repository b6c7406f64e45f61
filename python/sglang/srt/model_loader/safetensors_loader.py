"""HF safetensors checkpoints: one file or several shards listed by model.safetensors.index.json."""

from __future__ import annotations

import glob
import json
import os
from typing import Iterator

import torch

INDEX_FILE = "model.safetensors.index.json"


def safetensors_files(folder: str) -> list[str]:
    index = os.path.join(folder, INDEX_FILE)
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(folder, s) for s in shards]
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"No *.safetensors files in {folder}.")
    return files


def iter_safetensors_weights(folder: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF parameter name, tensor in the checkpoint dtype), one tensor in memory at a time."""
    from safetensors import safe_open

    for path in safetensors_files(folder):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
