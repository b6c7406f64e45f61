"""SGLang's observable behaviour where its clients depend on it: the model id /v1/models lists,
chat messages on /v1/tokenize, the meta_info of a failed /generate, health checks that never
share a prefix with a client's prompt. (Out-of-vocabulary stop_token_ids: test_sampling_params;
the /generate error texts and statuses: test_http_server.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sglang.srt.entrypoints.generate_route import failed_meta_info
from sglang.srt.entrypoints.tokenization import tokenize
from sglang.srt.server_args import ServerArgs


def test_served_model_name_defaults_to_the_model_path_as_given(tmp_path) -> None:
    model = str(tmp_path / "org" / "Model-7B")
    args = ServerArgs(model_path=model, device="cpu").resolve()
    assert args.served_model_name == model
    named = ServerArgs(model_path=model, served_model_name="mine", device="cpu").resolve()
    assert named.served_model_name == "mine"


class _CharTokenizer:
    """One id per character; a BOS (id 1) when add_special_tokens."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]


def test_tokenize_chat_messages_gives_the_chat_completions_ids() -> None:
    seen: list[dict[str, Any]] = []

    def render(body: dict[str, Any]) -> str:
        seen.append(body)
        return "".join(f"<{m['role']}>{m['content']}" for m in body["messages"])

    messages = [{"role": "user", "content": "hi"}]
    out = tokenize({"model": "m", "messages": messages}, _CharTokenizer(), 64, render)
    assert out == {"tokens": [1] + [ord(c) for c in "<user>hi"], "count": 9, "max_model_len": 64}
    plain = tokenize({"messages": messages, "add_special_tokens": False, "add_generation_prompt": True},
                     _CharTokenizer(), 64, render)
    assert plain["tokens"] == [ord(c) for c in "<user>hi"]
    assert seen[-1] == {"messages": messages, "add_generation_prompt": True}  # add_special_tokens is ours


@pytest.mark.parametrize("body,message", [
    ({"messages": [], "prompt": "x"}, "Exactly one of 'prompt' or 'messages'"),
    ({"messages": [], "bogus": 1}, "bogus"),
])
def test_tokenize_chat_refusals_name_the_field(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tokenize(body, _CharTokenizer(), 64, lambda b: "")


def test_tokenize_renders_through_the_chat_route() -> None:
    """register_openai_routes hands the chat route's renderer to /v1/tokenize."""
    from fastapi import FastAPI

    from sglang.srt.entrypoints.openai import register_openai_routes

    class _Tokenizer:
        chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}"

        def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
            return "".join(f"[{m['role']}] {m['content']}" for m in messages) + (">>" if kwargs["add_generation_prompt"] else "")

        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return [ord(c) for c in text]

    class _Manager:
        tokenizer = _Tokenizer()

    app = FastAPI()
    register_openai_routes(app, _Manager(), ServerArgs(model_path="/m", served_model_name="m"))
    prompt = app.state.render_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert prompt.endswith("[user] hi>>")


def test_failed_meta_info_has_what_sglang_clients_index() -> None:
    meta = failed_meta_info("The request queue is full", 503, "r1")
    assert meta["id"] == "r1" and meta["finish_reason"]["type"] == "abort"
    assert meta["finish_reason"]["message"] == "The request queue is full" and meta["finish_reason"]["status_code"] == 503
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (0, 0, 0)
    assert failed_meta_info("bad", 400, ["a", "b"])["id"] is None


def test_health_checks_use_a_prefix_cache_namespace_of_their_own() -> None:
    """A client's prompt never shares a cached prefix with a health check's token (so a fresh
    prompt after /flush_cache reports cached_tokens 0 even when /health ran in between)."""
    from sglang.srt.managers.tokenizer_manager import HEALTH_CHECK_NAMESPACE, TokenizerManager

    seen = []
    tm = TokenizerManager.__new__(TokenizerManager)

    async def drain(obj: Any) -> None:
        seen.append(obj)

    tm._drain = drain
    assert asyncio.run(tm.health(timeout=5))
    assert seen[0].extra_key == HEALTH_CHECK_NAMESPACE and seen[0].input_ids == [0]
