"""Shared pieces of the ports of SGLang's upstream tests (test/*/test_*_upstream.py).

A pytest plugin (modules name it in `pytest_plugins`): one extra real server, started once per
session, for the upstream tests that need launch flags the shared `smollm_server` does not have:

- `--context-length 1000` (upstream test_request_length_validation),
- `--chunked-prefill-size 64` and `--enable-cache-report` (upstream test_cache_report,
  test_srt_endpoint's chunked-prefill logprob case),
- `--schedule-policy lpm --disable-overlap-schedule` (upstream TestRadixCacheNonOverlapLPM),
- `--stream-interval 2` (upstream test_ascend_stream_interval),
- `--max-running-requests 10` (upstream test_matched_stop).

Grouping them costs one server start instead of five. The flags do not change greedy tokens.
The helpers and constants are in upstream_helpers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sglang.test.server_process import ServerProcess, free_port
from upstream_helpers import EXTRA_FLAGS


@pytest.fixture(scope="session")
def upstream_extra_server(gguf_path: str) -> Iterator[ServerProcess]:
    port = free_port()
    server = ServerProcess(["--port", str(port), "--model-path", gguf_path, *EXTRA_FLAGS], port, startup_timeout=600)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()
