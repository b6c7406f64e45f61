"""Watermarking end to end on the embedded SmolLM2 (one server): watermarked text is detected and
plain text is not, on /generate, the OpenAI route and /watermark/detect; seeds, the server key,
bad requests (400 naming watermark) and keys kept out of /get_server_info and the request log."""

from __future__ import annotations

import openai
import pytest
import requests

from engine_utils import generate, generate_ok, greedy, running_server
from sglang.srt.sampling.watermarking import detect

pytestmark = pytest.mark.e2e

SERVER_KEY = "5eC12e7000000001"
KEY = "0123456789abcdef"
PROMPT_IDS = [1, 4093, 253, 1345, 563, 253, 2365, 30, 216]  # any ids; detection gets them exactly
LONG = {"temperature": 1.0, "max_new_tokens": 200, "ignore_eos": True}


@pytest.fixture(scope="module")
def server():
    config = '{"key": "%s", "context_window": 4}' % SERVER_KEY
    with running_server("--enable-watermark", "--watermark-config", config, "--log-requests") as srv:
        yield srv


def _ids(server, **fields):
    return generate_ok(server, PROMPT_IDS, timeout=900, **fields)["output_ids"]


def test_watermarked_text_is_detected_and_plain_text_is_not(server):
    # One batch: the marked and the plain row decode side by side.
    body = {"input_ids": [PROMPT_IDS, PROMPT_IDS],
            "sampling_params": [{**LONG, "sampling_seed": 7, "watermark": {"key": KEY}}, {**LONG, "sampling_seed": 7}]}
    response = requests.post(server.url + "/generate", json=body, timeout=1800)
    assert response.status_code == 200, response.text
    marked, plain = (out["output_ids"] for out in response.json())
    assert len(marked) == len(plain) == 200
    hit = detect(marked, key=KEY, prompt_token_ids=PROMPT_IDS).combined
    miss = detect(plain, key=KEY, prompt_token_ids=PROMPT_IDS).combined
    assert hit.p_value < 1e-6 and hit.num_contexts > 100, hit
    assert miss.p_value > 0.01, miss
    # The HTTP detector answers the same statistic.
    body = {"token_ids": marked, "prompt_token_ids": PROMPT_IDS, "key": KEY}
    answer = requests.post(server.url + "/watermark/detect", json=body, timeout=60).json()
    assert answer["combined"]["log_p_value"] == pytest.approx(hit.log_p_value)


def test_seed_and_key_give_the_same_tokens_and_the_server_key_marks(server):
    params = {"temperature": 1.0, "max_new_tokens": 24, "ignore_eos": True, "sampling_seed": 3}
    first = _ids(server, sampling_params=params, watermark={"enabled": True})  # top-level form
    again = _ids(server, sampling_params={**params, "watermark": {"enabled": True}})
    assert first == again
    assert detect(first, key=SERVER_KEY, prompt_token_ids=PROMPT_IDS).combined.z_score > 2


def test_greedy_requests_are_not_changed(server):
    plain = _ids(server, sampling_params=greedy(12))
    assert _ids(server, sampling_params=greedy(12, watermark={"key": KEY})) == plain


def test_openai_completions_take_the_watermark_extra_field(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    out = client.completions.create(
        model=client.models.list().data[0].id, prompt=PROMPT_IDS, max_tokens=40, temperature=1.0, seed=1,
        extra_body={"watermark": {"key": KEY}, "ignore_eos": True},
    )
    assert out.choices[0].text
    with pytest.raises(openai.BadRequestError, match="watermark"):
        client.completions.create(model=client.models.list().data[0].id, prompt="Hi", max_tokens=2,
                                  extra_body={"watermark": {"key": "not-hex"}})


@pytest.mark.parametrize("fields, name", [
    ({"sampling_params": {"watermark": {"key": "zz-secret"}}}, "watermark.key"),
    ({"sampling_params": {"watermark": {"enabled": False, "key": "ab"}}}, "watermark.key"),
    ({"sampling_params": {"watermark": {"key": "ab", "context_window": 5}}}, "watermark.context_window"),
    ({"sampling_params": {"watermark": {"key": "ab"}}, "watermark": {"key": "ab"}}, "watermark"),
    ({"sampling_params": {"watermark": {"shade": 1}}}, "watermark"),
])
def test_bad_watermark_is_a_400_naming_it(server, fields, name):
    response = generate(server, PROMPT_IDS, timeout=900, **fields)
    assert response.status_code == 400, response.text
    assert name in response.json()["error"]["message"] and "secret" not in response.text


def test_keys_are_not_shown(server):
    info = requests.get(server.url + "/get_server_info", timeout=60).json()
    assert info["enable_watermark"] is True and info["watermark_config"] == "<redacted>"
    assert SERVER_KEY not in str(info)
    _ids(server, sampling_params={"max_new_tokens": 2, "watermark": {"key": KEY}})
    assert "Receive: obj=" in server.output
    assert KEY not in server.output and SERVER_KEY not in server.output
