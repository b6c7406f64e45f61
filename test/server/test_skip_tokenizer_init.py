"""--skip-tokenizer-init on the real server (embedded SmolLM2): no process loads a tokenizer
(the server runs with a --tokenizer-path that does not exist), requests carry input_ids, and the
answers are SGLang's token-only ones: output_ids and meta_info, no "text"; the tokens are those a
normal server returns for the same ids. What needs a tokenizer is a 400 naming it."""

from __future__ import annotations

import os

import pytest

import requests

from flag_helpers import CHAT_SHORT, EOS, PROMPT, post, post_ok, stream, token_ids
from sglang.srt.server_args import ServerArgs, prepare_server_args

pytestmark = pytest.mark.e2e

pytest_plugins = ["flag_servers"]  # one set of servers for the flag tests of a session


@pytest.fixture(scope="module")
def skip(flag_servers):
    return flag_servers["skip"]


@pytest.fixture(scope="module")
def plain(flag_servers):
    return flag_servers["plain"]


def _greedy(n: int, **params):
    return {"temperature": 0, "max_new_tokens": n, **params}


def test_no_tokenizer_was_loaded(skip) -> None:
    info = post_ok(skip, "/generate", {"input_ids": [1, 2, 3], "sampling_params": _greedy(1)})
    assert info["meta_info"]["completion_tokens"] == 1
    server_info = requests.get(skip.url + "/get_server_info", timeout=30).json()
    assert server_info["skip_tokenizer_init"] is True
    assert not os.path.exists(server_info["tokenizer_path"])  # loading it anywhere would have failed the start


def test_greedy_output_ids_equal_a_normal_servers(skip, plain) -> None:
    ids = token_ids(plain, PROMPT)
    body = {"input_ids": ids, "sampling_params": _greedy(8)}
    ours, reference = post_ok(skip, "/generate", body), post_ok(plain, "/generate", body)
    assert "text" not in ours and set(ours) == {"output_ids", "meta_info"}
    assert ours["output_ids"] == reference["output_ids"] and len(ours["output_ids"]) == 8
    for key in ("finish_reason", "prompt_tokens", "completion_tokens"):
        assert ours["meta_info"][key] == reference["meta_info"][key]
    # The normal server's text request gives the same tokens: input_ids are what it tokenizes to.
    assert post_ok(plain, "/generate", {"text": PROMPT, "sampling_params": _greedy(8)})["output_ids"] == ours["output_ids"]


def test_eos_of_the_model_config_stops(skip, plain) -> None:
    body = {"input_ids": token_ids(plain, CHAT_SHORT), "sampling_params": _greedy(32)}
    ours, reference = post_ok(skip, "/generate", body), post_ok(plain, "/generate", body)
    assert reference["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
    assert ours["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
    assert ours["output_ids"] == reference["output_ids"] and ours["output_ids"][-1] == EOS


def test_stop_token_ids_stop(skip, plain) -> None:
    ids = token_ids(plain, PROMPT)
    full = post_ok(skip, "/generate", {"input_ids": ids, "sampling_params": _greedy(8)})["output_ids"]
    stop = full[3]
    out = post_ok(skip, "/generate", {"input_ids": ids, "sampling_params": _greedy(8, stop_token_ids=[stop])})
    assert out["output_ids"] == full[: full.index(stop) + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_streamed_chunks_carry_output_ids_and_no_text(skip, plain) -> None:
    body = {"input_ids": token_ids(plain, PROMPT), "sampling_params": _greedy(6)}
    chunks = stream(skip, "/generate", body)
    assert chunks and all("text" not in c and "output_ids" in c for c in chunks)
    # Without --stream-output the ids are cumulative, the last chunk the whole output.
    for before, after in zip(chunks, chunks[1:]):
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
    assert chunks[-1]["output_ids"] == post_ok(skip, "/generate", body)["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 6}


def test_batch_of_input_ids(skip, plain) -> None:
    batch = [token_ids(plain, PROMPT), token_ids(plain, "Once upon a time")]
    outs = post_ok(skip, "/generate", {"input_ids": batch, "sampling_params": _greedy(4)})
    singles = [post_ok(plain, "/generate", {"input_ids": ids, "sampling_params": _greedy(4)}) for ids in batch]
    assert [o["output_ids"] for o in outs] == [s["output_ids"] for s in singles]
    assert all("text" not in o for o in outs)


def test_logprob_texts_are_null(skip, plain) -> None:
    body = {
        "input_ids": token_ids(plain, PROMPT), "sampling_params": _greedy(3),
        "return_logprob": True, "top_logprobs_num": 2, "return_text_in_logprobs": True,
    }
    meta = post_ok(skip, "/generate", body)["meta_info"]
    reference = post_ok(plain, "/generate", body)["meta_info"]
    assert [row[1] for row in meta["output_token_logprobs"]] == [row[1] for row in reference["output_token_logprobs"]]
    assert [row[0] for row in meta["output_token_logprobs"]] == pytest.approx(
        [row[0] for row in reference["output_token_logprobs"]], abs=1e-4
    )
    assert all(row[2] is None for row in meta["output_token_logprobs"])
    assert all(entry[2] is None for top in meta["output_top_logprobs"] for entry in top)
    assert all(isinstance(row[2], str) for row in reference["output_token_logprobs"])


@pytest.mark.parametrize("body", [{"text": PROMPT}, {"text": [PROMPT, "hi"]}])
def test_text_is_a_400_naming_the_flag(skip, body) -> None:
    response = post(skip, "/generate", body)
    assert response.status_code == 400
    assert "--skip-tokenizer-init" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "params, name",
    [({"stop": "Paris"}, "stop="), ({"stop_regex": "P.*s"}, "stop_regex="), ({"min_new_tokens": 2}, "min_new_tokens=")],
)
def test_what_needs_a_tokenizer_is_a_400_naming_the_parameter(skip, params, name) -> None:
    response = post(skip, "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, **params}})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert message.startswith(name) and "skip_tokenizer_init" in message


@pytest.mark.parametrize(
    "path, body",
    [
        ("/tokenize", {"prompt": "hi"}),
        ("/v1/tokenize", {"prompt": "hi"}),
        ("/detokenize", {"tokens": [1, 2]}),
        ("/v1/detokenize", {"tokens": [1, 2]}),
        ("/v1/completions", {"model": "x", "prompt": [1, 2, 3], "max_tokens": 2}),
        ("/v1/chat/completions", {"model": "x", "messages": [{"role": "user", "content": "hi"}]}),
    ],
)
def test_routes_that_need_a_tokenizer_are_a_400_naming_the_flag(skip, path, body) -> None:
    response = post(skip, path, body)
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert path in message and "--skip-tokenizer-init" in message


def test_other_routes_still_answer(skip) -> None:
    assert requests.get(skip.url + "/v1/models", timeout=30).status_code == 200
    assert requests.get(skip.url + "/health", timeout=30).status_code == 200


def test_flag_parses_into_server_args(tmp_path) -> None:
    args = prepare_server_args(["--skip-tokenizer-init"])
    assert args.skip_tokenizer_init and args.ignored_flags == []
    assert ServerArgs().skip_tokenizer_init is False
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    with pytest.raises(ValueError, match="--chat-template needs a tokenizer.*--skip-tokenizer-init"):
        ServerArgs(skip_tokenizer_init=True, chat_template=str(template)).validate()


def test_offline_engine_without_a_tokenizer(plain, tmp_path) -> None:
    import sglang as sgl

    ids = token_ids(plain, PROMPT)
    reference = post_ok(plain, "/generate", {"input_ids": ids, "sampling_params": _greedy(6)})
    with sgl.Engine(skip_tokenizer_init=True, tokenizer_path=str(tmp_path / "missing"), log_level="warning") as llm:
        out = llm.generate(input_ids=ids, sampling_params=_greedy(6))
        with pytest.raises(ValueError, match="--skip-tokenizer-init"):
            llm.generate(PROMPT, _greedy(2))
    assert "text" not in out and out["output_ids"] == reference["output_ids"]
