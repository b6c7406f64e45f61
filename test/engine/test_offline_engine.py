"""sglang.Engine: the server's processes without HTTP, answering what /generate answers
(embedded SmolLM2 on CPU; TP=2 on a tiny random Qwen3 against TP=1)."""

from __future__ import annotations

import asyncio

import pytest

import sglang as sgl
from test_model_runner import _save_tiny

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

GREEDY = {"temperature": 0.0, "max_new_tokens": 6}


@pytest.fixture(scope="module")
def engine(gguf_path: str):
    with sgl.Engine(model_path=gguf_path, max_running_requests=8, log_level="warning") as llm:
        yield llm


def test_generate_single_and_batch(engine) -> None:
    one = engine.generate("The capital of France is", GREEDY)
    assert set(one) == {"text", "output_ids", "meta_info"}
    assert len(one["output_ids"]) == 6 and one["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    batch = engine.generate(["The capital of France is", "Hello"], GREEDY)
    assert isinstance(batch, list) and batch[0]["output_ids"] == one["output_ids"]
    assert batch[1]["output_ids"] == engine.generate("Hello", GREEDY)["output_ids"]
    ids = engine.generate(input_ids=[1, 2, 3], sampling_params=GREEDY, return_logprob=True, top_logprobs_num=2)
    assert len(ids["meta_info"]["output_token_logprobs"]) == 6
    assert len(ids["meta_info"]["output_top_logprobs"][0]) == 2


def test_n_children_and_seeded_sampling(engine) -> None:
    params = {"temperature": 1.0, "max_new_tokens": 5, "sampling_seed": 11}
    assert engine.generate("Hi", params)["output_ids"] == engine.generate("Hi", params)["output_ids"]
    children = engine.generate("Hi", {**params, "n": 3})
    assert isinstance(children, list) and len(children) == 3


def test_stream_ends_with_the_non_streamed_result(engine) -> None:
    chunks = list(engine.generate("Hello", GREEDY, stream=True))  # how many: up to the reader's pace
    assert chunks[-1]["output_ids"] == engine.generate("Hello", GREEDY)["output_ids"]
    assert all(len(a["output_ids"]) <= len(b["output_ids"]) for a, b in zip(chunks, chunks[1:]))


def test_async_generate(engine) -> None:
    async def run():
        result = await engine.async_generate("Hello", GREEDY)
        chunks = [c async for c in await engine.async_generate("Hello", GREEDY, stream=True)]
        return result, chunks

    result, chunks = asyncio.run(run())
    assert result["output_ids"] == chunks[-1]["output_ids"] == engine.generate("Hello", GREEDY)["output_ids"]


def test_bad_request_raises_what_generate_answers_400_with(engine) -> None:
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate("Hi", {"max_new_tokens": -1})
    with pytest.raises(ValueError, match="Exactly one of text or input_ids"):
        engine.generate()
    assert engine.generate("Hi", GREEDY)["meta_info"]["completion_tokens"] == 6  # the engine carries on


def test_server_info(engine) -> None:
    info = engine.get_server_info()
    assert info["max_total_num_tokens"] == info["scheduler_info"]["max_total_num_tokens"] > 0
    assert info["max_running_requests"] == 8 and info["tp_size"] == 1
    assert engine.flush_cache()  # idle: nothing running


def test_unknown_engine_argument_names_the_closest() -> None:
    with pytest.raises(TypeError, match="'tp_sise'; did you mean 'tp_size'"):
        sgl.Engine(tp_sise=2)


def test_several_tokenizer_workers_are_an_http_option() -> None:
    with pytest.raises(ValueError, match="tokenizer_worker_num=2"):
        sgl.Engine(tokenizer_worker_num=2)


def test_tp2_engine_matches_tp1(tmp_path, gguf_path: str) -> None:
    _save_tiny("qwen3_head_dim_32_sharded", str(tmp_path))
    prompts = [[1, 2, 3, 4], [5, 6, 7], [9] * 12]
    outputs = {}
    for tp in (1, 2):
        with sgl.Engine(model_path=str(tmp_path), tokenizer_path=gguf_path, tp_size=tp, log_level="warning") as llm:
            outputs[tp] = [o["output_ids"] for o in llm.generate(input_ids=prompts, sampling_params=GREEDY)]
        with pytest.raises(RuntimeError, match="shut down"):
            llm.generate("Hi", GREEDY)
    assert outputs[1] == outputs[2]


def test_stream_interval(gguf_path: str, engine) -> None:
    """--stream-interval 3: the scheduler sends the first token at once, then every 3 tokens, then
    the rest, so a chunk ends only at 1, 4, 7 or 8 tokens (a slow reader may see two sends merged
    into one cumulative chunk); same tokens."""
    params = {"temperature": 0.0, "max_new_tokens": 8}
    with sgl.Engine(model_path=gguf_path, max_running_requests=4, stream_interval=3, log_level="warning") as llm:
        chunks = list(llm.generate("Hello", params, stream=True))
    lengths = [len(c["output_ids"]) for c in chunks]
    assert set(lengths) <= {1, 4, 7, 8} and lengths[-1] == 8 and lengths == sorted(set(lengths))
    assert chunks[-1]["output_ids"] == engine.generate("Hello", params)["output_ids"]
