"""Structured outputs end to end: json_schema, regex, ebnf and structural_tag through real servers
on the embedded SmolLM2.

Servers (started lazily, one alive at a time: the tests below are grouped by server, in this
order, so each starts once in a full run):
  a  default (xgrammar, overlap schedule on)   b  --disable-overlap-schedule
  d  --grammar-backend llguidance              c  --tp-size 3 (9 heads / 3 KV heads)
  e  --enable-deterministic-inference          f  --grammar-backend none

What is checked: outputs parse and validate (JSON schemas with jsonschema, regexes with
re.fullmatch, EBNF by its language) greedy and seeded on both backends; grammar rows leave the
other rows of their batch unchanged; overlap on/off and TP=3/TP=1 give the same tokens; n > 1
children have their own grammar state; bad grammars are 400s naming the field while healthy
streams finish unchanged; min_new_tokens, stop strings, ignore_eos and logprobs with grammars;
deterministic mode; structural_tag with a trigger.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import re
import threading
from typing import Any, Optional

import jsonschema
import pytest
import requests

from engine_utils import generate, greedy, iter_stream, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TIMEOUT = 600  # seconds per request: the machine is shared and slow
BIASED_TOKEN = 16591  # "blue": a bias of 100 on it makes the unconstrained model repeat it

SERVER_FLAGS = {
    "a": (),
    "b": ("--disable-overlap-schedule",),
    "c": ("--tp-size", "3"),
    "d": ("--grammar-backend", "llguidance"),
    "e": ("--enable-deterministic-inference",),
    "f": ("--grammar-backend", "none"),
}

# ---------------------------------------------------------------------------------- grammars

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 16},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "address", "tags"],
    "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                },
                "required": ["sku", "qty"],
                "additionalProperties": False,
            },
            "minItems": 1,
            "maxItems": 2,
        },
        "status": {"enum": ["open", "closed"]},
        "total": {"type": "number", "minimum": 0, "maximum": 1000},
    },
    "required": ["items", "status", "total"],
    "additionalProperties": False,
}
VERDICT = {
    "type": "object",
    "properties": {
        "answer": {"type": "boolean"},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
        "reason": {"type": "string", "maxLength": 24},
    },
    "required": ["answer", "confidence", "reason"],
    "additionalProperties": False,
}
TOY = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue", "yellow", "black", "white"]},
        "count": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["colour", "count"],
    "additionalProperties": False,
}
OPEN_OBJECT = {"type": "object"}

DATE = r"\d{4}-\d{2}-\d{2}"
EMAIL = r"[a-z]{1,10}@[a-z]{1,10}\.(com|org|net)"
YES_NO_MAYBE = r"(yes|no|maybe)"
MAY_GO_ON = r"(yes|no)[a-z ]*"  # may end after "yes"/"no", or go on
EBNF_AB = 'root ::= "a" | "b"'
EBNF_ANIMALS = 'root ::= animal " " verb\nanimal ::= "cat" | "dog" | "bird"\nverb ::= "runs" | "sleeps" | "sings"'
ANIMALS_LANGUAGE = r"(cat|dog|bird) (runs|sleeps|sings)"

PERSON_PROMPT = "Give me a JSON record of a person:\n"
JSON_CASES = {
    "person": (PERSON_PROMPT, PERSON),
    "order": ("Write a shop order as JSON:\n", ORDER),
    "verdict": ("Is water wet? Reply in JSON:\n", VERDICT),
}
# regex name -> (prompt, pattern)
REGEX_CASES = {
    "date": ("Today's date is ", DATE),
    "email": ("My email address is ", EMAIL),
    "ynm": ("Is the sky blue? Answer: ", YES_NO_MAYBE),
}
# ebnf name -> (prompt, grammar, Python regex of its language)
EBNF_CASES = {
    "ab": ("Pick a or b: ", EBNF_AB, r"a|b"),
    "animals": ("Describe an animal in two words: ", EBNF_ANIMALS, ANIMALS_LANGUAGE),
}


def greedy_or_seeded(mode: str, seed: int, max_new_tokens: int) -> dict:
    if mode == "greedy":
        return greedy(max_new_tokens)
    return {"temperature": 1.0, "sampling_seed": seed, "max_new_tokens": max_new_tokens}


def _grammar_set() -> dict[str, dict]:
    """The grammar requests several servers answer (name -> /generate payload): every JSON schema,
    regex and EBNF case, greedy and seeded."""
    payloads = {}
    for i, mode in enumerate(("greedy", "seeded")):
        for j, (name, (prompt, schema)) in enumerate(JSON_CASES.items()):
            params = {**greedy_or_seeded(mode, 100 + j, 200), "json_schema": json.dumps(schema)}
            payloads[f"json-{name}-{mode}"] = {"text": prompt, "sampling_params": params}
        for j, (name, (prompt, pattern)) in enumerate(REGEX_CASES.items()):
            params = {**greedy_or_seeded(mode, 200 + j, 40), "regex": pattern}
            payloads[f"regex-{name}-{mode}"] = {"text": prompt, "sampling_params": params}
        for j, (name, (prompt, grammar, _)) in enumerate(EBNF_CASES.items()):
            params = {**greedy_or_seeded(mode, 300 + j, 20), "ebnf": grammar}
            payloads[f"ebnf-{name}-{mode}"] = {"text": prompt, "sampling_params": params}
        params = {**greedy_or_seeded(mode, 400, 120), "json_schema": json.dumps(OPEN_OBJECT)}
        payloads[f"json-open-{mode}"] = {"text": PERSON_PROMPT, "sampling_params": params}
    return payloads


GRAMMAR_SET = _grammar_set()
# The TP=3 server is the slowest (three ranks on two cores): a subset with short outputs.
TP_SUBSET = [
    f"{kind}-{mode}" for kind in ("json-verdict", "regex-date", "regex-ynm", "ebnf-animals") for mode in ("greedy", "seeded")
]


# ---------------------------------------------------------------------------------- helpers


class _ServerPool:
    """At most one server alive: asking for another stops the current one. A module-scoped
    fixture holds the pool; the per-server fixtures below are thin views on it."""

    def __init__(self, model_path: str) -> None:
        self.model_path = model_path
        self.name: Optional[str] = None
        self._context = None
        self.server = None

    def get(self, name: str):
        if self.name != name:
            self.close()
            context = running_server("--model-path", self.model_path, *SERVER_FLAGS[name])
            self.server = context.__enter__()
            self._context, self.name = context, name
        return self.server

    def close(self) -> None:
        if self._context is not None:
            context, self._context, self.name, self.server = self._context, None, None, None
            context.__exit__(None, None, None)


@pytest.fixture(scope="module")
def pool(gguf_path: str):
    servers = _ServerPool(gguf_path)
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture
def server_a(pool):
    return pool.get("a")


@pytest.fixture
def server_b(pool):
    return pool.get("b")


@pytest.fixture
def server_c(pool):
    return pool.get("c")


@pytest.fixture
def server_d(pool):
    return pool.get("d")


@pytest.fixture
def server_e(pool):
    return pool.get("e")


@pytest.fixture
def server_f(pool):
    return pool.get("f")


def post_ok(server, payload: dict) -> Any:
    response = requests.post(server.url + "/generate", json=payload, timeout=TIMEOUT)
    assert response.status_code == 200, (payload, response.text)
    return response.json()


def run_concurrently(server, payloads: dict[str, dict]) -> dict[str, Any]:
    """All payloads at once (threads), so that they share scheduler steps; name -> response."""
    with concurrent.futures.ThreadPoolExecutor(len(payloads)) as pool:
        futures = {name: pool.submit(post_ok, server, payload) for name, payload in payloads.items()}
        return {name: future.result() for name, future in futures.items()}


def run_one_at_a_time(server, payloads: dict[str, dict]) -> dict[str, Any]:
    return {name: post_ok(server, payload) for name, payload in payloads.items()}


def finish_type(result: dict) -> str:
    return result["meta_info"]["finish_reason"]["type"]


def ids_of(results: dict[str, Any], names=None) -> dict[str, list[int]]:
    return {name: results[name]["output_ids"] for name in (names or results)}


def check_grammar_output(name: str, payload: dict, result: dict) -> None:
    """The output of a GRAMMAR_SET request is in its grammar's language and ended by it."""
    params, text = payload["sampling_params"], result["text"]
    assert finish_type(result) == "stop", (name, result["meta_info"], text)
    if "json_schema" in params:
        value = json.loads(text)
        jsonschema.validate(value, json.loads(params["json_schema"]))
        if name.startswith("json-open"):
            assert isinstance(value, dict), (name, text)
    elif "regex" in params:
        assert re.fullmatch(params["regex"], text), (name, text)
    else:
        language = next(lang for _, grammar, lang in EBNF_CASES.values() if grammar == params["ebnf"])
        assert re.fullmatch(language, text), (name, text)


def check_grammar_set(results: dict[str, Any], names) -> None:
    failures = []
    for name in names:
        try:
            check_grammar_output(name, GRAMMAR_SET[name], results[name])
        except (AssertionError, ValueError, jsonschema.ValidationError) as err:
            failures.append(f"{name}: {type(err).__name__}: {err!s:.300} (text {results[name]['text']!r})")
    assert not failures, "\n".join(failures)


def assert_same_ids(got: dict[str, list[int]], want: dict[str, list[int]], what: str) -> None:
    differ = {name: (got[name], want[name]) for name in want if got[name] != want[name]}
    assert not differ, f"{what}: {len(differ)} of {len(want)} differ: {differ}"


def stream_ids(server, payload: dict, started: threading.Event) -> list[int]:
    """Stream one request to the end; `started` is set at its first chunk (or when it fails)."""
    try:
        last = None
        for last in iter_stream(server, payload, TIMEOUT):
            started.set()
        assert last is not None, "the stream sent no chunk"
        return last["output_ids"]
    finally:
        started.set()


def error_of(response: requests.Response) -> tuple[int, str]:
    """(status, message) of a refused request. A streamed one (SGLang's convention) is a 200
    whose first event is {"error": {"code": 400, "message": ...}}."""
    if response.status_code == 200 and response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                error = json.loads(line[len("data: ") :]).get("error")
                return (error["code"], error["message"]) if error else (200, line)
    if response.status_code != 200:
        return response.status_code, response.json()["error"]["message"]
    return response.status_code, response.text


def bad_requests_while_streaming(server, healthy: dict[str, dict], bad: list[tuple[dict, list[str]]]) -> None:
    """The healthy requests streamed together, and once each has its first chunk every bad
    sampling_params is sent: each must be a 400 whose message names all of its words, and each
    stream must end with its solo output_ids."""
    expected = ids_of(run_one_at_a_time(server, healthy))
    started = {name: threading.Event() for name in healthy}
    with concurrent.futures.ThreadPoolExecutor(len(healthy)) as pool:
        futures = {name: pool.submit(stream_ids, server, payload, started[name]) for name, payload in healthy.items()}
        for name, event in started.items():
            assert event.wait(TIMEOUT), f"stream {name} never started"
        problems = []
        for params, words in bad:
            for stream in (False, True):
                body = {"text": "Hello", "sampling_params": {"max_new_tokens": 4, **params}, "stream": stream}
                status, message = error_of(requests.post(server.url + "/generate", json=body, timeout=TIMEOUT))
                if status != 400:
                    problems.append(f"{params} stream={stream}: status {status}: {message[:300]}")
                    continue
                missing = [word for word in words if word not in message]
                if missing:
                    problems.append(f"{params} stream={stream}: message lacks {missing}: {message}")
        streamed = {name: future.result() for name, future in futures.items()}
    assert not problems, "\n".join(problems)
    assert_same_ids(streamed, expected, "healthy streams next to bad requests vs solo")
    assert generate(server, "still alive?", sampling_params=greedy(2)).status_code == 200


class GrammarOracle:
    """The token ids a backend's grammar allows after a prefix, built in the test process on the
    engine's tokenizer with the engine's stop ids as the grammar's ends (for the min_new_tokens rule)."""

    def __init__(self, model_path: str) -> None:
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.utils.hf_transformers_utils import get_tokenizer

        config, self.tokenizer = ModelConfig.from_path(model_path), get_tokenizer(model_path)
        self.vocab_size = config.vocab_size
        self.stop_ids = set(config.eos_token_ids) | {self.tokenizer.eos_token_id}

    def allowed(self, backend: str, json_schema: str, prefix: list[int]) -> set[int]:
        if backend == "xgrammar":
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(
                self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=sorted(self.stop_ids)
            )
            matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_json_schema(json_schema))
            for token in prefix:
                assert matcher.accept_token(token), (prefix, token)
            bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)
            matcher.fill_next_token_bitmask(bitmask)
            return set(xgr.testing.bitmask_to_bool_mask(bitmask, self.vocab_size)[0].nonzero().flatten().tolist())
        import llguidance
        import llguidance.hf
        import llguidance.torch

        ll_tokenizer = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size, eos_token=sorted(self.stop_ids))
        matcher = llguidance.LLMatcher(ll_tokenizer, llguidance.LLMatcher.grammar_from_json_schema(json_schema))
        for token in prefix:
            assert matcher.consume_token(token), (prefix, token)
        bitmask = llguidance.torch.allocate_token_bitmask(1, self.vocab_size)
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
        words = bitmask[0].tolist()
        return {t for t in range(self.vocab_size) if (words[t // 32] >> (t % 32)) & 1}


@pytest.fixture(scope="module")
def oracle(gguf_path: str) -> GrammarOracle:
    return GrammarOracle(gguf_path)


def check_n3_children(server) -> None:
    """n=3, seeded: each child valid under its own grammar state, not all equal, and the same three again."""
    payload = {
        "text": "Describe a toy as JSON:\n",
        "sampling_params": {"temperature": 1.0, "sampling_seed": 4242, "n": 3, "max_new_tokens": 40,
                            "json_schema": json.dumps(TOY)},
    }
    first = post_ok(server, payload)
    assert isinstance(first, list) and len(first) == 3
    for child in first:
        assert finish_type(child) == "stop", child
        jsonschema.validate(json.loads(child["text"]), TOY)
    outputs = [child["output_ids"] for child in first]
    assert len({tuple(ids) for ids in outputs}) > 1, [child["text"] for child in first]
    again = post_ok(server, payload)
    assert [child["output_ids"] for child in again] == outputs


def check_min_new_tokens_stop_ignore_eos_logprobs(server, backend: str, open_greedy_text: str, oracle: GrammarOracle) -> None:
    """open_greedy_text: this server's output of GRAMMAR_SET["json-open-greedy"] (the same request without the stop string)."""
    open_schema = json.dumps(OPEN_OBJECT)
    payloads = {
        # The grammar allows only ending after "yes"/"no": it wins over min_new_tokens.
        "min-new-yes-no": {"text": "Is the sky blue? Answer: ",
                           "sampling_params": greedy(30, regex="(yes|no)", min_new_tokens=10)},
        # After "yes"/"no" this grammar may end or go on: greedy ends at once (the premise, checked
        # below), and with min_new_tokens the stop token is held back until min_new_tokens.
        "may-go-on": {"text": "Is the sky blue? Answer: ", "sampling_params": greedy(12, regex=MAY_GO_ON)},
        "min-new-may-go-on": {"text": "Is the sky blue? Answer: ",
                              "sampling_params": greedy(12, regex=MAY_GO_ON, min_new_tokens=6)},
        "min-new-open-json": {"text": PERSON_PROMPT, "sampling_params": greedy(120, json_schema=open_schema, min_new_tokens=60)},
        "stop-string": {"text": PERSON_PROMPT, "sampling_params": greedy(120, json_schema=open_schema, stop=["age"])},
        "bias-on-masked-token": {"text": "Is the sky blue? Answer: ",
                                 "sampling_params": greedy(12, regex="(yes|no)", logit_bias={str(BIASED_TOKEN): 100.0})},
        "ignore-eos": {"text": "Is the sky blue? Answer: ", "sampling_params": greedy(30, regex=YES_NO_MAYBE, ignore_eos=True)},
        "logprobs": {"text": "Today's date is ", "sampling_params": greedy(30, regex=DATE), "return_logprob": True},
    }
    out = run_concurrently(server, payloads)

    yes_no = out["min-new-yes-no"]
    assert finish_type(yes_no) == "stop" and yes_no["text"] in ("yes", "no"), yes_no
    assert len(yes_no["output_ids"]) < 10, yes_no

    free, held = out["may-go-on"], out["min-new-may-go-on"]
    assert finish_type(free) == "stop" and len(free["output_ids"]) < 6, free
    assert re.fullmatch(MAY_GO_ON, held["text"]), held
    assert len(held["output_ids"]) >= 6, held

    # A bias on a token the grammar forbids does not re-enable it (unconstrained, this bias
    # makes the model repeat that token).
    biased = out["bias-on-masked-token"]
    assert finish_type(biased) == "stop" and biased["text"] in ("yes", "no"), biased
    assert BIASED_TOKEN not in biased["output_ids"]

    # The documented rule: min_new_tokens holds the stop token back while the grammar allows
    # anything else, so the output reaches min_new_tokens or stops where only stopping was allowed.
    open_json = out["min-new-open-json"]
    assert finish_type(open_json) == "stop", open_json
    assert isinstance(json.loads(open_json["text"]), dict)
    ids = open_json["output_ids"]
    if len(ids) < 60:
        assert ids[-1] in oracle.stop_ids, ids
        allowed = oracle.allowed(backend, open_schema, ids[:-1])
        assert allowed and allowed <= oracle.stop_ids, f"stopped at {len(ids)} < min_new_tokens while the grammar allowed {sorted(allowed)[:20]}"

    stopped = out["stop-string"]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": "age"}, stopped
    assert "age" not in stopped["text"]
    assert open_greedy_text.startswith(stopped["text"]), (stopped["text"], open_greedy_text)

    ignore_eos = out["ignore-eos"]
    assert finish_type(ignore_eos) == "stop" and ignore_eos["text"] in ("yes", "no", "maybe"), ignore_eos
    assert len(ignore_eos["output_ids"]) <= 3, ignore_eos

    logprobs = out["logprobs"]
    assert re.fullmatch(DATE, logprobs["text"]), logprobs
    entries = logprobs["meta_info"]["output_token_logprobs"]
    assert [entry[1] for entry in entries] == logprobs["output_ids"]
    assert all(math.isfinite(entry[0]) and entry[0] <= 1e-6 for entry in entries), entries


# ============================================================ server a: xgrammar, overlap on


@pytest.fixture(scope="module")
def a_outputs(pool) -> dict[str, Any]:
    """GRAMMAR_SET on the default server, all at once: checked here, and the reference of the
    overlap-off and TP=3 servers."""
    return run_concurrently(pool.get("a"), GRAMMAR_SET)


def test_json_schemas_validate_xgrammar(a_outputs):
    """Nested objects, arrays (items, minItems, maxItems), enums, required fields, bounded
    integers and numbers, strings with pattern and maxLength: greedy and seeded at temperature 1."""
    check_grammar_set(a_outputs, [name for name in GRAMMAR_SET if name.startswith("json-")])


def test_regex_ebnf_and_open_object_xgrammar(a_outputs):
    check_grammar_set(a_outputs, [name for name in GRAMMAR_SET if not name.startswith("json-") or "open" in name])
    assert a_outputs["ebnf-ab-greedy"]["text"] in ("a", "b")


def test_grammar_rows_leave_the_other_rows_of_their_batch_unchanged(server_a):
    """Unconstrained greedy, penalised, logit_bias and seeded rows sharing steps with grammar
    rows give the tokens of their solo runs."""
    plain = {
        "greedy": ("The capital of France is", greedy(24, ignore_eos=True)),
        "penalised": (
            "List some fruits:",
            greedy(24, ignore_eos=True, frequency_penalty=0.6, presence_penalty=0.4, repetition_penalty=1.3),
        ),
        "logit-bias": ("My favourite colour is", greedy(24, ignore_eos=True, logit_bias={str(BIASED_TOKEN): 6.0})),
        "seeded": ("Once upon a time", {"temperature": 1.0, "sampling_seed": 1234, "max_new_tokens": 24, "ignore_eos": True}),
        "seeded-penalised": (
            "Write about the sea.",
            {"temperature": 1.0, "sampling_seed": 99, "top_p": 0.9, "frequency_penalty": 0.5, "max_new_tokens": 24,
             "ignore_eos": True},
        ),
    }
    plain = {name: {"text": text, "sampling_params": params} for name, (text, params) in plain.items()}
    grammar_names = ["json-verdict-greedy", "json-verdict-seeded", "regex-date-seeded", "ebnf-animals-greedy", "json-open-seeded"]
    batch = run_concurrently(server_a, {**plain, **{name: GRAMMAR_SET[name] for name in grammar_names}})
    check_grammar_set(batch, grammar_names)
    solo = run_one_at_a_time(server_a, plain)
    assert all(len(result["output_ids"]) == 24 for result in solo.values())
    assert_same_ids(ids_of(batch, plain), ids_of(solo), "unconstrained rows next to grammar rows vs solo")


def test_n3_children_have_their_own_grammar_state_xgrammar(server_a):
    check_n3_children(server_a)


def test_min_new_tokens_stop_strings_ignore_eos_and_logprobs_xgrammar(server_a, a_outputs, oracle):
    check_min_new_tokens_stop_ignore_eos_logprobs(server_a, "xgrammar", a_outputs["json-open-greedy"]["text"], oracle)


def test_bad_grammars_fail_alone_while_streams_run(server_a):
    healthy = {}
    for i in range(8):
        params = greedy(12, ignore_eos=True)
        if i % 2:
            params["regex"] = r"([a-z]+ ){2,5}[a-z]+\."
        healthy[f"stream-{i}"] = {"text": f"Write a short sentence about the number {i}.", "sampling_params": params}
    bad_structural_tag = json.dumps({"structures": [{"begin": "<a>"}], "triggers": ["<a"]})
    bad = [
        ({"json_schema": '{"type": "object", "properties": {'}, ["json_schema", "not valid JSON"]),
        ({"regex": "(a+"}, ["regex"]),
        ({"regex": "[z-a]"}, ["regex"]),
        ({"ebnf": "root ::= "}, ["ebnf"]),
        ({"ebnf": 'root ::= undefined_rule "x"'}, ["ebnf"]),
        ({"json_schema": json.dumps({"type": "array", "items": {"type": "integer"}, "uniqueItems": True})},
         ["json_schema", "uniqueItems"]),
        ({"json_schema": json.dumps({"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}}})},
         ["json_schema", "format"]),
        ({"regex": "a+", "json_schema": json.dumps(OPEN_OBJECT)}, ["regex", "json_schema"]),
        ({"ebnf": EBNF_AB, "structural_tag": bad_structural_tag}, ["ebnf", "structural_tag"]),
        ({"structural_tag": bad_structural_tag}, ["structural_tag"]),
        ({"structural_tag": "not json"}, ["structural_tag"]),
    ]
    bad_requests_while_streaming(server_a, healthy, bad)


STRUCTURAL_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 15}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
STRUCTURAL_TAG = {
    "type": "structural_tag",
    "structures": [{"begin": "<function=get_weather>", "schema": STRUCTURAL_SCHEMA, "end": "</function>"}],
    "triggers": ["<function="],
}
STRUCTURAL_PROMPT = (
    'User: What is the weather in London?\nAssistant: <function=get_weather>{"city": "London", "unit": "celsius"}</function>\n'
    "User: What is the weather in Paris?\nAssistant:"
)


def check_structural_tag(server) -> None:
    payloads = {
        mode: {"text": STRUCTURAL_PROMPT,
               "sampling_params": {**greedy_or_seeded(mode, 3, 40), "structural_tag": json.dumps(STRUCTURAL_TAG)}}
        for mode in ("greedy", "seeded")
    }
    out = run_concurrently(server, payloads)
    begin, end = "<function=get_weather>", "</function>"
    triggered = 0
    for mode, result in out.items():
        text = result["text"]
        at = text.find(begin)
        if at < 0:
            continue
        triggered += 1
        rest = text[at + len(begin) :]
        if end not in rest:
            assert finish_type(result) == "length", (mode, text)
            continue
        jsonschema.validate(json.loads(rest[: rest.index(end)]), STRUCTURAL_SCHEMA)
    assert triggered, {mode: result["text"] for mode, result in out.items()}  # the few-shot prompt triggers greedy


def test_structural_tag_xgrammar(server_a):
    check_structural_tag(server_a)


@pytest.mark.parametrize("field, grammar", [("regex", "[^\\s\\S]"), ("ebnf", 'root ::= root "a"')])
def test_grammar_that_matches_nothing_fails_that_request_with_a_400(server_a, field, grammar):
    """It parses, so it passes the up-front check; its first mask allows no token at all."""
    result = post_ok(server_a, {"text": "Hello: ", "sampling_params": {"max_new_tokens": 8, field: grammar}})
    reason = result["meta_info"]["finish_reason"]
    assert (reason["type"], reason["status_code"]) == ("abort", 400), reason
    assert reason["message"].startswith(f"{field} allows no token after 0 output tokens"), reason
    assert post_ok(server_a, {"text": "Hello: ", "sampling_params": {"max_new_tokens": 4, "regex": "(yes|no)"}})["text"] in ("yes", "no")


# ============================================================ server d: llguidance


@pytest.fixture(scope="module")
def d_outputs(pool) -> dict[str, Any]:
    return run_concurrently(pool.get("d"), GRAMMAR_SET)


def test_json_schemas_regex_and_ebnf_validate_llguidance(d_outputs):
    check_grammar_set(d_outputs, GRAMMAR_SET)


def test_n3_children_have_their_own_grammar_state_llguidance(server_d):
    check_n3_children(server_d)


def test_min_new_tokens_stop_strings_ignore_eos_and_logprobs_llguidance(server_d, d_outputs, oracle):
    check_min_new_tokens_stop_ignore_eos_logprobs(server_d, "llguidance", d_outputs["json-open-greedy"]["text"], oracle)


def test_structural_tag_llguidance(server_d):
    check_structural_tag(server_d)


# ============================================================ server b: overlap schedule off


def test_overlap_off_gives_the_overlap_on_tokens(server_b, a_outputs):
    out = run_concurrently(server_b, GRAMMAR_SET)
    assert_same_ids(ids_of(out), ids_of(a_outputs), "overlap off vs on")


# ============================================================ server c: TP=3


def test_tp3_gives_the_tp1_tokens(server_c, a_outputs):
    out = run_concurrently(server_c, {name: GRAMMAR_SET[name] for name in TP_SUBSET})
    check_grammar_set(out, TP_SUBSET)
    assert_same_ids(ids_of(out), ids_of(a_outputs, TP_SUBSET), "TP=3 vs TP=1")


# ============================================================ server e: deterministic inference


def test_deterministic_grammar_rows_alone_and_in_a_batch_of_8(server_e):
    names = ["json-verdict-greedy", "json-verdict-seeded", "regex-date-seeded", "ebnf-animals-greedy"]
    targets = {name: {**GRAMMAR_SET[name], "return_logprob": True} for name in names}
    others = {
        "hi": {"text": "Hi", "sampling_params": greedy(20, ignore_eos=True)},
        "person": GRAMMAR_SET["json-person-seeded"],
        "sky": {"text": "Explain why the sky is blue.",
                "sampling_params": {"temperature": 1.0, "sampling_seed": 5, "max_new_tokens": 20}},
        "ynm": GRAMMAR_SET["regex-ynm-seeded"],
    }
    alone = run_one_at_a_time(server_e, targets)
    batch = run_concurrently(server_e, {**targets, **others})
    check_grammar_set(batch, names)
    assert_same_ids(ids_of(batch, names), ids_of(alone), "deterministic: in a batch of 8 vs alone")
    for name in names:
        assert batch[name]["meta_info"]["output_token_logprobs"] == alone[name]["meta_info"]["output_token_logprobs"], name


# ============================================================ server f: --grammar-backend none


def test_grammar_backend_none_refuses_grammars_while_streams_run(server_f):
    healthy = {
        f"stream-{i}": {"text": f"Write a short sentence about the number {i}.", "sampling_params": greedy(12, ignore_eos=True)}
        for i in range(8)
    }
    bad = [
        ({"json_schema": json.dumps(OPEN_OBJECT)}, ["json_schema", "grammar-backend none"]),
        ({"regex": DATE}, ["regex", "grammar-backend none"]),
        ({"ebnf": EBNF_AB}, ["ebnf", "grammar-backend none"]),
        ({"structural_tag": json.dumps(STRUCTURAL_TAG)}, ["structural_tag", "grammar-backend none"]),
    ]
    bad_requests_while_streaming(server_f, healthy, bad)
