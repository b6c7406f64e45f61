"""Each --tool-call-parser format: a whole output's content and calls, and the same output streamed
in pieces cut at awkward places (inside markers, names, strings, escapes) adding up to it."""

from __future__ import annotations

import json
import random

import pytest

from sglang.srt.function_call import TOOL_CALL_PARSERS, ToolCallParser, get_detector, json_array_detector, parse_tool_calls
from sglang.srt.function_call.parser import merge_deltas

WEATHER = {"city": "Paris", "note": "say \"hi\" {not: json} \\ [x]", "days": 3, "metric": True}
TIME = {"zone": "C,E]T"}

DS_CALL = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"

CASES = {
    "hermes": (
        "Let me check.\n<tool_call>\n"
        + json.dumps({"name": "get_weather", "arguments": WEATHER})
        + "\n</tool_call>\n<tool_call>\n"
        + json.dumps({"name": "get_time", "arguments": TIME})
        + "\n</tool_call>",
        "Let me check.",
    ),
    "llama3": (
        "<|python_tag|>"
        + json.dumps({"name": "get_weather", "parameters": WEATHER})
        + "; "
        + json.dumps({"name": "get_time", "parameters": TIME}),
        "",
    ),
    "mistral": (
        "Sure [TOOL_CALLS] "
        + json.dumps([{"name": "get_weather", "arguments": WEATHER}, {"name": "get_time", "arguments": TIME}]),
        "Sure",
    ),
    "deepseekv3": (
        "Checking<｜tool▁calls▁begin｜>"
        + DS_CALL.format(name="get_weather", args=json.dumps(WEATHER))
        + "\n"
        + DS_CALL.format(name="get_time", args=json.dumps(TIME))
        + "<｜tool▁calls▁end｜>",
        "Checking",
    ),
    "pythonic": (
        '[get_weather(city="Paris", note="say \\"hi\\" {not: json} \\\\ [x]", days=3, metric=True), get_time(zone="C,E]T")]',
        "",
    ),
}


def stream(parser_name: str, pieces: list[str]) -> tuple[str, list]:
    parser = ToolCallParser(get_detector(parser_name))
    results = [parser.feed(p) for p in pieces] + [parser.finish()]
    deltas = [d for r in results for d in r.calls]
    # OpenAI's shape: a call's first delta names it, later ones only add argument text.
    seen: set[int] = set()
    for delta in deltas:
        assert (delta.name is not None) == (delta.index not in seen)
        seen.add(delta.index)
    return "".join(r.text for r in results), merge_deltas(deltas)


def cut(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    points = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 40))))
    return [text[a:b] for a, b in zip([0] + points, points + [len(text)])]


@pytest.mark.parametrize("name", sorted(CASES))
def test_whole_output_parses_into_content_and_calls(name: str) -> None:
    text, content = CASES[name]
    got_content, calls = parse_tool_calls(get_detector(name), text)
    assert got_content == content
    assert [(c.index, c.name) for c in calls] == [(0, "get_weather"), (1, "get_time")]
    assert [json.loads(c.arguments) for c in calls] == [WEATHER, TIME]


@pytest.mark.parametrize("name", sorted(CASES))
def test_streamed_pieces_add_up_to_the_whole_parse(name: str) -> None:
    text, _ = CASES[name]
    whole = parse_tool_calls(get_detector(name), text)
    assert stream(name, list(text)) == whole  # one character at a time
    for seed in range(20):
        assert stream(name, cut(text, seed)) == whole


@pytest.mark.parametrize("name", sorted(CASES))
def test_text_without_calls_is_all_content(name: str) -> None:
    for text in ("The weather is fine.", "  spaced out  \n", "a < b and [c] or {d}", ""):
        assert parse_tool_calls(get_detector(name), text) == (text, [])
        assert stream(name, list(text)) == (text, [])


def test_a_partial_marker_is_held_back_until_it_is_known() -> None:
    parser = ToolCallParser(get_detector("hermes"))
    assert parser.feed("Hi <tool_").text == "Hi"
    assert parser.feed("box>").text == " <tool_box>"
    assert parser.finish().text == ""


def test_names_come_whole_and_arguments_stream() -> None:
    parser = ToolCallParser(get_detector("hermes"))
    assert parser.feed('<tool_call>{"name": "get_w').calls == []
    first = parser.feed('eather", "arguments": {"ci').calls
    assert [(d.index, d.name, d.arguments) for d in first] == [(0, "get_weather", '{"ci')]
    second = parser.feed('ty": "Rome"}}</tool_call>').calls
    assert [(d.index, d.name, d.arguments) for d in second] == [(0, None, 'ty": "Rome"}')]


def test_a_call_without_arguments_has_an_empty_object() -> None:
    _, calls = parse_tool_calls(get_detector("hermes"), '<tool_call>{"name": "now"}</tool_call>')
    assert [(c.name, c.arguments) for c in calls] == [("now", "{}")]


def test_the_forced_json_array_parses_like_the_others() -> None:
    text = json.dumps([{"name": "get_weather", "parameters": WEATHER}, {"name": "get_time", "parameters": TIME}])
    content, calls = parse_tool_calls(json_array_detector(), text)
    assert content == "" and [json.loads(c.arguments) for c in calls] == [WEATHER, TIME]
    for seed in range(10):
        parser = ToolCallParser(json_array_detector())
        results = [parser.feed(p) for p in cut(text, seed)] + [parser.finish()]
        assert merge_deltas([d for r in results for d in r.calls]) == calls


def test_sglang_parser_names_are_registered() -> None:
    assert {"hermes", "qwen25", "qwen", "llama3", "mistral", "deepseekv3", "pythonic"} <= set(TOOL_CALL_PARSERS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_structure_info_wraps_arguments_the_way_the_parser_reads_them(name: str) -> None:
    info = get_detector(name).structure_info("get_time")
    if name == "pythonic":
        return  # no JSON arguments object in this format
    text = info.begin + json.dumps(TIME) + info.end
    assert text.find(info.trigger) != -1
    _, calls = parse_tool_calls(get_detector(name), text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_time", TIME)]
