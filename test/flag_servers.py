"""Real servers on the embedded SmolLM2 for the launch-flag tests (--skip-tokenizer-init,
--stream-output, --log-requests), started together once per session: each start is mostly
model loading, and three in parallel take about as long as one on a small machine. A pytest
plugin (test modules name it in pytest_plugins), so that every module shares the one fixture;
the request helpers are in flag_helpers.

"plain" is the reference: no output-changing flag. It runs with --log-requests, which changes
no output, so that test_log_requests can read its log.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from sglang.test.server_process import ServerProcess, free_port


@pytest.fixture(scope="session")
def flag_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    # A tokenizer path that does not exist: the server starts only if nothing loads a tokenizer.
    missing = str(tmp_path_factory.mktemp("no_tokenizer") / "missing")
    flags = {
        "plain": ["--log-requests"],
        "skip": ["--skip-tokenizer-init", "--tokenizer-path", missing],
        "stream": ["--stream-output"],
    }
    servers = {}
    try:
        for name, extra in flags.items():
            port = free_port()
            servers[name] = ServerProcess(["--port", str(port), *extra], port, startup_timeout=600)
        for server in servers.values():
            server.wait_healthy()
        yield servers
    finally:
        for server in servers.values():
            server.stop()
