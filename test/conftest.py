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


@pytest.fixture(scope="session")
def smollm_server(gguf_path: str):
    """One real server on the embedded SmolLM2 for the session's HTTP end-to-end tests (score,
    responses, chat); custom logit processors are enabled for the masked-logprob checks."""
    from engine_utils import running_server

    with running_server("--model-path", gguf_path, "--enable-custom-logit-processor") as server:
        yield server
