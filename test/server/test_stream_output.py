"""--stream-output on the real server (embedded SmolLM2): SGLang's disjoint streaming. Each
streamed chunk's output_ids holds only the ids new since the previous chunk, so the chunks
concatenate to the non-streamed output; "text" stays cumulative (as in SGLang 0.5), and
non-streamed answers are unchanged."""

from __future__ import annotations

import itertools

import pytest

from flag_helpers import CHAT_SHORT, PROMPT, post_ok, stream
from sglang.srt.server_args import ServerArgs, prepare_server_args

pytestmark = pytest.mark.e2e

pytest_plugins = ["flag_servers"]  # one set of servers for the flag tests of a session


@pytest.fixture(scope="module")
def streaming(flag_servers):
    return flag_servers["stream"]


@pytest.fixture(scope="module")
def plain(flag_servers):
    return flag_servers["plain"]


def _body(text, n: int = 8, **fields):
    return {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": n}, **fields}


@pytest.mark.parametrize("text", [PROMPT, CHAT_SHORT])
def test_chunks_concatenate_to_the_non_streamed_output(streaming, plain, text) -> None:
    whole = post_ok(streaming, "/generate", _body(text))
    assert whole["output_ids"] == post_ok(plain, "/generate", _body(text))["output_ids"]  # not a delta
    chunks = stream(streaming, "/generate", _body(text))
    assert len(chunks) > 1 and all(chunk["output_ids"] for chunk in chunks)
    assert [i for chunk in chunks for i in chunk["output_ids"]] == whole["output_ids"]
    # meta_info counts and text stay cumulative.
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == list(itertools.accumulate(len(c["output_ids"]) for c in chunks))
    for before, after in zip(chunks, chunks[1:]):
        assert after["text"].startswith(before["text"])
    assert chunks[-1]["text"] == whole["text"]
    assert chunks[-1]["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]


def test_without_the_flag_streamed_ids_are_cumulative(plain) -> None:
    chunks = stream(plain, "/generate", _body(PROMPT, 5))
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4, 5]


def test_each_input_of_a_batch_concatenates_to_its_own_output(streaming) -> None:
    body = _body([PROMPT, "Once upon a time"], 5)
    wholes = post_ok(streaming, "/generate", body)
    by_index: dict[int, list[int]] = {}
    for chunk in stream(streaming, "/generate", body):
        by_index.setdefault(chunk["index"], []).extend(chunk["output_ids"])
    assert [by_index[i] for i in range(2)] == [w["output_ids"] for w in wholes]


def test_openai_streaming_is_unchanged(streaming, plain) -> None:
    body = {"model": "x", "prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    pieces = [c["choices"][0]["text"] for c in stream(streaming, "/v1/completions", body) if c.get("choices")]
    assert "".join(pieces) == post_ok(plain, "/v1/completions", body)["choices"][0]["text"]


def test_flag_parses_into_server_args() -> None:
    assert ServerArgs().stream_output is False
    args = prepare_server_args(["--stream-output"])
    assert args.stream_output and args.ignored_flags == []
