"""Port of SGLang's test/srt/ascend/test_ascend_stream_interval.py (an NPU test of the generic
--stream-interval flag; nothing in it is NPU-specific but the launch flags): a server started
with --stream-interval 2 answers /generate and reports stream_interval 2 in /get_server_info.

On the shared extra server (its --stream-interval 2). Upstream also asserts that the answer to
"The capital of France is" contains "Paris": model quality, kept as a skipped test.
"""

from __future__ import annotations

import pytest
import requests
from upstream_helpers import EXTRA_STREAM_INTERVAL, post

pytestmark = pytest.mark.e2e

pytest_plugins = ["upstream_servers"]

BODY = {"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 32}}


def test_stream_interval(upstream_extra_server) -> None:
    assert post(upstream_extra_server, "/generate", BODY).status_code == 200
    info = requests.get(upstream_extra_server.url + "/get_server_info", timeout=60)
    assert info.status_code == 200
    assert info.json()["stream_interval"] == EXTRA_STREAM_INTERVAL == 2


@pytest.mark.skip(reason="depends on model quality: upstream asserts the answer contains 'Paris'")
def test_stream_interval_answer_quality(upstream_extra_server) -> None:
    assert "Paris" in post(upstream_extra_server, "/generate", BODY).text
