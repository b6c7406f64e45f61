"""llama.cpp's `llama-server` as the serving benchmark's anchor, and the OpenAI completions client
that drives it and our server alike.

Both servers get the same streamed POST /v1/completions requests (the bench's prompts, 64 tokens
with `ignore_eos`, T 0.7 / top_p 0.9 / top_k 50, usage in the last chunk, end-of-generation tokens
banned by `logit_bias`), so only the server differs. llama-server runs on the same GGUF file with one slot per concurrent request and as many
threads as torch uses here.

Build llama-server from the `llama-cpp-python` sdist's vendored llama.cpp: see docs/benchmarks.md.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Sequence

import requests

COMPLETION_SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": 50}
# llama.cpp's `ignore_eos` bans every end-of-generation token (a -inf logit bias, its
# server-schema.cpp); SGLang's only keeps generating after one. A sampled EOS has no text, so
# on ours it held back the first chunk by a decode step (TTFT counts the first chunk with
# text). Both servers get the ban as a logit_bias, so they sample the same distribution: these
# are the token names llama.cpp counts as end of generation (llama-vocab.cpp) that a chat GGUF
# may have, plus its eos_token_id.
EOG_TOKEN_NAMES = frozenset(
    ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|eom_id|>", "<|end_of_text|>", "</s>",
     "<eos>", "<EOT>")
)
BAN = -100.0  # OpenAI's lowest logit_bias
CONTEXT_PER_SLOT = 512  # the bench's prompts (10-40 tokens) + 64 new tokens fit with room to spare


@dataclass
class CompletionTiming:
    ttft_s: float = float("nan")
    itl_s: list[float] = field(default_factory=list)  # one sample per token after the first chunk
    tokens: int = 0


def completion_payload(prompt: str, max_tokens: int, gguf_path: str) -> dict[str, Any]:
    return {
        "model": "default", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}, "logit_bias": eog_logit_bias(gguf_path), **COMPLETION_SAMPLING,
    }


@functools.cache
def eog_logit_bias(gguf_path: str) -> dict[str, float]:
    """{token id: -100} for the GGUF's end-of-generation tokens."""
    from gguf import GGUFReader

    reader = GGUFReader(gguf_path)
    tokens = reader.fields["tokenizer.ggml.tokens"]
    names = {bytes(tokens.parts[i]).decode(errors="replace"): n for n, i in enumerate(tokens.data)}
    ids = {names[name] for name in EOG_TOKEN_NAMES if name in names}
    eos = reader.fields.get("tokenizer.ggml.eos_token_id")
    if eos is not None:
        ids.add(int(eos.parts[-1][0]))
    return {str(i): BAN for i in sorted(ids)}


def sse_chunks(response: requests.Response) -> Iterator[dict[str, Any]]:
    """The JSON chunks of a server-sent-event stream up to `[DONE]`; RuntimeError on an error chunk."""
    for line in response.iter_lines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[len(b"data: ") :])
        if "error" in chunk:
            raise RuntimeError(f"server error: {chunk['error']}")
        yield chunk


def stream_completion(url: str, payload: dict[str, Any], start: threading.Barrier) -> CompletionTiming:
    """One streamed /v1/completions request. The token count comes from the final usage; TTFT is
    the first chunk with text. Servers group tokens into chunks differently, so the ITL is the
    request's mean, (last chunk - first chunk) / (tokens - 1), one sample per token."""
    timing = CompletionTiming()
    start.wait()
    sent = time.perf_counter()
    first = last = None
    with requests.post(url + "/v1/completions", json=payload, stream=True, timeout=600) as response:
        response.raise_for_status()
        for chunk in sse_chunks(response):
            if chunk.get("usage"):
                timing.tokens = chunk["usage"]["completion_tokens"]
            if any(choice.get("text") for choice in chunk.get("choices", [])):
                last = time.perf_counter()
                first = last if first is None else first
    if first is not None:
        timing.ttft_s = first - sent
        if timing.tokens > 1:
            timing.itl_s = [(last - first) / (timing.tokens - 1)] * (timing.tokens - 1)
    return timing


class LlamaServerProcess:
    """`llama-server` on a GGUF file in a subprocess; stop() ends it."""

    def __init__(self, binary: str, model: str, port: int, slots: int, threads: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        command = [
            binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
            "-c", str(CONTEXT_PER_SLOT * slots), "-t", str(threads), "-cb", "--log-disable",
        ]
        self.command = command
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._output: list[str] = []
        threading.Thread(target=self._drain_output, daemon=True).start()

    def _drain_output(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._output.append(line)

    def wait_healthy(self, timeout: float = 300.0) -> None:
        """/health answers 200 once the model is loaded (503 before)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with code {self.proc.returncode}:\n{''.join(self._output)}")
            try:
                if requests.get(self.url + "/health", timeout=30).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"llama-server not healthy after {timeout:.0f} s:\n{''.join(self._output)}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    @staticmethod
    def version(binary: str) -> Optional[str]:
        """The build line `llama-server --version` prints."""
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
        lines = (done.stdout + done.stderr).strip().splitlines()
        return next((line for line in lines if line.startswith("version")), lines[0] if lines else None)


def missing_binary(path: str) -> Optional[str]:
    """Why `path` cannot serve as the llama.cpp anchor, or None when it can."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return f"llama-server not found or not executable at {path}"
    return None


def server_argv(slots: Sequence[int]) -> list[str]:
    """Our server's flags for the anchor run: as many running requests as llama-server's slots."""
    return ["--max-running-requests", str(max(max(slots), 1))]
