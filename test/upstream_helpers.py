"""Helpers and constants of the ports of SGLang's upstream tests (test/*/test_*_upstream.py); the
extra server they share is the upstream_servers plugin."""

from __future__ import annotations

from typing import Any

import requests
from flag_helpers import post_ok  # noqa: F401  (re-exported for the upstream ports)
from flag_helpers import stream as sse_data  # noqa: F401
from sglang.test.server_process import ServerProcess

TIMEOUT = 300
EXTRA_CONTEXT_LEN = 1000
EXTRA_CHUNKED_PREFILL = 64
EXTRA_STREAM_INTERVAL = 2
EXTRA_FLAGS = [
    "--context-length", str(EXTRA_CONTEXT_LEN),
    "--max-total-tokens", "4000",
    "--chunked-prefill-size", str(EXTRA_CHUNKED_PREFILL),
    "--schedule-policy", "lpm",
    "--disable-overlap-schedule",
    "--stream-interval", str(EXTRA_STREAM_INTERVAL),
    "--enable-cache-report",
    "--max-running-requests", "10",
    "--grammar-backend", "llguidance",
    "--enable-metrics",
]
TOOLS_PARSER = "llama3"
# No free whitespace inside constrained JSON: a 135M model sampling at temperature 0.9 otherwise
# pads a forced call with whitespace until max_tokens (upstream's 8B models close it).
TOOLS_FLAGS = ["--tool-call-parser", TOOLS_PARSER, "--constrained-json-disable-any-whitespace"]


def post(server: ServerProcess, path: str, body: Any, timeout: float = TIMEOUT) -> requests.Response:
    return requests.post(server.url + path, json=body, timeout=timeout)


def served_model(server: ServerProcess) -> str:
    return requests.get(server.url + "/v1/models", timeout=60).json()["data"][0]["id"]


def openai_client(server: ServerProcess, api_key: str = "sk-upstream-port"):
    import openai

    return openai.Client(api_key=api_key, base_url=server.url + "/v1", timeout=TIMEOUT, max_retries=0)
