"""Structured outputs on the OpenAI routes, end to end: the official openai client against the real
server on the embedded SmolLM2 (the session's `smollm_server`).

Every test checks the generated text itself (parses, validates against the schema, fully matches
the regex or grammar), not only the status. The model is tiny, so schemas bound every string and
array and prompts show the wanted shape: an unconstrained string or a loop could otherwise run
into max_tokens and leave the JSON unfinished, which is the model's weakness, not the grammar's.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.e2e

MODEL = "smollm"
MAX_TOKENS = 200  # enough for the JSON below to close (about 40 to 90 tokens)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "[A-Z][a-z]{1,8}"},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
        "address": {
            "type": "object",
            "properties": {"zip": {"type": "string", "pattern": "[0-9]{5}"}},
            "required": ["zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
    "additionalProperties": False,
}
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
PERSON_PROMPT = [{"role": "user", "content": "Describe a fictional person as JSON."}]

# A short answer keeps the streamed test cheap.
VERDICT = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no"]},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
    },
    "required": ["answer", "confidence"],
    "additionalProperties": False,
}
QUESTION = [{"role": "user", "content": "Is the sky blue? Answer as JSON."}]

# A worked example keeps the model's object short (unprompted, it repeats one key until max_tokens).
CAPITALS = [
    {"role": "system", "content": "You answer with one short JSON object."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": '{"capital": "Paris"}'},
    {"role": "user", "content": "What is the capital of Japan?"},
]


@pytest.fixture(scope="module")
def client(smollm_server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=smollm_server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


def _parsed(text: str, schema: dict[str, Any]) -> Any:
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


# ----------------------------------------------------------------------------- generation


@pytest.mark.parametrize(
    "sampling",
    [{"temperature": 0.0}, {"temperature": 1.0, "seed": 1234, "n": 2}],
    ids=["greedy", "seeded-sampling"],
)
def test_json_schema_outputs_validate(client: openai.OpenAI, sampling: dict[str, Any]) -> None:
    response = client.chat.completions.create(
        model=MODEL, messages=PERSON_PROMPT, response_format=PERSON_FORMAT, max_tokens=MAX_TOKENS, **sampling
    )
    assert len(response.choices) == sampling.get("n", 1)
    for choice in response.choices:
        # The grammar ends the request once the object is closed.
        assert choice.finish_reason == "stop", choice.message.content
        person = _parsed(choice.message.content, PERSON)
        assert 18 <= person["age"] <= 99 and len(person["tags"]) <= 2


def test_json_object_is_an_object_on_both_routes(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model=MODEL, messages=CAPITALS, response_format={"type": "json_object"}, max_tokens=120, temperature=0
    )
    completion = client.completions.create(
        model=MODEL,
        prompt='France as JSON: {"capital": "Paris", "continent": "Europe"}\nJapan as JSON:',
        max_tokens=120,
        temperature=0,
        extra_body={"response_format": {"type": "json_object"}},  # not in the client's signature
    )
    for text in (chat.choices[0].message.content, completion.choices[0].text):
        assert isinstance(json.loads(text), dict), text


def test_regex_fully_matches(client: openai.OpenAI) -> None:
    date = r"\d{4}-\d{2}-\d{2}"
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "When was the Eiffel Tower finished? Answer with a date."}],
        max_tokens=30,
        temperature=0,
        extra_body={"regex": date},
    )
    assert re.fullmatch(date, chat.choices[0].message.content), chat.choices[0].message.content
    answers = client.completions.create(
        model=MODEL,
        prompt="Is the sky blue? Answer:",
        max_tokens=10,
        temperature=1.0,
        seed=3,
        n=3,
        extra_body={"regex": "(yes|no|maybe)"},
    )
    for choice in answers.choices:
        assert re.fullmatch("(yes|no|maybe)", choice.text), choice.text


def test_ebnf_matches(client: openai.OpenAI) -> None:
    grammar = 'root ::= pet " x" count\npet ::= "cat" | "dog"\ncount ::= [1-9]'
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Pick a pet and a number."}],
        max_tokens=20,
        temperature=1.0,
        seed=5,
        n=2,
        extra_body={"ebnf": grammar},
    )
    for choice in response.choices:
        assert re.fullmatch(r"(cat|dog) x[1-9]", choice.message.content), choice.message.content
        assert choice.finish_reason == "stop"


def test_streamed_chat_deltas_join_into_valid_json(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        response_format={"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT}},
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # really streamed
    _parsed(text, VERDICT)


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    confidence: int = Field(ge=0, le=100)


def test_client_parse_helpers_get_parsed_objects(client: openai.OpenAI) -> None:
    """The client's parse() sends a strict json_schema built from a pydantic model (chat), or the
    Responses API's flat text.format; both come back parsed into the model."""
    chat = client.chat.completions.parse(
        model=MODEL, messages=QUESTION, response_format=Verdict, max_tokens=MAX_TOKENS, temperature=0
    )
    assert isinstance(chat.choices[0].message.parsed, Verdict)
    response = client.responses.parse(
        model=MODEL, input=QUESTION[0]["content"], text_format=Verdict, max_output_tokens=MAX_TOKENS, temperature=0
    )
    assert isinstance(response.output_parsed, Verdict)
    assert response.text.format.type == "json_schema"  # the format is echoed back


# ----------------------------------------------------------------------------- refusals


def _refused(call: Any, *words: str) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    assert caught.value.status_code == 400
    message = caught.value.message
    for word in words:
        assert word in message, message
    return caught.value


def _chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    return lambda: client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, **kwargs)


@pytest.mark.parametrize("stream", [False, True])
def test_invalid_schema_is_a_400_naming_response_format(client: openai.OpenAI, stream: bool) -> None:
    bad_type = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
    error = _refused(_chat(client, response_format=bad_type, stream=stream), "response_format", "nope")
    assert error.param == "response_format"
    # A keyword the grammar would silently ignore is refused too, not left unenforced.
    ignored = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "not": {}}}}
    _refused(_chat(client, response_format=ignored, stream=stream), "response_format", "'not'")


def test_unknown_or_malformed_response_format_is_a_400(client: openai.OpenAI) -> None:
    _refused(_chat(client, response_format={"type": "xml"}), "response_format", "'json_object', 'json_schema'")
    no_name = {"type": "json_schema", "json_schema": {"schema": VERDICT}}
    _refused(_chat(client, response_format=no_name), "response_format", "name")
    no_body = lambda: client.completions.create(  # noqa: E731
        model=MODEL, prompt="x", max_tokens=4, extra_body={"response_format": {"type": "json"}}
    )
    _refused(no_body, "response_format", "'structural_tag'")


def test_response_format_with_another_grammar_is_a_400(client: openai.OpenAI) -> None:
    json_object = {"type": "json_object"}
    _refused(_chat(client, response_format=json_object, extra_body={"regex": "a+"}), "response_format", "regex")
    _refused(_chat(client, response_format=json_object, extra_body={"ebnf": 'root ::= "a"'}), "response_format", "ebnf")
    both = lambda: client.completions.create(  # noqa: E731
        model=MODEL, prompt="x", max_tokens=4, extra_body={"response_format": json_object, "json_schema": "{}"}
    )
    _refused(both, "response_format", "json_schema")


def test_responses_invalid_text_format_is_a_400(client: openai.OpenAI) -> None:
    bad = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}
    error = _refused(lambda: client.responses.create(model=MODEL, input="x", text=bad), "text", "nope")
    assert error.param == "text"
