"""Ports of SGLang's test/srt/openai_server/features/: test_cache_report.py (the prefix cache's
cached_tokens in /generate's meta_info and in OpenAI usage.prompt_tokens_details, with
--enable-cache-report and a small --chunked-prefill-size) and test_continuous_usage_stats.py
(stream_options.continuous_usage_stats on streamed chat).

test_cache_report runs on the shared extra server (--chunked-prefill-size 64, upstream 40;
--enable-cache-report; also --schedule-policy lpm and --disable-overlap-schedule, which do not
change what is cached). The other tests of that server use prompts that share no prefix with
these beyond the chat template, which upstream's thresholds allow for.

The other files of features/ are ported with their feature: json mode, json_constrained, ebnf
and structural tags in grammar/test_structured_outputs_upstream.py; enable_thinking,
reasoning_content and usage_tokens in tools/test_reasoning_upstream.py. Not ported: hidden states
and LoRA (not served).
"""

from __future__ import annotations

import asyncio

import openai
import pytest
import requests
from upstream_helpers import openai_client, served_model

pytestmark = pytest.mark.e2e

pytest_plugins = ["upstream_servers"]



class CacheReport:
    """Upstream's TestCacheReport state: the clients and min_cached (what the chat template
    alone may contribute to cached_tokens), measured once as upstream's setUpClass does."""

    def __init__(self, server) -> None:
        self.server = server
        self.model = served_model(server)
        self.client = openai_client(server)
        usage = self.chat("1").usage
        total_template_size = usage.prompt_tokens - 1  # a one-token message plus the template
        usage2 = self.chat("2").usage
        assert usage2.prompt_tokens_details.cached_tokens <= total_template_size
        self.min_cached = max(usage2.prompt_tokens_details.cached_tokens,
                              total_template_size - usage2.prompt_tokens_details.cached_tokens)

    def chat(self, message: str, **extra):
        return self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": message}], temperature=0, max_tokens=8, **extra,
        )

    def generate(self) -> dict:
        r = requests.post(self.server.url + "/generate", json={
            # an uncommon start, so that no earlier request shares its prefix
            "text": "_ The capital of France is",
            "sampling_params": {"temperature": 0, "max_new_tokens": 8, "stop_token_ids": [2]},
            "logprob_start_len": 0,
        }, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()["meta_info"]

    def cache_report_openai(self, message: str) -> int:
        first = int(self.chat(message).usage.prompt_tokens_details.cached_tokens)
        assert first <= self.min_cached
        usage = self.chat(message).usage
        cached = int(usage.prompt_tokens_details.cached_tokens)
        assert cached > 0
        assert cached == int(usage.prompt_tokens) - 1
        return first


@pytest.fixture(scope="module")
def cache_report(upstream_extra_server) -> CacheReport:
    return CacheReport(upstream_extra_server)


def test_generate(cache_report) -> None:
    meta = cache_report.generate()
    assert int(meta["cached_tokens"]) < cache_report.min_cached
    meta = cache_report.generate()
    assert int(meta["cached_tokens"]) == int(meta["prompt_tokens"]) - 1


def test_cache_split_prefill_openai(cache_report) -> None:
    cache_report.cache_report_openai(
        "€ This is a very long and unique text that should not be already cached, the twist is"
        " that it should be longer than the chunked-prefill-size, so it should be split among"
        " several prefill requests. Still, it shouldn't be cached"
    )


def test_cache_report_openai(cache_report) -> None:
    cache_report.chat("Introduce the capital of France.")  # warm the cache up with the template
    first_1 = cache_report.chat("How many sparrow do you need to lift a coconut?").usage.prompt_tokens_details.cached_tokens
    usage_2 = cache_report.chat("* sing something about cats").usage
    first_2 = usage_2.prompt_tokens_details.cached_tokens
    assert first_1 == first_2  # only the template in common
    cache_report.chat("* sing something about cats and dogs")
    resp = cache_report.chat("* sing something about cats, please")
    assert resp.usage.prompt_tokens_details.cached_tokens >= usage_2.prompt_tokens - cache_report.min_cached


def test_cache_salt_effectiveness(cache_report) -> None:
    message = "What is the capital of Japan?"

    def cached(salt: str) -> tuple[int, int]:
        usage = cache_report.chat(message, extra_body={"cache_salt": salt}).usage
        return int(usage.prompt_tokens_details.cached_tokens), int(usage.prompt_tokens)

    salt1_first, prompt_tokens = cached("salt1")
    salt1_second, _ = cached("salt1")
    assert salt1_second > salt1_first, "the same cache_salt hits the cache"
    assert salt1_second == prompt_tokens - 1
    salt2_first, _ = cached("salt2")
    assert salt2_first <= salt1_first + cache_report.min_cached, "another cache_salt does not share the cache"
    salt2_second, _ = cached("salt2")
    assert salt2_second > salt2_first, "the same cache_salt hits the cache"


# ------------------------------------------------------------------ test_continuous_usage_stats


@pytest.fixture(scope="module")
def chat_model(smollm_server) -> str:
    return served_model(smollm_server)


def test_continuous_usage_stats_enabled(smollm_server, chat_model) -> None:
    stream = openai_client(smollm_server).chat.completions.create(
        model=chat_model, messages=[{"role": "user", "content": "What is machine learning?"}], stream=True,
        max_tokens=30, temperature=0, stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    with_usage = with_content = 0
    last_usage = None
    for chunk in stream:
        if chunk.usage:
            with_usage += 1
            last_usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            with_content += 1
    assert with_content > 0
    assert with_usage >= with_content
    assert last_usage.prompt_tokens > 0 and last_usage.completion_tokens > 0
    assert last_usage.total_tokens == last_usage.prompt_tokens + last_usage.completion_tokens


def test_continuous_usage_stats_async(smollm_server, chat_model) -> None:
    async def run() -> tuple[int, int]:
        client = openai.AsyncClient(api_key="sk-upstream-port", base_url=smollm_server.url + "/v1", timeout=300)
        stream = await client.chat.completions.create(
            model=chat_model, messages=[{"role": "user", "content": "What is deep learning?"}], stream=True,
            max_tokens=30, temperature=0, stream_options={"include_usage": True, "continuous_usage_stats": True},
        )
        with_usage = with_content = 0
        async for chunk in stream:
            if chunk.usage:
                with_usage += 1
            if chunk.choices and chunk.choices[0].delta.content:
                with_content += 1
        await client.close()
        return with_usage, with_content

    with_usage, with_content = asyncio.run(run())
    assert with_content > 0
    assert with_usage >= with_content


def test_continuous_usage_stats_disabled(smollm_server, chat_model) -> None:
    stream = openai_client(smollm_server).chat.completions.create(
        model=chat_model, messages=[{"role": "user", "content": "What is AI?"}], stream=True, max_tokens=30,
        temperature=0, stream_options={"include_usage": True, "continuous_usage_stats": False},
    )
    usage_chunks = [chunk for chunk in stream if chunk.usage]
    assert len(usage_chunks) == 1
    assert len(usage_chunks[0].choices) == 0
