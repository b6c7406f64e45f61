"""Servers shared by the reliability suite. SGLANG_RELIABILITY_LONG=1 runs the long versions
(10-minute load, more fuzz examples); CI runs the short ones."""

from __future__ import annotations

import pytest

from reliability_utils import API_KEY, server


@pytest.fixture(scope="session")
def clean_server(gguf_path: str):
    """Deterministic (a request's tokens are a function of the request: replays must match), with metrics."""
    with server("--model-path", gguf_path, "--enable-deterministic-inference", "--enable-metrics") as srv:
        yield srv


@pytest.fixture(scope="session")
def guarded_server(gguf_path: str):
    """--api-key and a 64-token context (so that no fuzzed request generates for long)."""
    with server("--model-path", gguf_path, "--enable-metrics", "--context-length", "64", api_key=API_KEY) as srv:
        yield srv
