"""Start the real server (embedded SmolLM2) for end-to-end tests, and small request helpers."""

from __future__ import annotations

import contextlib
import json
from typing import Any, Iterator

import requests

from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor
from sglang.test.server_process import ServerProcess, free_port


@contextlib.contextmanager
def running_server(*flags: str) -> Iterator[ServerProcess]:
    port = free_port()
    server = ServerProcess(["--port", str(port), *flags], port, startup_timeout=600)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


def generate(server: ServerProcess, text: Any, timeout: float = 300, **fields: Any) -> requests.Response:
    key = "input_ids" if isinstance(text, list) and text and isinstance(text[0], int) else "text"
    return requests.post(server.url + "/generate", json={key: text, **fields}, timeout=timeout)


def generate_ok(server: ServerProcess, text: Any, **fields: Any) -> Any:
    response = generate(server, text, **fields)
    assert response.status_code == 200, response.text
    return response.json()


def stream_chunks(server: ServerProcess, payload: dict, timeout: float = 300) -> list[dict]:
    """POST /generate with stream=True; every `data:` chunk decoded, stopping at [DONE]."""
    return list(iter_stream(server, payload, timeout))


def iter_stream(server: ServerProcess, payload: dict, timeout: float = 300) -> Iterator[dict]:
    """The decoded `data:` chunks of a streamed /generate, as they arrive, up to [DONE]."""
    with requests.post(server.url + "/generate", json={**payload, "stream": True}, stream=True, timeout=timeout) as response:
        assert response.status_code == 200, response.text
        for line in response.iter_lines():
            if not line.startswith(b"data: "):
                continue
            data = line[len(b"data: ") :]
            if data == b"[DONE]":
                return
            yield json.loads(data)


def greedy(max_new_tokens: int = 16, **params: Any) -> dict[str, Any]:
    return {"temperature": 0.0, "max_new_tokens": max_new_tokens, **params}


def output_ids(result: dict) -> list[int]:
    return result["output_ids"]


def processor_shipped_by_value(body: str) -> type:
    """A processor class the server cannot import, so dill carries its code: built in a
    namespace named __main__, because a class from a test module would pickle a reference to
    a module the server does not have."""
    namespace = {"CustomLogitProcessor": CustomLogitProcessor, "__name__": "__main__"}
    source = f"class Processor(CustomLogitProcessor):\n    def __call__(self, logits, custom_param_list):\n        {body}\n"
    exec(source, namespace)  # noqa: S102 - test-only code we wrote above
    return namespace["Processor"]
