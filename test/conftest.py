"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest

from sglang.srt.utils.embedded_model import embedded_model_path


@pytest.fixture(scope="session")
def gguf_path() -> str:
    """The embedded SmolLM2 GGUF; tests that need it skip when the package is missing."""
    try:
        return embedded_model_path()
    except FileNotFoundError as err:
        pytest.skip(str(err))
