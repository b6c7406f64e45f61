"""Shared pieces of the ports of SGLang's upstream tests (test/*/test_*_upstream.py).

A pytest plugin (modules name it in `pytest_plugins`): one extra real server, started once per
session, for the upstream tests that need launch flags the shared `smollm_server` does not have:

- `--context-length 1000` (upstream test_request_length_validation),
- `--chunked-prefill-size 64` and `--enable-cache-report` (upstream test_cache_report,
  test_srt_endpoint's chunked-prefill logprob case),
- `--schedule-policy lpm --disable-overlap-schedule` (upstream TestRadixCacheNonOverlapLPM),
- `--stream-interval 2` (upstream test_ascend_stream_interval),
- `--max-running-requests 10` (upstream test_matched_stop),
- `--grammar-backend llguidance` (the LLGuidance classes of test_json_constrained, test_json_mode,
  test_ebnf_constrained and test_regex_constrained; their xgrammar classes run on the session's
  `smollm_server`),
- `--enable-metrics` (upstream test_metrics).

Grouping them costs one server start instead of five. The flags do not change greedy tokens.

A second SmolLM2 server has upstream's function-calling flag, `--tool-call-parser llama3`
(test_openai_function_calling, test_tool_choice, test_responses_function_calling). It keeps the
xgrammar backend: llguidance reads the llama3 trigger `<|python_tag|>` of a strict tool's
structural tag as a special token, which SmolLM2's vocabulary lacks. A third runs the tiny random
Qwen3-style checkpoint of reasoning_model with `--reasoning-parser qwen3` (test_enable_thinking,
test_reasoning_content). The helpers and constants are in upstream_helpers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sglang.test.server_process import ServerProcess, free_port
from reasoning_model import write_reasoning_model
from upstream_helpers import EXTRA_FLAGS, TOOLS_FLAGS


def _serve(*argv: str) -> Iterator[ServerProcess]:
    port = free_port()
    server = ServerProcess(["--port", str(port), *argv], port, startup_timeout=600)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def upstream_extra_server(gguf_path: str) -> Iterator[ServerProcess]:
    yield from _serve("--model-path", gguf_path, *EXTRA_FLAGS)


@pytest.fixture(scope="session")
def upstream_tools_server(gguf_path: str) -> Iterator[ServerProcess]:
    yield from _serve("--model-path", gguf_path, *TOOLS_FLAGS)


@pytest.fixture(scope="session")
def upstream_reasoning_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = str(tmp_path_factory.mktemp("tiny-qwen3-reasoning"))
    write_reasoning_model(folder)
    yield from _serve("--model-path", folder, "--reasoning-parser", "qwen3")
