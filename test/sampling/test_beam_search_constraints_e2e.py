"""Beam search with grammars, stop text and min_new_tokens end to end, on one server on the
embedded SmolLM2: every beam of a regex / json_schema search matches it and the beams are
distinct; a stop string or stop_regex finishes the beams that hit it with their text cut at the
match (kept with no_stop_trim), and no beam that did not stop holds it; min_new_tokens holds
stop ids and stop text back on every beam; grammar beams beside plain requests change nobody's
tokens; masks that leave no token fail that request alone."""

from __future__ import annotations

import concurrent.futures
import json
import re

import jsonschema
import pytest

from engine_utils import generate_ok, running_server
from reliability_utils import wait_idle

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROMPT = "The three best things about living near the sea are"
REGEX = r"(yes|no|maybe)(, (really|truly))?\."
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["color", "count"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(gguf_path: str):
    with running_server("--model-path", gguf_path, "--constrained-json-disable-any-whitespace") as server:
        yield server


@pytest.fixture(scope="module")
def tokenizer(gguf_path: str):
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    return get_tokenizer(gguf_path)


def beams(result: dict) -> list[dict]:
    return result["meta_info"]["beam_results"]


def search(server, prompt: str = PROMPT, **params) -> dict:
    return generate_ok(server, prompt, sampling_params=params)


@pytest.mark.parametrize("width", [2, 4])
def test_regex_beams_all_match(server, width) -> None:
    result = search(server, beam_width=width, n=width, max_new_tokens=16, regex=REGEX)
    got = beams(result)
    assert len(got) == width
    assert len({tuple(b["output_ids"]) for b in got}) == width  # distinct beams
    for beam in got:
        assert beam["meta_info"]["finish_reason"]["type"] == "stop", beam
        assert re.fullmatch(REGEX, beam["text"]), beam["text"]
    assert result["text"] == got[0]["text"]


def test_json_schema_beams_all_validate(server) -> None:
    result = search(server, "Describe a ball as JSON:", beam_width=3, n=3, max_new_tokens=32,
                    json_schema=json.dumps(SCHEMA))
    got = beams(result)
    assert len(got) == 3 and len({tuple(b["output_ids"]) for b in got}) == 3
    for beam in got:
        assert beam["meta_info"]["finish_reason"]["type"] == "stop", beam
        jsonschema.validate(json.loads(beam["text"]), SCHEMA)


def _stop_text(server, tokenizer) -> tuple[str, int, list[int]]:
    """A stop string the free search's best beam writes with one of its first tokens (a word),
    that token's index, and the ids of that beam."""
    free = search(server, beam_width=3, n=3, max_new_tokens=8, ignore_eos=True, length_penalty=0.0)
    best = beams(free)[0]["output_ids"]
    for i in range(1, min(len(best), 6)):
        stop = tokenizer.decode(best[i : i + 1]).strip()
        if len(stop) >= 2 and stop.isalpha():
            return stop, i, best
    raise AssertionError(f"no word among the best beam's tokens: {tokenizer.decode(best)!r}")


@pytest.mark.parametrize("kind", ["stop", "stop_regex"])
def test_stop_text_finishes_beams_and_trims_their_text(server, tokenizer, kind) -> None:
    stop, _, _ = _stop_text(server, tokenizer)
    pattern = stop if kind == "stop" else re.escape(stop)
    result = search(server, beam_width=3, n=3, max_new_tokens=8, ignore_eos=True, length_penalty=0.0,
                    **{kind: [pattern]})
    got = beams(result)
    stopped = [b for b in got if b["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}]
    assert stopped, got
    for beam in got:
        full = tokenizer.decode(beam["output_ids"])
        if beam in stopped:
            assert stop in full and beam["text"] == full[: full.rfind(stop)]
            assert stop not in tokenizer.decode(beam["output_ids"][:-1])  # it stopped on the first step that held it
        else:
            assert stop not in full  # a beam holding the stop text would have finished there
    assert result["text"] == got[0]["text"]
    assert result["meta_info"]["finish_reason"] == got[0]["meta_info"]["finish_reason"]

    kept = search(server, beam_width=3, n=3, max_new_tokens=8, ignore_eos=True, length_penalty=0.0,
                  no_stop_trim=True, **{kind: [pattern]})
    for beam in beams(kept):
        assert beam["text"] == tokenizer.decode(beam["output_ids"])


def test_min_new_tokens_holds_every_beam(server, tokenizer) -> None:
    stop, i, best = _stop_text(server, tokenizer)
    body = dict(beam_width=3, n=3, max_new_tokens=8, ignore_eos=True, length_penalty=0.0,
                stop_token_ids=[best[i]], stop=[stop])
    short = beams(search(server, **body))
    hold = i + 3
    assert min(len(b["output_ids"]) for b in short) < hold  # without min_new_tokens a beam ends early
    held = beams(search(server, min_new_tokens=hold, **body))
    for beam in held:
        assert len(beam["output_ids"]) >= hold, beam
        assert best[i] not in beam["output_ids"][:hold]  # the stop id is masked until `hold` tokens


def test_grammar_beams_beside_plain_requests(server) -> None:
    bodies = [
        {"beam_width": 3, "n": 2, "max_new_tokens": 16, "regex": REGEX},
        {"temperature": 1.0, "sampling_seed": 5, "max_new_tokens": 12, "ignore_eos": True},
        {"beam_width": 2, "max_new_tokens": 8, "ignore_eos": True, "stop": [" sea"]},
        {"temperature": 0.0, "max_new_tokens": 12, "regex": r"[a-z ]{4,20}\."},
    ]
    alone = [search(server, **body) for body in bodies]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(lambda body: search(server, **body), bodies))
    for a, t in zip(alone, together):
        assert a["output_ids"] == t["output_ids"]
        assert [b["output_ids"] for b in a["meta_info"].get("beam_results", [])] == [
            b["output_ids"] for b in t["meta_info"].get("beam_results", [])
        ]
    wait_idle(server)


def test_a_beam_search_left_no_token_aborts_with_a_400_reason(server, tokenizer) -> None:
    """A grammar and allowed_token_ids that share no token: no beam can start (the request ends
    as a sampled one whose grammar allows nothing does)."""
    (no,) = tokenizer.encode("no", add_special_tokens=False)
    result = search(server, beam_width=2, max_new_tokens=4, regex="yes", allowed_token_ids=[no])
    reason = result["meta_info"]["finish_reason"]
    assert (reason["type"], reason["status_code"]) == ("abort", 400), reason
    assert "allow no next token" in reason["message"]
    assert result["output_ids"] == []
    wait_idle(server)
