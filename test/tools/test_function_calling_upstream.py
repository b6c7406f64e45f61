"""Ports of SGLang's test/srt/openai_server/function_call/: test_openai_function_calling.py,
test_tool_choice.py, test_parallel_tool_calls.py and test_responses_function_calling.py, on the
shared tools server (SmolLM2, `--tool-call-parser llama3`, upstream_servers).

What holds on any model is checked as upstream checks it: tool_choice "required" or a named
function always yields calls (the grammar forces them), named calls carry that name, streamed
arguments concatenate to JSON of the schema, n > 1 streams finish each choice, tool_choice "none"
yields no calls, parallel_tool_calls false yields one call. Whether a 135M model decides to call
a tool under "auto", picks the right one among several, or fills in the right city / numbers is
the model's quality: those assertions are kept as skipped originals marked "depends on model
quality", and the model-independent core (any calls are well-formed, of declared tools) runs.

Scaled: max_tokens 2048 / 400 / 200 becomes 256 where a call is forced (enough for it to close)
and 64 or 10 elsewhere;
/v1/responses requests get max_output_tokens 32 (upstream leaves it to the context).
test_tool_choice's Qwen2.5 and Mistral classes send the same requests with the qwen25 and mistral
parsers: the forced modes do not use the parser, and under "auto" the check is model-independent,
so the Llama-3.2 class stands for the three. test_parallel_tool_calls (Qwen3-8B, qwen parser)
runs its forced half here; its "auto" half depends on the model deciding to call both tools.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from upstream_helpers import openai_client, served_model

pytestmark = pytest.mark.e2e

pytest_plugins = ["upstream_servers"]

FORCED_TOKENS = 256  # a forced call closes well within this, sampled whitespace included
MODEL_QUALITY = "depends on model quality: a 135M model does not decide to call tools (or pick the right one) as Llama-3.2 does"

SYSTEM_MESSAGE = (
    "You are a helpful assistant with tool calling capabilities. "
    "Only reply with a tool call if the function exists in the library provided by the user. "
    "If it doesn't exist, just reply directly in natural language. "
    "When you receive a tool call response, use the output to format an answer to the original user question. "
    "You have access to the following functions. "
    "To call a function, please respond with JSON for a function call. "
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. '
    "Do not use variables.\n\n"
)


def function(name: str, description: str, properties: dict, required: list[str], strict: bool = False) -> dict:
    properties = {key: _bounded(prop) for key, prop in properties.items()}
    spec = {"name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required}}
    if strict:
        spec["strict"] = True
    return {"type": "function", "function": spec}


def _bounded(prop: dict) -> dict:
    """Bounded values (upstream's are unbounded): a 135M model sampling at temperature 0.8 can write
    digits or characters until max_tokens, where upstream's models close the value."""
    if prop.get("type") == "string" and "enum" not in prop:
        return {"maxLength": 40, **prop}
    if prop.get("type") == "integer":
        return {"minimum": -1000000, "maximum": 1000000, **prop}
    return prop


INT = {"type": "integer", "description": "A number"}
NAME = {"type": "string"}
ADD_LOOSE = function("add", "Compute the sum of two numbers", {"a": {"type": "int"}, "b": {"type": "int"}}, ["a", "b"])
ADD_STRICT = function("add", "Compute the sum of two integers", {"a": INT, "b": INT}, ["a", "b"], strict=True)
SUB = function("sub", "Compute the difference of two integers", {"int_a": INT, "int_b": INT}, ["int_a", "int_b"], strict=True)
CITY_WEATHER = function("get_weather", "use this to get latest weather information for a city given its name",
                        {"city": {**NAME, "description": "name of the city to get weather for"}}, ["city"])
UNIT = {"type": "string", "enum": ["celsius", "fahrenheit"]}
CURRENT_WEATHER = function("get_current_weather", "Get the current weather in a given location",
                           {"city": NAME, "unit": UNIT}, ["city", "unit"])
LOCATION_WEATHER = function("get_current_weather", "Get the current weather in a given location",
                            {"location": NAME, "unit": UNIT}, ["location"])


@pytest.fixture(scope="module")
def client(upstream_tools_server) -> openai.OpenAI:
    return openai_client(upstream_tools_server)


@pytest.fixture(scope="module")
def model(upstream_tools_server) -> str:
    return served_model(upstream_tools_server)


def declared(tools: list[dict]) -> dict[str, dict]:
    return {t["function"]["name"]: t["function"]["parameters"] for t in tools}


def check_well_formed(calls, tools: list[dict]) -> None:
    """Every call names a declared tool and its arguments are a JSON object."""
    schemas = declared(tools)
    for call in calls or []:
        assert call.function.name in schemas, call
        assert isinstance(json.loads(call.function.arguments), dict), call


def check_schema(calls, tools: list[dict]) -> None:
    schemas = declared(tools)
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def collect(stream) -> tuple[list, list]:
    """All chunks, and the tool-call deltas of choice 0."""
    chunks = list(stream)
    deltas = [d for c in chunks if c.choices and c.choices[0].delta.tool_calls for d in c.choices[0].delta.tool_calls]
    return chunks, deltas


def last_finish(chunks) -> str | None:
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return reasons[-1] if reasons else None


# ------------------------------------------------------------ test_openai_function_calling.py

FORMAT_MESSAGES = [{"role": "system", "content": SYSTEM_MESSAGE}, {"role": "user", "content": "Compute (3+5)"}]
PARIS_MESSAGES = [{"role": "system", "content": SYSTEM_MESSAGE},
                  {"role": "user", "content": "What is the temperature in Paris in celsius??"}]
SUM_MESSAGES = [{"role": "system", "content": SYSTEM_MESSAGE},
                {"role": "user", "content": "Please sum 5 and 7, just call the function."}]
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def test_function_calling_format(client, model) -> None:
    response = client.chat.completions.create(model=model, max_tokens=64, messages=FORMAT_MESSAGES, temperature=0.8,
                                              top_p=0.8, tools=[ADD_LOOSE])
    check_well_formed(response.choices[0].message.tool_calls, [ADD_LOOSE])


@pytest.mark.skip(reason=MODEL_QUALITY)
def test_function_calling_format_original(client, model) -> None:
    response = client.chat.completions.create(model=model, max_tokens=2048, messages=FORMAT_MESSAGES, temperature=0.8,
                                              top_p=0.8, tools=[ADD_LOOSE])
    calls = response.choices[0].message.tool_calls
    assert isinstance(calls, list) and calls and calls[0].function.name == "add"


def test_function_calling_streaming_simple(client, model) -> None:
    chunks, deltas = collect(client.chat.completions.create(
        model=model, max_tokens=64, messages=PARIS_MESSAGES, temperature=0.8, top_p=0.8, stream=True,
        tools=[CURRENT_WEATHER]))
    assert chunks
    assert all(d.function.name in (None, "get_current_weather") for d in deltas)
    assert last_finish(chunks) in (("tool_calls",) if deltas else ("stop", "length"))


@pytest.mark.skip(reason=MODEL_QUALITY)
def test_function_calling_streaming_simple_original(client, model) -> None:
    chunks, deltas = collect(client.chat.completions.create(
        model=model, max_tokens=2048, messages=PARIS_MESSAGES, temperature=0.8, top_p=0.8, stream=True,
        tools=[CURRENT_WEATHER]))
    assert any(d.function.name == "get_current_weather" for d in deltas)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_function_calling_streaming_args_parsing(client, model) -> None:
    """Forced to the strict tool (named tool_choice, the model-independent core): the streamed
    fragments concatenate to JSON with integer a and b, and the stream ends with tool_calls."""
    chunks, deltas = collect(client.chat.completions.create(
        model=model, max_tokens=FORCED_TOKENS, messages=SUM_MESSAGES, temperature=0.9, top_p=0.9, stream=True, tools=[ADD_STRICT],
        tool_choice={"type": "function", "function": {"name": "add"}}))
    names = [d.function.name for d in deltas if d.function.name]
    assert names[:1] == ["add"]
    args = json.loads("".join(d.function.arguments or "" for d in deltas if d.index == 0))
    assert isinstance(args["a"], int) and isinstance(args["b"], int)
    assert last_finish(chunks) == "tool_calls"


@pytest.mark.skip(reason=MODEL_QUALITY)
def test_function_calling_streaming_args_parsing_original(client, model) -> None:
    chunks, deltas = collect(client.chat.completions.create(
        model=model, max_tokens=2048, messages=SUM_MESSAGES, temperature=0.9, top_p=0.9, stream=True, tools=[ADD_STRICT]))
    args = json.loads("".join(d.function.arguments or "" for d in deltas))
    assert (str(args["a"]), str(args["b"])) == ("5", "7")
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_function_call_strict(client, model) -> None:
    messages = [{"role": "user", "content": "Please compute 5 - 7, using your tool."}]
    response = client.chat.completions.create(model=model, max_tokens=64, messages=messages, temperature=0.8,
                                              top_p=0.8, tools=[SUB])
    # Under auto the grammar starts at llama3's <|python_tag|> trigger; a bare-JSON call (which the
    # llama3 parser also reads) is unconstrained, so only its form is checked.
    check_well_formed(response.choices[0].message.tool_calls, [SUB])


@pytest.mark.skip(reason=MODEL_QUALITY)
def test_function_call_strict_original(client, model) -> None:
    messages = [{"role": "user", "content": "Please compute 5 - 7, using your tool."}]
    response = client.chat.completions.create(model=model, max_tokens=2048, messages=messages, temperature=0.8,
                                              top_p=0.8, tools=[SUB])
    call = response.choices[0].message.tool_calls[0]
    args = json.loads(call.function.arguments)
    assert call.function.name == "sub" and (str(args["int_a"]), str(args["int_b"])) == ("5", "7")


def test_function_call_required(client, model) -> None:
    response = client.chat.completions.create(model=model, max_tokens=FORCED_TOKENS, messages=FRANCE, temperature=0.8, top_p=0.8,
                                              tools=[SUB, CITY_WEATHER], tool_choice="required", parallel_tool_calls=False)
    calls = response.choices[0].message.tool_calls
    assert calls
    check_schema(calls, [SUB, CITY_WEATHER])


@pytest.mark.skip(reason=MODEL_QUALITY)
def test_function_call_required_original(client, model) -> None:
    response = client.chat.completions.create(model=model, max_tokens=2048, messages=FRANCE, temperature=0.8,
                                              top_p=0.8, tools=[SUB, CITY_WEATHER], tool_choice="required")
    call = response.choices[0].message.tool_calls[0]
    city = json.loads(call.function.arguments)["city"]
    assert call.function.name == "get_weather" and ("Paris" in city or "France" in city)


def test_function_call_specific(client, model) -> None:
    response = client.chat.completions.create(
        model=model, max_tokens=FORCED_TOKENS, messages=FRANCE, temperature=0.8, top_p=0.8, tools=[SUB, CITY_WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = response.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    assert "city" in json.loads(calls[0].function.arguments)


def test_streaming_multiple_choices_finish_reason(client, model) -> None:
    chunks = list(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is the weather like in Los Angeles?"}], max_tokens=FORCED_TOKENS,
        temperature=0.8, stream=True, tools=[LOCATION_WEATHER], tool_choice="required", parallel_tool_calls=False, n=2))
    finishes: dict[int, list[str]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.finish_reason is not None:
                finishes.setdefault(choice.index, []).append(choice.finish_reason)
    assert sorted(finishes) == [0, 1]
    assert all(reasons[-1] == "tool_calls" for reasons in finishes.values()), finishes


def _no_tool_call_stream(client, model, max_tokens: int) -> list:
    chunks = list(client.chat.completions.create(
        model=model, max_tokens=max_tokens, messages=[{"role": "user", "content": "Who are you?"}], temperature=0.8,
        top_p=0.8, stream=True, tools=[CURRENT_WEATHER], tool_choice="none"))
    assert chunks
    assert all(c.choices[0].delta.tool_calls is None for c in chunks if c.choices)
    return chunks


def test_function_calling_streaming_no_tool_call(client, model) -> None:
    """tool_choice none: no tool-call deltas, and the stream ends as a plain answer does."""
    chunks = _no_tool_call_stream(client, model, 64)
    assert last_finish(chunks) in ("stop", "length")


@pytest.mark.skip(reason="depends on model quality: the answer ends (stop) before max_tokens")
def test_function_calling_streaming_no_tool_call_original(client, model) -> None:
    assert _no_tool_call_stream(client, model, 2048)[-1].choices[0].finish_reason == "stop"


def test_streaming_multiple_choices_without_tools(client, model) -> None:
    chunks = list(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello in one word."}], temperature=0.8, stream=True,
        max_tokens=10, n=2))
    finishes: dict[int, list[str]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.finish_reason is not None:
                finishes.setdefault(choice.index, []).append(choice.finish_reason)
    assert sorted(finishes) == [0, 1]
    assert all(reasons[-1] in ("stop", "length") for reasons in finishes.values())


@pytest.mark.skip(reason=MODEL_QUALITY + " (TestOpenAIPythonicFunctionCalling: the model must write a python list "
                                        "of calls under tool_choice auto, on a --tool-call-parser pythonic server)")
@pytest.mark.parametrize("case", ["test_pythonic_tool_call_prompt", "test_pythonic_tool_call_streaming"])
def test_pythonic_function_calling(case: str) -> None:
    raise AssertionError(case)


# ------------------------------------------------------------------------ test_tool_choice.py

TOOL_CHOICE_TOOLS = [
    function("get_weather", "use this to get latest weather information for a city given its name",
             {"city": {"type": "string", "description": "name of the city to get weather for"},
              "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"]),
    function("get_pokemon_info", "get detailed information about a pokemon given its name",
             {"name": {"type": "string", "description": "name of the pokemon to get info for"}}, ["name"]),
    function("make_next_step_decision", "Respond with the next step to take, based on the traces.",
             {"decision": {"type": "string"}, "content": {"type": "string"}}, ["decision", "content"]),
]
TOOL_CHOICE_MESSAGES = [{"role": "user", "content": (
    "Answer the following questions as best you can:\n\nYou will be given a trace of thinking process in the "
    "following format.\n\nQuestion: the input question you must answer\nTOOL: think about what to do, and choose a "
    "tool to use ONLY IF there are defined tools\nOBSERVATION: the result of the tool call\nANSWER: the answer\n\n"
    "Question: what is the weather in top 5 populated cities in the US in celsius?\n\nTraces:\n\n\n"
)}]
TRAVEL_TOOLS = [
    function("get_weather", "Get the current weather for a given location.",
             {"location": {"type": "string", "description": "The name of the city or location."},
              "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["location"]),
    function("get_tourist_attractions", "Get a list of top tourist attractions for a given city.",
             {"city": {"type": "string", "description": "The name of the city to find attractions for."}}, ["city"]),
]
TRAVEL_MESSAGES = [
    {"role": "system", "content": "You are a travel assistant providing real-time weather updates and top tourist attractions."},
    {"role": "user", "content": "I'm planning a trip to Tokyo next week. What's the weather like? What are the most amazing sights?"},
]
GET_WEATHER = {"type": "function", "function": {"name": "get_weather"}}


def test_tool_choice_auto_non_streaming(client, model) -> None:
    response = client.chat.completions.create(model=model, messages=TOOL_CHOICE_MESSAGES, max_tokens=64,
                                              tools=TOOL_CHOICE_TOOLS, tool_choice="auto")
    assert response.choices[0].message is not None
    check_well_formed(response.choices[0].message.tool_calls, TOOL_CHOICE_TOOLS)


def test_tool_choice_auto_streaming(client, model) -> None:
    chunks, deltas = collect(client.chat.completions.create(
        model=model, messages=TOOL_CHOICE_MESSAGES, max_tokens=64, tools=TOOL_CHOICE_TOOLS, tool_choice="auto",
        stream=True))
    assert chunks and isinstance(deltas, list)


def test_tool_choice_required_non_streaming(client, model) -> None:
    response = client.chat.completions.create(model=model, messages=TOOL_CHOICE_MESSAGES, max_tokens=FORCED_TOKENS,
                                              temperature=0.2, tools=TOOL_CHOICE_TOOLS, tool_choice="required", parallel_tool_calls=False)
    calls = response.choices[0].message.tool_calls
    assert calls
    check_well_formed(calls, TOOL_CHOICE_TOOLS)


def test_tool_choice_required_streaming(client, model) -> None:
    _, deltas = collect(client.chat.completions.create(
        model=model, messages=TOOL_CHOICE_MESSAGES, max_tokens=FORCED_TOKENS, tools=TOOL_CHOICE_TOOLS, tool_choice="required", parallel_tool_calls=False,
        stream=True))
    assert deltas


def test_tool_choice_specific_function_non_streaming(client, model) -> None:
    response = client.chat.completions.create(model=model, messages=TOOL_CHOICE_MESSAGES, max_tokens=FORCED_TOKENS,
                                              tools=TOOL_CHOICE_TOOLS, tool_choice=GET_WEATHER)
    calls = response.choices[0].message.tool_calls
    assert calls and all(call.function.name == "get_weather" for call in calls)


def test_tool_choice_specific_function_streaming(client, model) -> None:
    _, deltas = collect(client.chat.completions.create(
        model=model, messages=TOOL_CHOICE_MESSAGES, max_tokens=FORCED_TOKENS, tools=TOOL_CHOICE_TOOLS, tool_choice=GET_WEATHER,
        stream=True))
    assert deltas
    assert next(d.function.name for d in deltas if d.function and d.function.name) == "get_weather"


def test_multi_tool_scenario_auto(client, model) -> None:
    """Upstream's flaky-model branch (Llama-3.2's): any calls name the travel tools."""
    response = client.chat.completions.create(model=model, messages=TRAVEL_MESSAGES, max_tokens=64, temperature=0.2,
                                              tools=TRAVEL_TOOLS, tool_choice="auto")
    assert response.choices[0].message is not None
    check_well_formed(response.choices[0].message.tool_calls, TRAVEL_TOOLS)


def test_multi_tool_scenario_required(client, model) -> None:
    """Upstream's flaky-model branch (Llama-3.2's): at least one call, of the travel tools."""
    response = client.chat.completions.create(model=model, messages=TRAVEL_MESSAGES, max_tokens=FORCED_TOKENS, temperature=0.2,
                                              tools=TRAVEL_TOOLS, tool_choice="required", parallel_tool_calls=False)
    calls = response.choices[0].message.tool_calls
    assert calls
    check_well_formed(calls, TRAVEL_TOOLS)


@pytest.mark.skip(reason="depends on model quality: the Qwen2.5 class wants exactly the two travel tools called")
def test_multi_tool_scenario_required_strict(client, model) -> None:
    response = client.chat.completions.create(model=model, messages=TRAVEL_MESSAGES, max_tokens=400, temperature=0.2,
                                              tools=TRAVEL_TOOLS, tool_choice="required")
    calls = response.choices[0].message.tool_calls
    assert {c.function.name for c in calls} == {"get_weather", "get_tourist_attractions"} and len(calls) == 2


def test_error_handling_invalid_tool_choice(client, model) -> None:
    """Upstream accepts either outcome: a fallback, or an error naming the function. SGLang 0.5.23
    answers 400 "Tool 'nonexistent_function' not found in tools list."."""
    choice = {"type": "function", "function": {"name": "nonexistent_function"}}
    try:
        response = client.chat.completions.create(model=model, messages=TOOL_CHOICE_MESSAGES, max_tokens=16,
                                                  tools=TOOL_CHOICE_TOOLS, tool_choice=choice)
    except openai.BadRequestError as exc:
        assert "nonexistent_function" in str(exc)
    else:
        assert response.choices[0].message is not None


# ---------------------------------------------------------------- test_parallel_tool_calls.py

WEATHER_STRICT = {"type": "function", "function": {
    "name": "get_current_weather", "description": "Retrieve the current weather for a given city and state.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. 'San Francisco'.", "maxLength": 20},
        "state": {"type": "string", "description": "Two-letter state abbreviation, e.g. 'CA'.", "maxLength": 2},
        "unit": {"type": "string", "description": "Temperature unit.", "enum": ["CELSIUS", "FAHRENHEIT"]},
    }, "required": ["city", "state", "unit"], "additionalProperties": False},
    "strict": True,
}}
NAME_STRICT = {"type": "function", "function": {
    "name": "select_name", "description": "Select a name and provide its associated age.",
    "parameters": {"type": "object", "properties": {
        "name": {"type": "string", "enum": ["NAME_A", "NAME_B"]},
        "age": {"type": "integer", "description": "Age between 0 and 23.", "minimum": 0, "maximum": 23},
    }, "required": ["name", "age"], "additionalProperties": False},
    "strict": True,
}}
PARALLEL_PROMPT = [{"role": "user", "content": (
    "Please call both tools. My name is NAME_B and I am 20 years old. Tell me the weather in Boston, MA, using "
    "Celsius. Please note: you must call both tools!")}]


def test_parallel_tool_calls_required(client, model) -> None:
    """Model-independent half: parallel_tool_calls false gives exactly one call (the grammar allows
    one); with the default (true) the calls follow their strict schemas."""
    tools = [NAME_STRICT, WEATHER_STRICT]
    many = client.chat.completions.create(model=model, messages=PARALLEL_PROMPT, tool_choice="required", tools=tools,
                                          max_tokens=FORCED_TOKENS, temperature=0)
    assert many.choices[0].message.tool_calls
    check_schema(many.choices[0].message.tool_calls, tools)
    one = client.chat.completions.create(model=model, messages=PARALLEL_PROMPT, tool_choice="required", tools=tools,
                                         parallel_tool_calls=False, max_tokens=FORCED_TOKENS, temperature=0)
    assert len(one.choices[0].message.tool_calls) == 1
    check_schema(one.choices[0].message.tool_calls, tools)


@pytest.mark.skip(reason="depends on model quality: Qwen3-8B calls both tools when asked to (required: exactly 2 "
                         "calls; auto: 2 calls, then 1 with parallel_tool_calls false)")
@pytest.mark.parametrize("choice", ["required", "auto"])
def test_parallel_tool_calls_original(client, model, choice: str) -> None:
    tools = [NAME_STRICT, WEATHER_STRICT]
    response = client.chat.completions.create(model=model, messages=PARALLEL_PROMPT, tool_choice=choice, tools=tools)
    assert len(response.choices[0].message.tool_calls) == 2


# --------------------------------------------------------- test_responses_function_calling.py

RESPONSES_SYSTEM = (
    "You are a helpful assistant with tool calling capabilities. "
    "When you need to use a tool, respond with a function call. "
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. '
    "Do not use variables.\n\n"
)
RESPONSES_WEATHER = {"type": "function", "name": "get_weather", "description": "Get weather for a location",
                     "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City name"}},
                                    "required": ["location"]}}
RESPONSES_TIME = {"type": "function", "name": "get_time", "description": "Get current time for a timezone",
                  "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}
RESPONSES_CALCULATE = {"type": "function", "name": "calculate", "description": "Perform a calculation",
                       "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                      "required": ["expression"]}, "strict": True}


def respond(client, model, user: str, tools: list[dict], **extra):
    return client.responses.create(model=model, input=f"{RESPONSES_SYSTEM}\nUser: {user}", tools=tools,
                                   max_output_tokens=32, **extra)


def test_function_tool_schema_validation(client, model) -> None:
    response = respond(client, model, "Hello, how are you?", [RESPONSES_WEATHER], stream=False)
    assert response.id and response.status == "completed"


def test_function_tool_non_streaming(client, model) -> None:
    response = respond(client, model, "What's the weather in Paris?", [RESPONSES_WEATHER], stream=False)
    assert response.output is not None and response.status == "completed"


def test_function_tool_streaming(client, model) -> None:
    events = list(respond(client, model, "What's the weather in Tokyo?", [RESPONSES_WEATHER], stream=True))
    assert events
    assert events[0].type == "response.created" and events[-1].type == "response.completed"


def test_tool_choice_none(client, model) -> None:
    response = respond(client, model, "What's the weather in London?", [RESPONSES_WEATHER], tool_choice="none",
                       stream=False)
    assert not [item for item in response.output if getattr(item, "type", None) == "function_call"]


def test_multiple_function_tools(client, model) -> None:
    response = respond(client, model, "What's the weather in Berlin?", [RESPONSES_WEATHER, RESPONSES_TIME], stream=False)
    assert response.output is not None and response.status == "completed"


def test_builtin_and_function_tools_mixed(client, model) -> None:
    response = respond(client, model, "Hello!", [RESPONSES_WEATHER], stream=False)
    assert response.status == "completed"


def test_function_tool_with_strict_mode(client, model) -> None:
    response = respond(client, model, "Calculate 2+2", [RESPONSES_CALCULATE], stream=False)
    assert response.status == "completed"
