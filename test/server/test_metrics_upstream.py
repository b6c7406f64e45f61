"""Port of SGLang's test/srt/test_metrics.py (TestEnableMetrics.test_metrics_1gpu): after a
/health_generate and a streamed /generate, /metrics lists SGLang's essential metrics with the
model_name label and histogram series. On the shared extra server (`--enable-metrics`,
upstream_servers); upstream's model name is its --model-path, here the served model's id.

Not ported: test_metrics_2gpu (`--tp 2 --dp 2 --enable-dp-attention` and the DP-attention and
device-timer metrics behind SGLang's env switches; skipped in SGLang's CI).
"""

from __future__ import annotations

import pytest
import requests
from upstream_helpers import TIMEOUT, served_model

pytestmark = pytest.mark.e2e

pytest_plugins = ["upstream_servers"]

ESSENTIAL_METRICS = [
    "sglang:num_running_reqs",
    "sglang:num_used_tokens",
    "sglang:token_usage",
    "sglang:gen_throughput",
    "sglang:num_queue_reqs",
    "sglang:num_grammar_queue_reqs",
    "sglang:cache_hit_rate",
    "sglang:spec_accept_length",
    "sglang:prompt_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:cached_tokens_total",
    "sglang:num_requests_total",
    "sglang:time_to_first_token_seconds",
    "sglang:inter_token_latency_seconds",
    "sglang:e2e_request_latency_seconds",
]


def test_metrics_1gpu(upstream_extra_server) -> None:
    server = upstream_extra_server
    assert requests.get(server.url + "/health_generate", timeout=TIMEOUT).status_code == 200
    body = {"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 32}, "stream": True}
    with requests.post(server.url + "/generate", json=body, stream=True, timeout=TIMEOUT) as response:
        assert response.status_code == 200
        for _ in response.iter_lines():
            pass
    metrics = requests.get(server.url + "/metrics", timeout=TIMEOUT)
    assert metrics.status_code == 200
    content = metrics.text
    for name in ESSENTIAL_METRICS:
        assert name in content, f"Missing metric: {name}"
    assert f'model_name="{served_model(server)}"' in content
    assert "_sum{" in content and "_count{" in content and "_bucket{" in content
