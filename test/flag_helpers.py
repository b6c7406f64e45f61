"""Request helpers and prompts of the launch-flag tests (servers: the flag_servers plugin)."""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import requests

from sglang.test.server_process import ServerProcess

PROMPT = "The capital of France is"
# The model answers this with a few tokens and then EOS (<|im_end|>, id 2 in the model config).
CHAT_SHORT = "<|im_start|>user\nSay only the word yes.<|im_end|>\n<|im_start|>assistant\n"
EOS = 2
TIMEOUT = 300


def post(server: ServerProcess, path: str, body: Any) -> requests.Response:
    return requests.post(server.url + path, json=body, timeout=TIMEOUT)


def post_ok(server: ServerProcess, path: str, body: Any) -> Any:
    response = post(server, path, body)
    assert response.status_code == 200, response.text
    return response.json()


def stream(server: ServerProcess, path: str, body: dict) -> list[dict]:
    """Every `data:` chunk of a streamed request, up to [DONE]."""
    chunks = []
    with requests.post(server.url + path, json={**body, "stream": True}, stream=True, timeout=TIMEOUT) as response:
        assert response.status_code == 200, response.text
        for line in response.iter_lines():
            if line.startswith(b"data: "):
                data = line[len(b"data: ") :]
                if data == b"[DONE]":
                    break
                chunks.append(json.loads(data))
    return chunks


def token_ids(plain: ServerProcess, text: str) -> list[int]:
    """What a server with a tokenizer makes of `text` (its /generate would prefill exactly these)."""
    return post_ok(plain, "/tokenize", {"prompt": text})["tokens"]


def wait_until(condition: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
    """Poll `condition` (e.g. for a log line the server's output reader has not read yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
